"""Step-size control for single-sample updates, as small pure state machines.

With one rated response per step, an optimizer like Adam moves every weight by about the learning
rate whatever the sample says, so a fixed rate either lets a run of same-signed ratings push the policy
far from where it sampled (the ratio mask then drops most tokens, the policy degenerates) or learns
slowly. Two controllers keep the update size where it should be:

- `StepSizeControl`: adapt the learning rate from the KL each update moved the policy by on the tokens
  it was trained on (measured, exact): above 2x the target the rate is divided by `factor`, below half
  the target multiplied by it, within [min_lr, max_lr]. PPO implementations use the same rule on each
  mini-batch (rsl_rl's "adaptive" schedule, desired_kl); one rating is one mini-batch here.
- `trust_region`: how much of an update past `max_step_kl` stands: a cut-back to the largest fraction
  of it that stays within, or, where even 1/100 of it jumps (a discontinuity in the policy, which
  every step size crosses), that 1/100; else none. Undoing every update past the region, as it first
  did, froze learning for good at an MoE routing switch (docs/design.md, "Reproducible verdicts").
- `AdaptiveKLCoef`: adapt the coefficient of the KL anchor to the base policy so that the measured KL
  tracks a target (Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences"):
  beta <- beta * (1 + clip(KL / target - 1, -0.2, 0.2) * n / horizon), n the samples of the step.

Both are a few lines; a dependency (TRL's AdaptiveKLController) would bring a whole trainer for them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepSizeControl:
    lr: float
    target_kl: float
    min_lr: float
    max_lr: float
    factor: float = 1.5

    def __post_init__(self) -> None:
        if not (0 < self.min_lr <= self.lr <= self.max_lr) or self.target_kl <= 0 or self.factor <= 1:
            raise ValueError("need 0 < min_lr <= lr <= max_lr, target_kl > 0 and factor > 1")

    def update(self, step_kl: float) -> float:
        """The learning rate for the next step, given the KL the last one moved the policy by."""
        if step_kl != step_kl:  # NaN: the step was not taken or not measurable; be careful
            self.lr = max(self.min_lr, self.lr / self.factor)
        elif step_kl > 2 * self.target_kl:
            self.lr = max(self.min_lr, self.lr / self.factor)
        elif step_kl < self.target_kl / 2:
            self.lr = min(self.max_lr, self.lr * self.factor)
        return self.lr


@dataclass
class AdaptiveKLCoef:
    coef: float
    target: float
    horizon: int = 200
    max_coef: float = 100.0

    def __post_init__(self) -> None:
        if self.coef <= 0 or self.target <= 0 or self.horizon < 1:
            raise ValueError("need coef > 0, target > 0 and horizon >= 1")

    def update(self, kl: float, n: int = 1) -> float:
        """The coefficient for the next step, given the KL to the base measured on this one (n samples)."""
        error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.coef = min(self.max_coef, max(1e-6, self.coef * (1.0 + error * n / self.horizon)))
        return self.coef


# the fractions of a rejected update the trust region tries, largest first (`trust_region`)
CUT_BACKS = (0.5, 0.1, 0.01)


@dataclass(frozen=True)
class TrustRegionVerdict:
    scale: float  # the fraction of the update that stands: 1 (all), a cut-back, or 0 (undone)
    kind: str  # "within" | "cut" (a smaller step stayed within) | "jump" (a discontinuity) | "undone"
    kl: float  # the KL the standing update moves the policy by (0 when undone)


def trust_region(kl_at, full_kl: float, max_kl: float) -> TrustRegionVerdict:
    """Decide how much of an update stands, given `kl_at(scale)`: the KL that `scale` times the update
    moves the policy by (measured), and `full_kl = kl_at(1)`.

    - within the region (full_kl <= max_kl): all of it stands;
    - else the largest of CUT_BACKS whose KL is within stands (a cut-back: the smooth part of the step);
    - else, if the smallest cut-back moves the policy by more than half as much as ten times it, the
      policy has a jump right where it stands (a discontinuity, e.g. an MoE routing switch: a smooth
      policy moves by about the square of the step, 1/100 as much): any step crosses it, so undoing
      would undo every later update too and freeze learning; the smallest cut-back stands. (Letting it
      stand only where it lowered the step's objective froze learning again: measured, every descent
      direction crossed the same cliff for the worse; the KL anchor pulls a bad jump back instead);
    - else the update is undone (an overshoot that no cut-back tamed).

    Cut-backs are measured largest first and only until one is within (each measurement is a forward of
    the policy): the verdict is the one measuring all of them would give.
    """
    if full_kl <= max_kl:
        return TrustRegionVerdict(1.0, "within", full_kl)
    measured: dict[float, float] = {}
    for scale in CUT_BACKS:
        measured[scale] = kl_at(scale)
        if measured[scale] <= max_kl:
            return TrustRegionVerdict(scale, "cut", measured[scale])
    small, next_up = CUT_BACKS[-1], CUT_BACKS[-2]
    if measured[small] > 0.5 * measured[next_up]:
        return TrustRegionVerdict(small, "jump", measured[small])
    return TrustRegionVerdict(0.0, "undone", 0.0)
