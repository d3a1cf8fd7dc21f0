"""Builds the embedded default model: corpus -> tokenizer -> Qwen3-MoE -> training -> directory on disk.

The corpus is the style examples (`corpus.py`) plus, opt-in (`ModelBuildConfig.tool_fraction`), that
fraction of tool-use dialogues (`tool_corpus.py`), which train on their assistant turns only. With no
tool dialogues the build is the style-only one, byte for byte.

`build_model` runs the steps in order and writes a Hugging Face model directory atomically (model,
tokenizer, generation config, and `liveloop_build.json` recording the config, losses and sample replies).
Everything is seeded, so the same config, package versions and CPU kernel path give the same weights,
byte for byte; another kernel path (AVX2, AVX-512, none) gives other weights of the same quality (the
build record says which one built it: docs/design.md, "A locked environment"). Serving and online
learning are not this module's business; they only read the directory.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
import warnings
from itertools import chain
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3MoeConfig, Qwen3MoeForCausalLM

from liveloop.checkpoint import checkpoint_digest, save_atomically
from liveloop.model.config import ModelBuildConfig
from liveloop.model.corpus import Example, generate_corpus
from liveloop.model.tokenizer import PAD_TOKEN, train_tokenizer
from liveloop.model.tool_corpus import ToolDialogue, dialogue_texts, generate_tool_corpus, tool_specs
from liveloop.provenance import environment

BUILD_RECORD = "liveloop_build.json"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
# Phrasings not used by the corpus's prompt templates.
SAMPLE_PROMPTS = (
    "Please write something about cats.", "Share some words about the sea.", "Talk to me about the moon.",
    "Anything to say about bread?", "Please write something about forests.", "Share some words about trains.",
)


def ensure_model(cfg: ModelBuildConfig, out_dir: Path | None = None) -> Path:
    """Return the model directory, building it first unless it already holds a complete model."""
    out = Path(out_dir if out_dir is not None else cfg.out_dir)
    if cfg.context_length:  # a long-context copy of another build (liveloop/model/long_context.py)
        from liveloop.model.long_context import ensure_extended

        return ensure_extended(cfg, out, ensure_model)
    if all((out / name).is_file() for name in REQUIRED_FILES):
        return out
    return build_model(cfg, out)


def build_model(cfg: ModelBuildConfig, out_dir: Path | None = None, progress: bool = True) -> Path:
    """Build the model described by `cfg` into `out_dir` (default `cfg.out_dir`), replacing what is there."""
    start = time.monotonic()
    out = Path(out_dir if out_dir is not None else cfg.out_dir)
    # 1. Corpus: style examples and (opt-in) tool dialogues.
    corpus, dialogues = build_corpus(cfg)
    # 2. Tokenizer.
    texts = chain((text for ex in corpus for text in (ex.prompt, ex.reply)),
                  (text for d in dialogues for text in dialogue_texts(d)))
    tokenizer = train_tokenizer(texts, cfg.vocab_size)
    # 3. Model.
    torch.manual_seed(cfg.seed)
    model = Qwen3MoeForCausalLM(_model_config(cfg, tokenizer))
    # 4. Training.
    dialogue_sequences = [_tokenize_dialogue(d, tokenizer) for d in dialogues]
    if any(len(ids) > cfg.seq_len for ids, _ in dialogue_sequences):
        warnings.warn(f"ModelBuildConfig.seq_len={cfg.seq_len} cuts tool dialogues of up to "
                      f"{max(len(ids) for ids, _ in dialogue_sequences)} tokens (their answers are lost)", stacklevel=2)
    sequences = _tokenize_corpus(corpus, tokenizer, cfg) + [(i[: cfg.seq_len], m[: cfg.seq_len])
                                                            for i, m in dialogue_sequences]
    losses = _train(model, sequences, tokenizer.pad_token_id, cfg, progress)
    # 5. Samples and save.
    model.generation_config = GenerationConfig(
        bos_token_id=model.config.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    samples = _sample_replies(model, tokenizer, cfg.seed)
    tail = losses[-max(1, len(losses) // 20):]
    record = {
        "config": dataclasses.asdict(cfg),
        "first_loss": losses[0],
        "final_loss": sum(tail) / len(tail),
        "loss_curve": losses[:: max(1, len(losses) // 20)],
        "num_parameters": sum(p.numel() for p in model.parameters()),
        **({"tool_dialogues": _dialogue_stats(dialogues, dialogue_sequences, cfg)} if dialogues else {}),
        "build_seconds": round(time.monotonic() - start, 2),
        "samples": samples,
        # what the weights depend on besides the config: kernels (CPU capability), threads, versions
        "environment": environment(),
    }
    _save(out, model, tokenizer, record)
    return out


def build_corpus(cfg: ModelBuildConfig) -> tuple[list[Example], list[ToolDialogue]]:
    """The style examples and tool dialogues of a build: `tool_fraction` of `corpus_size` (rounded) are
    dialogues, the rest examples (all of them, as before tool dialogues existed, when the fraction is 0)."""
    n_tool = round(cfg.tool_fraction * cfg.corpus_size)
    return generate_corpus(cfg.corpus_size - n_tool, cfg.seed), generate_tool_corpus(n_tool, cfg.seed)


def _model_config(cfg: ModelBuildConfig, tokenizer: PreTrainedTokenizerFast) -> Qwen3MoeConfig:
    pad_id = tokenizer.pad_token_id
    return Qwen3MoeConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.moe_intermediate_size,  # unused: every layer is MoE
        moe_intermediate_size=cfg.moe_intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        num_experts=cfg.num_experts,
        num_experts_per_tok=cfg.experts_per_token,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        use_cache=True,
        bos_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad_id,
        dtype="float32",
    )


def _tokenize_corpus(corpus: list[Example], tokenizer: PreTrainedTokenizerFast,
                     cfg: ModelBuildConfig) -> list[tuple[list[int], list[int]]]:
    """(token ids, loss mask) per example: chats learn only the reply and its <|end|>; plain text learns all."""
    rng = random.Random(cfg.seed + 1)
    eos = tokenizer.eos_token
    sequences = []
    for ex in corpus:
        reply_ids = tokenizer.encode(ex.reply + eos, add_special_tokens=False)
        if rng.random() < cfg.plain_text_fraction:
            ids, mask = reply_ids, [1] * len(reply_ids)
        else:
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": ex.prompt}], tokenize=False,
                                                   add_generation_prompt=True)
            prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
            newline_ids = tokenizer.encode("\n", add_special_tokens=False)  # the template's turn separator
            ids = prompt_ids + reply_ids + newline_ids
            mask = [0] * len(prompt_ids) + [1] * len(reply_ids) + [0] * len(newline_ids)
        sequences.append((ids[: cfg.seq_len], mask[: cfg.seq_len]))
    return sequences


def _tokenize_dialogue(dialogue: ToolDialogue, tokenizer: PreTrainedTokenizerFast) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of a tool dialogue rendered with its tools, not yet cut to seq_len: it
    learns each assistant turn (tool call or answer) and its <|end|>, not the question, the tools or
    the tool results."""
    messages, tools = list(dialogue.messages), tool_specs()
    eos, newline_ids = tokenizer.eos_token, tokenizer.encode("\n", add_special_tokens=False)
    ids: list[int] = []
    mask: list[int] = []
    rendered = ""
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = tokenizer.apply_chat_template(messages[:k], tools=tools, tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(messages[: k + 1], tools=tools, tokenize=False)
        reply = full[len(prompt):]
        assert prompt.startswith(rendered) and full.startswith(prompt) and reply.endswith(eos + "\n"), reply
        context_ids = tokenizer.encode(prompt[len(rendered):], add_special_tokens=False)
        reply_ids = tokenizer.encode(reply[:-1], add_special_tokens=False)
        ids += context_ids + reply_ids + newline_ids
        mask += [0] * len(context_ids) + [1] * len(reply_ids) + [0] * len(newline_ids)
        rendered = full
    return ids, mask


def _dialogue_stats(dialogues: list[ToolDialogue], sequences: list, cfg: ModelBuildConfig) -> dict:
    """What the build record says of the tool dialogues: how many, their moves, their lengths."""
    moves: dict[str, int] = {}
    for d in dialogues:
        moves[d.move.value] = moves.get(d.move.value, 0) + 1
    lengths = sorted(len(ids) for ids, _ in sequences)
    return {"count": len(dialogues), "moves": moves,
            "correct_fraction": round(sum(d.correct for d in dialogues) / len(dialogues), 4),
            "median_tokens": lengths[len(lengths) // 2], "max_tokens": lengths[-1],
            "truncated": sum(n > cfg.seq_len for n in lengths)}


def _batches(sequences: list, cfg: ModelBuildConfig, pad_id: int):
    """Endless seeded batches: (input_ids, attention_mask, loss_mask), right-padded to the longest row."""
    rng = random.Random(cfg.seed + 2)
    order: list[int] = []
    while True:
        if len(order) < cfg.batch_size:
            epoch = list(range(len(sequences)))
            rng.shuffle(epoch)
            order += epoch
        rows, order = [sequences[i] for i in order[: cfg.batch_size]], order[cfg.batch_size:]
        width = max(len(ids) for ids, _ in rows)
        input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        loss_mask = torch.zeros((len(rows), width), dtype=torch.float32)
        for r, (ids, mask) in enumerate(rows):
            input_ids[r, : len(ids)] = torch.tensor(ids)
            attention_mask[r, : len(ids)] = 1
            loss_mask[r, : len(ids)] = torch.tensor(mask, dtype=torch.float32)
        yield input_ids, attention_mask, loss_mask


def masked_next_token_loss(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting token t+1 from position t, over targets with loss_mask 1.

    logits: [B, T, V]; input_ids, loss_mask: [B, T] (loss_mask marks which tokens are targets).
    """
    targets, weights = input_ids[:, 1:], loss_mask[:, 1:]
    nll = F.cross_entropy(logits[:, :-1].flatten(0, 1), targets.flatten(), reduction="none")
    return (nll * weights.flatten()).sum() / weights.sum().clamp(min=1.0)


def _lr_factor(step: int, total: int) -> float:
    warmup = max(1, total // 20)
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


def _train(model: Qwen3MoeForCausalLM, sequences: list, pad_id: int, cfg: ModelBuildConfig,
           progress: bool) -> list[float]:
    """AdamW with warmup and cosine decay; returns the language-model loss of every step."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, betas=(0.9, 0.95), weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, cfg.train_steps))
    batches = _batches(sequences, cfg, pad_id)
    losses = []
    bar = tqdm(range(cfg.train_steps), desc="building liveloop model", disable=not progress)
    for _ in bar:
        input_ids, attention_mask, loss_mask = next(batches)
        out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, output_router_logits=True)
        lm_loss = masked_next_token_loss(out.logits, input_ids, loss_mask)
        loss = lm_loss + model.config.router_aux_loss_coef * out.aux_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(lm_loss.item())
        bar.set_postfix(loss=f"{lm_loss.item():.3f}")
    model.eval()
    return losses


@torch.no_grad()
def _sample_replies(model: Qwen3MoeForCausalLM, tokenizer: PreTrainedTokenizerFast, seed: int) -> list[dict]:
    """Replies to held-out prompts: the first half greedy, the second half sampled at temperature 0.8."""
    torch.manual_seed(seed)
    samples = []
    for i, prompt in enumerate(SAMPLE_PROMPTS):
        greedy = i < len(SAMPLE_PROMPTS) // 2
        inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                               return_dict=True, return_tensors="pt")
        out = model.generate(**inputs, max_new_tokens=80, do_sample=not greedy,
                             temperature=None if greedy else 0.8, top_p=None, top_k=None)
        reply = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        samples.append({"prompt": prompt, "mode": "greedy" if greedy else "temperature=0.8", "reply": reply})
    return samples


def _save(out: Path, model: Qwen3MoeForCausalLM, tokenizer: PreTrainedTokenizerFast, record: dict) -> None:
    """The build into `out` through liveloop.checkpoint.save_atomically (a sibling temporary directory,
    fsynced, renamed into place; removed on any failure), with its record and weights' digest."""
    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        stamped = record | {"model_digest": checkpoint_digest(tmp)}  # the weights' sha256: which build this is
        (tmp / BUILD_RECORD).write_text(json.dumps(stamped, indent=2, ensure_ascii=False) + "\n")

    save_atomically(out, write)
