"""What an agent CLI's session costs the server besides generation, from the requests Codex CLI 0.169.0
and Claude Code 2.1.328 really send (tests/data/agents/): per client, the prompt tokens a second turn
shares with the first turn's prompt and reply (what vLLM's prefix cache re-uses, in whole 16-token
blocks, and what links the turns exactly), with the per-request volatile lines normalised (the server's
path) against without (the baseline, side by side); and what linking a turn costs at these prompt
lengths (its link keys and its session, per turn).

The second turn is made as the CLI makes it: the first request again, its reply (a tool call) and the
tool's result appended, and for Claude Code a new billing header (`cc_version` changes on every
request). The model is the agents preset's (liveloop-tiny extended; its tokenizer and template).

    .venv/bin/python bench/agent_sessions.py [--model models/liveloop-tiny-agents] [--repeats 20]
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

from common import ROOT, median, save

from liveloop.server.edge.messages.protocol import MessagesRequest
from liveloop.server.edge.pipeline.prompting import Prompter
from liveloop.server.edge.responses.protocol import ResponsesRequest
from liveloop.server.edge.sessions import Asked, read_session
from liveloop.store.linking import LinkKeys

DATA = ROOT / "tests" / "data" / "agents"
BLOCK = 16  # vLLM's KV cache block: a prefix is re-used in whole blocks


def _shared(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _prompt(prompter: Prompter, tokenizer, messages: list[dict], setup) -> list[int]:
    tools, choice, parallel = setup
    use = prompter.tool_use(tools, choice, parallel)
    return tokenizer(prompter.render(messages, use).text, add_special_tokens=False)["input_ids"]


def _claude_turns(raw: dict, normalise: bool) -> tuple[list[dict], list[dict], MessagesRequest]:
    body = copy.deepcopy(raw)
    second = copy.deepcopy(raw)
    second["system"][0]["text"] = raw["system"][0]["text"].replace("cc_version=", "cc_version=9.9.9.")
    call = {"type": "tool_use", "id": "toolu_01", "name": "Read", "input": {"file_path": "notes.txt"}}
    second["messages"] = [*raw["messages"], {"role": "assistant", "content": [call]},
                          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "The meeting moved to Thursday."}]}]
    first_req, second_req = MessagesRequest.model_validate(body), MessagesRequest.model_validate(second)
    turns = []
    for req, source in ((first_req, body), (second_req, second)):
        messages = req.conversation()
        if not normalise:  # the billing header back where the client put it: the first line of the system turn
            header = source["system"][0]["text"]
            messages = [{**messages[0], "content": header + "\n\n" + messages[0]["content"]}, *messages[1:]]
        turns.append(messages)
    return turns[0], turns[1], first_req


def _codex_turns(raw: dict) -> tuple[list[dict], list[dict], ResponsesRequest]:
    second = copy.deepcopy(raw)
    second["input"] = [*raw["input"],
                       {"type": "function_call", "call_id": "call_01", "name": "exec_command", "arguments": json.dumps({"cmd": "cat notes.txt"})},
                       {"type": "function_call_output", "call_id": "call_01", "output": "The meeting moved to Thursday."}]
    first_req, second_req = ResponsesRequest.model_validate(raw), ResponsesRequest.model_validate(second)
    return first_req.conversation(), second_req.conversation(), first_req


def measure(prompter: Prompter, tokenizer, first: list[dict], second: list[dict], req, reply: list[int]) -> dict:
    setup = req.tool_setup()
    p1, p2 = _prompt(prompter, tokenizer, first, setup), _prompt(prompter, tokenizer, second, setup)
    shared = _shared(p1 + reply, p2)
    return {"first_prompt_tokens": len(p1), "second_prompt_tokens": len(p2), "shared_tokens": shared,
            "cache_reused_tokens": shared // BLOCK * BLOCK, "reused_share": round(shared // BLOCK * BLOCK / len(p2), 4)}


def link_cost(prompt: list[int], reply: list[int], stops: list[int], headers: dict, asked: Asked, repeats: int) -> dict:
    keys, session = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        LinkKeys.of(prompt, reply, stops)
        keys.append(time.perf_counter() - t)
        t = time.perf_counter()
        read_session(headers, asked)
        session.append(time.perf_counter() - t)
    return {"prompt_tokens": len(prompt), "link_keys_ms": round(1000 * median(keys), 3), "session_ms": round(1000 * median(session), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "liveloop-tiny-agents")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.model))
    prompter = Prompter(tokenizer, args.model, "auto", "canonical", None)
    stops = [tokenizer.eos_token_id]
    result: dict = {"model": str(args.model)}

    claude = json.loads((DATA / "claude-code-2.1.328" / "main-request.json").read_text())
    codex = json.loads((DATA / "codex-0.169.0" / "turn1-request.json").read_text())
    call = tokenizer('<tool_call>\n{"name": "Read", "arguments": {"file_path": "notes.txt"}}\n</tool_call>', add_special_tokens=False)["input_ids"]
    for name, normalise in (("normalised", True), ("as_sent", False)):
        first, second, req = _claude_turns(claude["body"], normalise)
        result[f"claude_code_{name}"] = measure(prompter, tokenizer, first, second, req, call)
    first, second, req = _codex_turns(codex["body"])
    call = tokenizer('<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "cat notes.txt"}}\n</tool_call>', add_special_tokens=False)["input_ids"]
    result["codex"] = measure(prompter, tokenizer, first, second, req, call)

    for client, raw, asked in (("claude_code", claude, Asked.of_request(MessagesRequest.model_validate(claude["body"]))),
                               ("codex", codex, Asked.of_request(ResponsesRequest.model_validate(codex["body"])))):
        req = MessagesRequest.model_validate(raw["body"]) if client == "claude_code" else ResponsesRequest.model_validate(raw["body"])
        prompt = _prompt(prompter, tokenizer, req.conversation(), req.tool_setup())
        result[f"{client}_linking"] = link_cost(prompt, call, stops, raw["headers"], asked, args.repeats)

    a, b = result["claude_code_normalised"]["cache_reused_tokens"], result["claude_code_as_sent"]["cache_reused_tokens"]
    result["claude_code_reuse_ratio"] = round(a / max(b, 1), 1)
    print(json.dumps(result, indent=1))
    save("agent_sessions", result, model_dir=args.model)


if __name__ == "__main__":
    main()
