"""The critic's configuration section (`[critic]`)."""

from dataclasses import dataclass, field

from liveloop.rewards import RULE_SPECS


@dataclass(frozen=True)
class CriticConfig:
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW learning rate"})
    value_steps: int = field(default=2, metadata={"help": "K critic steps per policy step"})
    freeze_attention: bool = field(default=True, metadata={"help": "attention parameters do not train"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping"})
    lora_rank: int = field(
        default=0,
        metadata={"help": "0: the critic's MLPs, embeddings and norms train whole (a full copy of the model with its own "
                  "moments); N > 0: a LoRA adapter of rank N on the MLP projections and a fresh value head train over "
                  "frozen weights that are the learner's frozen base itself (its tensors, not a copy)"},
    )

    pretrain_reward: str = field(default="", metadata={"help": f"reward for pre-training rollouts: {RULE_SPECS}"})
    pretrain_rollouts: int = field(default=128, metadata={"help": "rollouts of the initial policy to fit"})
    pretrain_max_tokens: int = field(default=48, metadata={"help": "reply length of each rollout"})
    pretrain_ev_threshold: float = field(default=0.5, metadata={"help": "stop when explained variance passes this"})
    pretrain_max_epochs: int = field(default=20, metadata={"help": "stop after this many epochs regardless"})

    def __post_init__(self) -> None:
        if self.value_steps < 1:
            raise ValueError("value_steps must be >= 1")
        if self.lora_rank < 0:
            raise ValueError("lora_rank must be >= 0 (0: the MLPs train whole)")
