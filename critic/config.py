"""The critic's configuration section (`[critic]`)."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CriticConfig:
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW learning rate"})
    value_steps: int = field(default=2, metadata={"help": "K critic steps per policy step"})
    freeze_attention: bool = field(default=True, metadata={"help": "attention parameters do not train"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping"})

    def __post_init__(self) -> None:
        if self.value_steps < 1:
            raise ValueError("value_steps must be >= 1")
