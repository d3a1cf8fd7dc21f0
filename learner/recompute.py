"""Recomputed activations for long batches: above `[learner] recompute_over_tokens` tokens in a batch (its
rows times its padded length), the policy's and the critic's decoder layers keep only their inputs for the
backward and run their forward again inside it (torch's non-reentrant checkpoint, through transformers'
`GradientCheckpointingLayer`). The update is the same; the memory of a step stops growing with every
token of the batch, at about one more forward of each trained pass.

Why by length and not always (`[learner] gradient_checkpointing`): activations grow with the batch's
tokens, about 3.6 MB a token on SmolLM2 across the critic's and the policy's passes. Measured there
(docs/results/real_model.md): a 1,400-token sample peaked at 5.6 GiB and stepped in 44-50 s; recomputed,
2.9-3.2 GiB and 57-63 s. A short chat's step keeps its speed."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator

import torch
from torch.utils.checkpoint import checkpoint

_CHECKPOINT = functools.partial(checkpoint, use_reentrant=False)


@contextlib.contextmanager
def recomputed(modules: Iterable[torch.nn.Module | None], on: bool) -> Iterator[int]:
    """Inside the block, every decoder layer of `modules` recomputes its activations in the backward when
    `on` (yields how many layers do); each layer's own setting is restored after."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [
        layer for module in modules if module is not None and on
        for layer in module.modules() if isinstance(layer, GradientCheckpointingLayer) and not layer.gradient_checkpointing
    ]
    saved = [layer.__dict__.get("_gradient_checkpointing_func") for layer in layers]
    for layer in layers:
        layer._gradient_checkpointing_func = _CHECKPOINT
        layer.gradient_checkpointing = True
    try:
        yield len(layers)
    finally:
        for layer, func in zip(layers, saved):
            layer.gradient_checkpointing = False
            if func is None:
                layer.__dict__.pop("_gradient_checkpointing_func", None)
            else:
                layer._gradient_checkpointing_func = func
