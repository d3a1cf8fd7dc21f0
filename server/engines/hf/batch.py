"""The hf engine's running batch: the rows (requests) that advance together in one forward per step,
their KV cache left-padded to one length, and the mask of each row's real positions.

    batch, logits = prefill(model, rows)      # a fresh batch: each row's prompt + tokens so far
    logits = decode(model, batch)             # one token for every row (each row's last token in)
    batch = merge(batch, other)               # rows joining: caches left-padded to one length
    batch = batch.select(indices)             # rows leaving: padding no row needs any more trimmed

Left padding keeps every row's newest position in the last column, so one decode step appends one
column for all rows. Each forward gets explicit `position_ids` (a row's real positions, 0..n-1,
whatever its padding) and the 2-D attention mask, so a row's logits are those of its sequence alone
(to float tolerance). Padded cache positions hold zeros: a padded query in a prefill may come out
non-finite, and a masked key multiplied by a zero weight would still spread it.

The cache is a transformers `DynamicCache` of full-attention layers (`DynamicLayer`, reached through
its `keys` / `values`); a model with sliding-window layers would need its own layer type here.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from liveloop.grammar import Walk
from liveloop.server.engines.base import GenerationRequest
from liveloop.server.engines.threaded import Emit


@dataclass(eq=False)
class Row:
    """One admitted request in the engine: its stream, its generator, and the tokens it has sampled.
    While it is in a batch, the batch's cache holds its prompt + `tokens[:-1]`; `tokens[-1]` is the
    next step's input."""

    request: GenerationRequest
    emit: Emit
    generator: torch.Generator
    cancelled: threading.Event
    adapter: str | None = None  # the loaded adapter that serves it (None: the base weights)
    tokens: list[int] = field(default_factory=list)
    walk: Walk | None = None  # its way through its grammar (a constrained request), made at its first draw

    @property
    def length(self) -> int:
        """Tokens the next forward conditions on: prompt + everything sampled."""
        return len(self.request.prompt_ids) + len(self.tokens)


@dataclass(eq=False)
class Batch:
    rows: list[Row]
    cache: Any  # transformers DynamicCache: per layer keys / values [rows, heads, width, head_dim]
    mask: torch.Tensor  # [rows, width] long: 1 where a row has a real position

    def select(self, indices: list[int]) -> Batch:
        """The batch of rows `indices` only, without leading columns none of them uses."""
        index = torch.tensor(indices, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        first = int(mask.any(0).long().argmax())  # every row has a real last column: some column is used
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, first:]
            layer.values = layer.values.index_select(0, index)[:, :, first:]
        return Batch([self.rows[i] for i in indices], self.cache, mask[:, first:])


@torch.no_grad()
def prefill(model: torch.nn.Module, rows: list[Row]) -> tuple[Batch, torch.Tensor]:
    """A new batch of `rows`: one forward over each row's prompt + tokens so far (left-padded).
    Returns it and the logits of each row's next token [rows, vocab]."""
    from transformers import DynamicCache

    device = _device(model)
    seqs = [list(r.request.prompt_ids) + r.tokens for r in rows]
    width = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    ids, mask, positions = ids.to(device), mask.to(device), positions.to(device)
    cache = DynamicCache()
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True, logits_to_keep=1
    )
    if not bool(mask.all()):
        keep = mask[:, None, :, None].bool()
        for layer in cache.layers:
            layer.keys = torch.where(keep, layer.keys, 0)
            layer.values = torch.where(keep, layer.values, 0)
    return Batch(list(rows), cache, mask), out.logits[:, -1]


@torch.no_grad()
def decode(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """One step for every row of `batch` (its last sampled token in); the cache and mask grow by one
    column. Returns the logits of each row's next token [rows, vocab]."""
    device = batch.mask.device
    ids = torch.tensor([[r.tokens[-1]] for r in batch.rows], dtype=torch.long, device=device)
    positions = torch.tensor([[r.length - 1] for r in batch.rows], dtype=torch.long, device=device)
    mask = torch.cat([batch.mask, torch.ones((len(batch.rows), 1), dtype=batch.mask.dtype, device=device)], dim=1)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=batch.cache, use_cache=True)
    batch.mask = mask
    return out.logits[:, -1]


def merge(a: Batch, b: Batch) -> Batch:
    """One batch of `a`'s rows then `b`'s, the narrower left-padded (zeros, masked) to the wider."""
    width = max(a.mask.shape[1], b.mask.shape[1])
    for mine, theirs in zip(a.cache.layers, b.cache.layers, strict=True):
        mine.keys = torch.cat([_pad(mine.keys, width), _pad(theirs.keys, width)], dim=0)
        mine.values = torch.cat([_pad(mine.values, width), _pad(theirs.values, width)], dim=0)
    mask = torch.cat([_pad_mask(a.mask, width), _pad_mask(b.mask, width)], dim=0)
    return Batch(a.rows + b.rows, a.cache, mask)


def _pad(t: torch.Tensor, width: int) -> torch.Tensor:
    extra = width - t.shape[2]
    if extra == 0:
        return t
    return torch.cat([t.new_zeros((t.shape[0], t.shape[1], extra, t.shape[3])), t], dim=2)


def _pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    extra = width - mask.shape[1]
    if extra == 0:
        return mask
    return torch.cat([mask.new_zeros((mask.shape[0], extra)), mask], dim=1)


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device
