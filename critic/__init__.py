"""The critic: a token-level value model (policy backbone + scalar head) with frozen attention, and
its update rule (K value steps per policy step). Knows nothing of serving."""

from liveloop.critic.value_model import build_value_model, freeze_attention, token_values

__all__ = ["build_value_model", "freeze_attention", "token_values"]
