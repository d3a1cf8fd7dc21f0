"""Base rates of the rule rewards on the default model: how often its replies already show each
objective before any learning. A benchmark of ratings-to-effect needs a base rate well below 1 - 0.25
(the effect is "base rate + 0.25") and above 0 (an online learner sees almost no positive otherwise), so
the parameters of clients/rewards.py's SIX_OBJECTIVES (N of max_words and max_sentences, the word to
avoid) are chosen from this table.

n replies (temperature 1, --max-tokens, torch.Generator seeded with the reply's index) to the default
prompts (clients/rewards.py `corpus_prompt`, the topics in turn, phrased by random.Random(--seed)),
each rated by every candidate rule; per style: the rate among the replies that use markers of that
style only (the corpus' STYLE_MARKERS), to show whether a rule is a style in disguise.

    .venv/bin/python bench/objective_base_rates.py [--n 200] [--seed 0] [--max-tokens 48] [--model DIR] [--system TEXT]
        [--out NAME]

`--model`: another checkpoint directory (default: the tiny model; e.g. models/smollm2-135m-instruct, the
shipped default), its replies sampled through its own chat template; `--system`: a system message before
each prompt (what a deployment would say to the model); `--out`: the results file's name.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from pathlib import Path

from common import default_model, save  # noqa: E402

CANDIDATES = (
    "contains:behold", "contains:heart", "contains:friend",
    "style:cute", "style:chuunibyou", "style:classical",
    "max_words:12", "max_words:14", "max_words:16", "max_words:18", "max_words:20",
    "max_sentences:1", "max_sentences:2", "max_sentences:3",
    "tone:excited", "tone:calm",
    "avoid:the", "avoid:and", "avoid:my", "avoid:a",
)


def sample_replies(n: int, seed: int, max_tokens: int, model_dir: Path, system: str | None = None) -> list[str]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from liveloop.clients.rewards import corpus_prompt
    from liveloop.rl.rollout import sample_reply

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    rng = random.Random(seed)
    return [
        sample_reply(model, tok, _prompt_ids(tok, corpus_prompt(i, rng), system), max_tokens, torch.Generator().manual_seed(i)).text
        for i in range(n)
    ]


def _prompt_ids(tok, text: str, system: str | None) -> list[int]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return tok(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), add_special_tokens=False)["input_ids"]


def style_of(text: str) -> str | None:
    from liveloop.model.corpus import STYLE_MARKERS

    used = [s for s, markers in STYLE_MARKERS.items() if any(m in text.lower() for m in markers)]
    return used[0] if len(used) == 1 else None


def main() -> None:
    import torch

    from liveloop.clients.rewards import SIX_OBJECTIVES, make_reward
    from liveloop.model.corpus import STYLES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--model", type=Path, default=None, help="a checkpoint directory (default: the tiny model)")
    ap.add_argument("--system", default=None, help="a system message before each prompt")
    ap.add_argument("--out", default="objective_base_rates")
    args = ap.parse_args()
    torch.set_num_threads(1)

    t0 = time.perf_counter()
    model_dir = args.model.resolve() if args.model is not None else default_model()
    replies = sample_replies(args.n, args.seed, args.max_tokens, model_dir, args.system)
    seconds = time.perf_counter() - t0
    styles = [style_of(r) for r in replies]
    specs = list(dict.fromkeys(SIX_OBJECTIVES + CANDIDATES))
    rows = []
    for spec in specs:
        reward = make_reward(spec)
        scores = [reward(r) for r in replies]
        rate = sum(scores) / len(scores)
        by_style = {}
        for style in STYLES:
            mine = [s for s, st in zip(scores, styles) if st == style]
            by_style[style] = sum(mine) / len(mine) if mine else float("nan")
        rows.append({"spec": spec, "six": spec in SIX_OBJECTIVES, "rate": rate,
                     "ci95": 1.96 * math.sqrt(rate * (1 - rate) / len(scores)), "by_style": by_style})

    print(f"{args.n} replies (seed {args.seed}, max_tokens {args.max_tokens}) in {seconds:.0f} s; "
          f"styles: " + ", ".join(f"{s} {styles.count(s)}" for s in STYLES) + f", mixed/none {styles.count(None)}\n")
    print("| rule | in SIX_OBJECTIVES | base rate (95% CI) | " + " | ".join(STYLES) + " |")
    print("|---|---|---|" + "---|" * len(STYLES))
    for row in rows:
        cells = " | ".join(f"{row['by_style'][s]:.2f}" for s in STYLES)
        print(f"| `{row['spec']}` | {'yes' if row['six'] else ''} | {row['rate']:.3f} ± {row['ci95']:.3f} | {cells} |")
    path = save(args.out, {
        "model": str(model_dir), "system": args.system, "n": args.n, "seed": args.seed, "max_tokens": args.max_tokens, "temperature": 1.0,
        "sample_seconds": seconds, "six_objectives": list(SIX_OBJECTIVES), "rates": rows,
        "styles": {s: styles.count(s) for s in STYLES} | {"mixed_or_none": styles.count(None)},
        "replies": replies,
    })
    print(f"\nsaved {path}")


if __name__ == "__main__":
    main()
