"""How a response's tokens were drawn, and the distribution that draw sampled from: `Sampling` (what a
stored response records) and `draw_logits` (the logits shaped as the draw shaped them), shared by the hf
engine (which samples from them and logs their log-softmax) and the learner (which scores the policy
through the same shaping, so the ratio pi/mu compares two distributions of one kind).

The shaping is vLLM's sampler's, in its order: the logits (after a grammar's mask) divided by the
temperature, then min-p (drop tokens less likely than min_p times the most likely), top-k (keep the k
largest logits), top-p (keep the fewest most likely tokens whose mass reaches top_p, at least one).
A cut logit becomes `CUT` (finite, so 0 * log 0 stays 0 in a KL sum). At temperature 0 (greedy) the
distribution is the temperature-1 one, uncut: what vLLM logs for a greedy row, and what a greedy reply
is trained as (the draw itself is a point mass; the policy learnt is the temperature-1 one).

`keep`: the learner scores a drawn token under the policy's own cut of the new logits, where it may fall
outside a new nucleus; it is kept in (its logprob stays finite; far from the behaviour's, the ratio mask
drops it). On-policy the drawn token is inside the cut anyway, so the score is the draw's. Only the
drawn token's logprob is cut (rl/batch.py `token_logprobs`); whole distributions (KL terms) compare the
tempered, uncut ones, since two models cut differently and a token one cuts would weigh 1e9 nats.

The repetition penalty and `min_tokens` also shape a draw, but depend on the text so far; the learner
does not replay them, so a response drawn with either is not trained (`Sampling.untrainable`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

GREEDY_BELOW = 1e-5  # vLLM's sampling epsilon: a temperature below it draws greedily
LOWEST_TEMPERATURE = 1e-2  # vLLM raises a temperature in (0, 0.01) to this (numerical safety): every engine does
CUT_ROWS = 256  # `cut_mask` works through this many positions at a time (its sort is [rows, V] int64)
CUT = -1e9  # a logit the shaping cut: exp() is 0 in float32, yet finite
NO_CHANCE = -9999.0  # the logprob an API reply shows for a token the draw could not pick (OpenAI's figure)


@dataclass(frozen=True)
class Sampling:
    """The sampling a response's behaviour logprobs are of. `logprobs`: "sampled" (the distribution the
    draw used: `draw_logits`) or "raw" (the temperature-1 distribution, uncut: what engines logged
    before this record existed, and an engine that cannot log the other)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: every token
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    logprobs: str = "sampled"

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def shaped(self) -> bool:
        """Whether the draw's distribution differs from the temperature-1 one (greedy: it does not)."""
        if self.greedy:
            return False
        return self.temperature != 1.0 or self.top_p < 1.0 or self.top_k > 0 or self.min_p > 0.0

    def untrainable(self) -> str | None:
        """Why a learner cannot score a response drawn so (None: it can)."""
        if self.repetition_penalty != 1.0:
            return f"drawn under repetition_penalty {self.repetition_penalty}, which the learner does not replay"
        if self.min_tokens > 0:
            return f"drawn under min_tokens {self.min_tokens}, which the learner does not replay"
        if self.logprobs == "raw" and self.shaped:
            return (f"its logprobs are of the raw distribution, not of its draw (temperature {self.temperature}, "
                    f"top_p {self.top_p}, top_k {self.top_k}, min_p {self.min_p})")
        return None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Sampling":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    @classmethod
    def logged_raw(cls, temperature: float, top_p: float) -> "Sampling":
        """A response stored without a record of its sampling (before one was kept): every engine then
        logged the raw distribution's logprobs, whatever the draw's temperature and top_p."""
        return cls(temperature=temperature, top_p=top_p, logprobs="raw")


PLAIN = Sampling()


def drawn_temperature(temperature: float) -> float:
    """The temperature a request's draw uses on every engine: 0 (greedy) below vLLM's epsilon, at least
    vLLM's lowest (it raises smaller ones), else as asked."""
    return 0.0 if temperature < GREEDY_BELOW else max(temperature, LOWEST_TEMPERATURE)


def cuts(s: Sampling) -> bool:
    """Whether a draw under `s` cuts tokens (min-p, top-k, top-p), beyond its temperature."""
    return s.shaped and (s.min_p > 0.0 or s.top_k > 0 or s.top_p < 1.0)


def tempered(logits: "Tensor", s: Sampling) -> "Tensor":
    """`logits` divided by the draw's temperature (greedy and temperature 1: as they are)."""
    return logits / s.temperature if s.shaped and s.temperature != 1.0 else logits


def draw_logits(logits: "Tensor", s: Sampling, keep: "Tensor | None" = None) -> "Tensor":
    """`logits` [n, V] shaped as a draw under `s` shapes them (out of place; gradients flow through the
    kept logits, divided by the temperature). `keep` [n] token ids kept whatever the cuts say."""
    out = tempered(logits, s)
    return out.masked_fill(cut_mask(out, s, keep), CUT) if cuts(s) else out


def cut_mask(logits: "Tensor", s: Sampling, keep: "Tensor | None" = None) -> "Tensor":
    """[n, V] True where the draw's cuts drop a token of tempered `logits` (or log-probabilities: the same
    cut), `keep` [n] token ids never; no gradient."""
    import torch

    with torch.no_grad():
        parts = [_cut(logits[i:i + CUT_ROWS].detach().float(), s) for i in range(0, logits.shape[0], CUT_ROWS)]
        cut = torch.cat(parts) if parts else torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
        if keep is not None:
            cut.scatter_(1, keep.reshape(-1, 1).to(device=cut.device, dtype=torch.long), False)
    return cut


def _cut(logits: "Tensor", s: Sampling) -> "Tensor":
    """[n, V] True where min-p, top-k and top-p (vLLM's order and arithmetic) cut a token."""
    import torch

    cut = torch.zeros_like(logits, dtype=torch.bool)
    if s.min_p > 0.0:
        probs = logits.softmax(-1)
        cut |= probs < s.min_p * probs.amax(-1, keepdim=True)
    masked = logits.masked_fill(cut, float("-inf"))
    if 0 < s.top_k < logits.shape[-1]:
        kth = masked.topk(s.top_k, dim=-1).values[:, -1:]
        cut |= masked < kth
        masked = masked.masked_fill(cut, float("-inf"))
    if s.top_p < 1.0:
        ascending, order = masked.sort(dim=-1)
        mass = ascending.softmax(-1).cumsum(-1)
        drop = mass <= 1 - s.top_p
        drop[:, -1] = False  # the most likely token always stays
        cut |= torch.zeros_like(cut).scatter(1, order, drop)
    return cut
