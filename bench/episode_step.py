"""The learner's step on one agent episode against the episode's length, and what linking a turn costs.

Step: for each length L (256 ... 4096 tokens), a fresh process writes an episode of L tokens into a
SQLite store the way the server does (turns of 96 sampled tokens, each followed by 32 observation
tokens, linked by the store from their prompts), rates its last turn, and times `OnlineLearner.step()`
on it (the production step: the episode read back, the critic's values and K critic steps, GAE over
the action tokens, one policy step), the median of `--repeats`. Peak memory: the process's peak RSS
after the steps minus its RSS before the first (resource.getrusage, KiB), so the model, the store
and the interpreter are not counted. Linear growth means time / L and memory / L stay flat.

Linking: the writer's cost of linking, per response, for a batch of 64 turns each continuing a stored
turn (the (api_key_id, link_hash) lookup, the parents' tokens read and compared), against inserting the
same rows with linking skipped, side by side in one process, on a store holding `--stored` responses;
and the server's read for a chat prompt (server/edge/pipeline/splicing.py: an earlier turn's tokens found by its
text and reused) against tokenizing the prompt whole.

    .venv/bin/python bench/episode_step.py [--lengths 256 512 1024 2048 4096] [--repeats 3]

Results: bench/results/episode_step.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, default_model, save  # noqa: E402

TURN, OBS, PROMPT = 96, 32, 64
END = 3


def _episode(store, length: int, key: str = "k") -> str:
    """Turns of the store's own linking up to `length` tokens (prompt included); returns the last turn's id."""
    import numpy as np

    from liveloop.store import ResponseRecord
    from liveloop.store.linking import LinkKeys

    rng = np.random.default_rng(length)
    prompt = [int(x) for x in rng.integers(10, 900, PROMPT - 1)] + [END]
    k, last = 0, None
    while True:
        room = length - len(prompt)
        n = min(TURN, room)
        response = [int(x) for x in rng.integers(10, 900, n - 1)] + [END]
        rid = f"t{k}"
        store.feedback.write_batch([ResponseRecord(rid, key, "m", 0, "chat", tuple(prompt), tuple(response), (-2.0,) * n, "stop", 1.0, 1.0, 1.0,
                                          link=LinkKeys.of(prompt, response, (END,)))])
        last, k = rid, k + 1
        if len(prompt) + n + OBS >= length:
            return last
        prompt = prompt + response + [int(x) for x in rng.integers(10, 900, OBS - 1)] + [END]


def step_child(length: int, repeats: int, model_dir: str) -> dict:
    import torch

    from liveloop.critic.config import CriticConfig
    from liveloop.learner.config import LearnerConfig
    from liveloop.learner.online import OnlineLearner
    from liveloop.store import FeedbackRecord, Store, StoreConfig

    torch.set_num_threads(1)
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(StoreConfig(url=f"sqlite:///{tmp}/s.db"))
        store.migrate()
        store.versions.ensure_base_version(model_dir)
        last = _episode(store, length)
        store.feedback.put_feedback(FeedbackRecord(last, "k", 1))
        cfg = LearnerConfig(checkpoint_dir=f"{tmp}/v", publish_every_steps=10**9, publish_every_seconds=10**9, max_episode_tokens=0)
        learner = OnlineLearner.resume(
            cfg, CriticConfig(), Path(model_dir),
            feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
        )
        episode = store.episodes.episode(last)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for _ in range(repeats):
            learner.state.pending_cursor = 0  # the same rating again: the same work each time
            learner.method.reset()
            started = time.perf_counter()
            assert learner.step()
            times.append(time.perf_counter() - started)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        store.close()
    return {"length": length, "turns": len(episode.turns), "action_tokens": int(sum(len(t.response_ids) for t in episode.turns)),
            "step_seconds": statistics.median(times), "peak_rss_kib_over_setup": peak - before}


def linking(stored: int, batch: int = 64) -> dict:
    """Seconds per response for a batch of continuing turns, linked against not linked (same rows)."""
    from liveloop.store import ResponseRecord, Store, StoreConfig
    from liveloop.store.linking import LinkKeys
    from liveloop.store import feedback as store_module

    with tempfile.TemporaryDirectory() as tmp:
        store = Store(StoreConfig(url=f"sqlite:///{tmp}/s.db"))
        store.migrate()
        store.versions.ensure_base_version(None)
        prompts = {}
        for start in range(0, stored, 512):  # stored first turns, 30 keys
            recs = []
            for i in range(start, min(stored, start + 512)):
                prompt = (5, i % 900 + 10, i // 900 + 10, END, 7)
                response = (11, 12, i % 700 + 20, END)
                prompts[i] = (prompt, response)
                recs.append(ResponseRecord(f"p{i}", f"k{i % 30}", "m", 0, "chat", prompt, response, (-1.0,) * 4, "stop", 1.0, 1.0, 1.0,
                                           link=LinkKeys.of(prompt, response, (END,))))
            store.feedback.write_batch(recs)

        def turns(tag: str, offset: int) -> list:
            out = []
            for j in range(batch):
                i = (offset + j * 7) % stored
                prompt, response = prompts[i]
                nxt = prompt + response + (60, 61, END, 7)
                out.append(ResponseRecord(f"{tag}{offset}-{j}", f"k{i % 30}", "m", 0, "chat", nxt, (13, END), (-1.0, -1.0), "stop", 1.0, 1.0, 1.0,
                                          link=LinkKeys.of(nxt, (13, END), (END,))))
            return out

        linked, plain = [], []
        original = store_module.link_turns
        for r in range(10):  # alternate, so drift in the machine's speed hits both
            batch_linked = turns("a", r * batch)
            t = time.perf_counter()
            store.feedback.write_batch(batch_linked)
            linked.append((time.perf_counter() - t) / batch)
            store_module.link_turns = lambda conn, records, rows: None
            try:
                batch_plain = turns("b", r * batch)
                t = time.perf_counter()
                store.feedback.write_batch(batch_plain)
                plain.append((time.perf_counter() - t) / batch)
            finally:
                store_module.link_turns = original
        assert store.feedback.get_response(batch_linked[0].id).parent_id is not None
        store.close()
    return {"stored": stored, "batch": batch, "linked_seconds_per_response": statistics.median(linked),
            "unlinked_seconds_per_response": statistics.median(plain),
            "linking_seconds_per_response": statistics.median(linked) - statistics.median(plain)}


def splicing(model_dir: str, stored: int, rounds: int = 200) -> dict:
    """Seconds per chat prompt for the server's token-in-token-out read (server/edge/pipeline/splicing.py: the text
    hashes, one indexed store read, the decode check) against tokenizing the same text whole, alternated."""
    from transformers import AutoTokenizer

    from liveloop.server.edge.pipeline.splicing import Splicer
    from liveloop.store import ResponseRecord, Store, StoreConfig
    from liveloop.store.linking import LinkKeys

    tok = AutoTokenizer.from_pretrained(model_dir)
    end = tok.eos_token_id
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(StoreConfig(url=f"sqlite:///{tmp}/s.db"))
        store.migrate()
        store.versions.ensure_base_version(None)
        splicer = Splicer(tok, [end], store.episodes.carried_turn)
        texts = []
        for start in range(0, stored, 500):
            recs = []
            for i in range(start, min(stored, start + 500)):
                ask = [{"role": "user", "content": f"Tell me about the number {i}."}]
                text = tok.apply_chat_template(ask, add_generation_prompt=True, tokenize=False)
                prompt, reply = tok(text, add_special_tokens=False)["input_ids"], tok(f"It is {i}.", add_special_tokens=False)["input_ids"] + [end]
                recs.append(ResponseRecord(f"p{i}", f"k{i % 30}", "m", 0, "chat", tuple(prompt), tuple(reply), (-1.0,) * len(reply), "stop",
                                           1.0, 1.0, 1.0, link=LinkKeys.of(prompt, reply, [end], splicer.text_hash(text, reply))))
                if i % (stored // rounds or 1) == 0:
                    texts.append((f"k{i % 30}", tok.apply_chat_template(ask + [{"role": "assistant", "content": f"It is {i}."},
                                                                               {"role": "user", "content": "And then?"}], add_generation_prompt=True, tokenize=False)))
            store.feedback.write_batch(recs)
        spliced, whole = [], []
        for key, text in texts:
            t = time.perf_counter()
            ids = splicer.prompt_ids(text, key)
            spliced.append(time.perf_counter() - t)
            t = time.perf_counter()
            plain = tok(text, add_special_tokens=False)["input_ids"]
            whole.append(time.perf_counter() - t)
            assert len(ids) >= len(plain) - 8  # a real prompt came back (the reply's own tokens may differ in number)
        store.close()
    return {"stored": stored, "prompts": len(texts), "spliced_seconds_per_prompt": statistics.median(spliced),
            "tokenized_seconds_per_prompt": statistics.median(whole),
            "splice_seconds_per_prompt": statistics.median(spliced) - statistics.median(whole)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stored", type=int, default=20000)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    model_dir = str(default_model())
    if args.child:
        print(json.dumps(step_child(args.child, args.repeats, model_dir)))
        return
    steps = []
    for length in args.lengths:
        out = subprocess.run([sys.executable, __file__, "--child", str(length), "--repeats", str(args.repeats)],
                             capture_output=True, text=True, check=True, cwd=ROOT)
        steps.append(json.loads(out.stdout.strip().splitlines()[-1]))
        s = steps[-1]
        print(f"L={length:5d} turns={s['turns']:3d} step {s['step_seconds']:.3f}s ({s['step_seconds'] / length * 1e3:.3f} ms/token) "
              f"peak +{s['peak_rss_kib_over_setup'] / 1024:.0f} MiB ({s['peak_rss_kib_over_setup'] / length:.1f} KiB/token)", flush=True)
    link = linking(args.stored)
    print(json.dumps(link))
    splice = splicing(model_dir, args.stored)
    print(json.dumps(splice))
    print("token in, token out: {:.0f} us per chat prompt over tokenizing it whole".format(splice["splice_seconds_per_prompt"] * 1e6))
    print("linking: {:.0f} us per response (a batch of {} continuing turns, {} stored)".format(
        link["linking_seconds_per_response"] * 1e6, link["batch"], link["stored"]))
    save("episode_step", {"args": vars(args), "steps": steps, "linking": link, "splicing": splice})


if __name__ == "__main__":
    main()
