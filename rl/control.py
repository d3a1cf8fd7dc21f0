"""Step-size control for single-sample updates, as small pure state machines.

With one rated response per step, an optimizer like Adam moves every weight by about the learning
rate whatever the sample says, so a fixed rate either lets a run of same-signed ratings push the policy
far from where it sampled (the ratio mask then drops most tokens, the policy degenerates) or learns
slowly. Two controllers keep the update size where it should be:

- `StepSizeControl`: adapt the learning rate from the KL each update moved the policy by on the tokens
  it was trained on (measured, exact): above 2x the target the rate is divided by `factor`, below half
  the target multiplied by it, within [min_lr, max_lr]. PPO implementations use the same rule on each
  mini-batch (rsl_rl's "adaptive" schedule, desired_kl); one rating is one mini-batch here.
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
