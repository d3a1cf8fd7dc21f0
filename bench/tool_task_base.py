"""How a tool-trained base model does on the simulated tool task before any online learning.

Builds (once) the default model with tool dialogues in its corpus (`ModelBuildConfig.tool_fraction`,
liveloop/model/tool_corpus.py) and plays `--n` episodes of the environment (liveloop.clients.tool_env)
with plain transformers, the way a client of the server would: the first user turn is rendered with the
offered tools by the model's chat template and sampled (temperature `--temperature`, torch seeded per
episode); its calls are read by the server's hermes parser (server/edge/formats/tool_parsers/); the calls run in
the environment; the assistant turn (its arguments as the text the model wrote) and the results go back
through the chat template; the final answer is sampled and rated 0/1 by the environment. A reply
without calls is the final answer. One tool round: a call in the second turn is not run (its text, less
the call, is the answer).

Reported: the fraction of first turns that call a tool (and that write `<tool_call>` at all), of calls
that are well formed (a known tool, arguments the tool accepts) and correct (the task's own call), and
the final-answer accuracy overall, after a correct call, after a wrong call and without a call.

    .venv/bin/python bench/tool_task_base.py [--n 100] [--seed 0] [--tool-fraction 0.25] [--seq-len 256]
        [--train-steps 2000] [--model models/liveloop-tiny-agent] [--rebuild]

The build takes ~9 minutes on one CPU thread (tool dialogues are ~150-220 tokens, hence seq_len 256);
the episodes ~15 seconds. Results: bench/results/tool_task_base_s{seed}.json; measured numbers and
the mixes tried: docs/results/tool_task_base.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from common import ROOT, save  # noqa: E402

EPISODE_SEED_BASE = 1_000_000  # environment seeds far from the build's corpus seed


def _generate(model, tokenizer, messages, tools, max_tokens: int, temperature: float) -> str:
    inputs = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, return_dict=True,
                                           return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=max_tokens, do_sample=True, temperature=temperature,
                         top_p=None, top_k=None)
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)


def episode(model, tokenizer, parser, task, max_tokens: int, temperature: float) -> dict:
    """One episode: first turn, its calls run, final answer, rating."""
    from liveloop.clients.tool_env import rate, run_tool

    messages = task.messages()
    first = _generate(model, tokenizer, messages, task.tools, max_tokens, temperature)
    parsed = parser.parse(first)
    calls = []
    for call in parsed.calls:
        result = run_tool(call.name, call.arguments)
        try:
            arguments = json.loads(call.arguments)
        except ValueError:
            arguments = None
        calls.append({"name": call.name, "arguments": call.arguments, "result": result,
                      "well_formed": not result.startswith("error:"),
                      "correct": call.name == task.task.call.name and arguments == task.task.call.arguments})
    final = parsed.content
    if parsed.calls:
        messages = messages + [
            {"role": "assistant", "content": parsed.content, "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in parsed.calls]},
            *({"role": "tool", "tool_call_id": c.id, "name": c.name, "content": r["result"]}
              for c, r in zip(parsed.calls, calls)),
        ]
        second = _generate(model, tokenizer, messages, task.tools, max_tokens, temperature)
        final = parser.parse(second).content
    return {"seed": task.seed, "kind": task.kind, "question": task.question, "expected": task.expected,
            "first_turn": first, "writes_tool_call": "<tool_call>" in first, "calls": calls,
            "final": final, "reward": rate(task, final)}


def summarize(episodes: list[dict]) -> dict:
    def frac(xs: list) -> float | None:
        return round(sum(xs) / len(xs), 3) if xs else None

    calls = [c for e in episodes for c in e["calls"]]
    called = [e for e in episodes if e["calls"]]
    right_call = [e for e in called if e["calls"][0]["correct"]]
    wrong_call = [e for e in called if not e["calls"][0]["correct"]]
    direct = [e for e in episodes if not e["calls"]]
    return {
        "episodes": len(episodes),
        "first_turn_calls_tool": frac([bool(e["calls"]) for e in episodes]),
        "first_turn_writes_tool_call": frac([e["writes_tool_call"] for e in episodes]),
        "calls": len(calls),
        "calls_well_formed": frac([c["well_formed"] for c in calls]),
        "calls_correct": frac([c["correct"] for c in calls]),
        "accuracy": frac([e["reward"] for e in episodes]),
        "accuracy_after_correct_call": frac([e["reward"] for e in right_call]),
        "accuracy_after_wrong_call": frac([e["reward"] for e in wrong_call]),
        "accuracy_without_call": frac([e["reward"] for e in direct]),
        "by_kind": {kind: {"episodes": len(es), "calls_tool": frac([bool(e["calls"]) for e in es]),
                           "accuracy": frac([e["reward"] for e in es])}
                    for kind in ("calculator", "lookup") for es in [[e for e in episodes if e["kind"] == kind]]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/liveloop-tiny-agent", help="built here when missing")
    parser.add_argument("--tool-fraction", type=float, default=0.25)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--train-steps", type=int, default=2000, help="1200 (the default build's) calls right half as often")
    parser.add_argument("--rebuild", action="store_true", help="build even if --model holds a model")
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--examples", type=int, default=6, help="episodes printed in full")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from liveloop.clients.tool_env import sample
    from liveloop.model.build import build_model, ensure_model
    from liveloop.model.config import ModelBuildConfig
    from liveloop.model.tool_corpus import TOOL_NAMES
    from liveloop.server.edge.formats.tool_parsers import PARSERS

    torch.set_num_threads(1)
    model_dir = Path(args.model) if Path(args.model).is_absolute() else ROOT / args.model
    cfg = ModelBuildConfig(out_dir=args.model, tool_fraction=args.tool_fraction, seq_len=args.seq_len,
                           train_steps=args.train_steps)
    start = time.monotonic()
    (build_model if args.rebuild else ensure_model)(cfg, model_dir)
    build_seconds = time.monotonic() - start
    record = json.loads((model_dir / "liveloop_build.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    hermes = PARSERS["hermes"](TOOL_NAMES)

    episodes = []
    start = time.monotonic()
    with torch.no_grad():
        for i in range(args.n):
            task = sample(EPISODE_SEED_BASE + i)
            torch.manual_seed(args.seed * 1_000_003 + i)
            episodes.append(episode(model, tokenizer, hermes, task, args.max_tokens, args.temperature))
    summary = summarize(episodes)
    result = {"args": vars(args), "build_config": record["config"], "build_seconds": record["build_seconds"],
              "tool_dialogues": record.get("tool_dialogues"), "final_loss": record["final_loss"],
              "eval_seconds": round(time.monotonic() - start, 1), "summary": summary, "episodes": episodes}
    if build_seconds < 1:
        result["note"] = "model reused (not built by this run)"
    if record["config"] != dataclasses.asdict(cfg):
        print(f"note: {model_dir} was built with another config than the flags ask (--rebuild to rebuild): "
              f"{ {k: v for k, v in record['config'].items() if dataclasses.asdict(cfg).get(k) != v} }")
    path = save(f"tool_task_base_s{args.seed}", result, model_dir=model_dir)
    for e in episodes[: args.examples]:
        print(json.dumps({k: e[k] for k in ("question", "expected", "first_turn", "calls", "final", "reward")}))
    print(json.dumps(summary, indent=2))
    print(f"build {record['build_seconds']}s, tool dialogues {record.get('tool_dialogues')}; written {path}")


if __name__ == "__main__":
    main()
