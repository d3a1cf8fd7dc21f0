"""How long the default model's replies are, and what the policy's GAE lambda is at those lengths.

The spec's length-adaptive lambda_policy = 1 - 1/(alpha L) depends on L, the reply's action tokens; on
a model whose replies are short it is far from 1 and a rating reaches a reply's first tokens only
through the critic (docs/design.md, "Lambda: the reward reaches the first token"). This samples the
base's replies the way the learning rig does (experiments/rig.py `sample_batch`: temperature 1, up to
--max-tokens, 16 at a time) to the corpus prompts, and reports the length's median and 10th/90th
percentiles with lambda_policy at alpha 0.05 (the spec's) and 1 (the shipped presets').

    .venv/bin/python bench/reply_lengths.py [--n 128] [--seed 0] [--max-tokens 48]
"""

from __future__ import annotations

import argparse
import random

from common import default_model, percentile, save  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from liveloop.clients.rewards import corpus_prompt
    from liveloop.experiments.rig import sample_batch
    from liveloop.rl.advantages import length_adaptive_lambda
    from liveloop.rl.rollout import chat_prompt_ids

    torch.set_num_threads(1)
    model_dir = default_model()
    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    rng, generator = random.Random(args.seed), torch.Generator().manual_seed(args.seed)
    lengths: list[int] = []
    while len(lengths) < args.n:
        prompts = [chat_prompt_ids(tokenizer, corpus_prompt(len(lengths) + i, rng)) for i in range(min(16, args.n - len(lengths)))]
        lengths += [len(r.response_ids) for r in sample_batch(model, tokenizer, prompts, args.max_tokens, generator)]
    points = {"p10": percentile(lengths, 10), "median": percentile(lengths, 50), "p90": percentile(lengths, 90)}
    result = {"n": len(lengths), "lengths": points,
              "lambda_policy": {f"alpha_{a}": {k: length_adaptive_lambda(int(v), a) for k, v in points.items()} for a in (0.05, 1.0)},
              "share_lambda_zero_at_alpha_0.05": sum(length_adaptive_lambda(n, 0.05) == 0.0 for n in lengths) / len(lengths)}
    print(result)
    print(f"saved {save('reply_lengths', result, model_dir)}")


if __name__ == "__main__":
    main()
