"""When a segment's adapter starts over: its users' preference moved away from what it learned.

    restart = RestartOnDrop(window=30, drop=0.5)
    if restart.add(batch_rewards):   # after each step, the rewards of the ratings it trained on
        ...                          # the lane's adapter back to a fresh one (learner/online.py)

An adapter that learned one preference well samples almost nothing else: when the segment's users then
want something else, every reply is rated down, yet the new preference is never sampled, so the ratings
carry no signal towards it (measured on the drift scenario: 0.0 reward over a segment's 310 ratings after
its switch; docs/design.md, "The drift experiment on five seeds"). The base still samples the new
preference at its base rate, and a fresh adapter learns a new objective within about 40-60 ratings.

The rule: the mean reward over the lane's last `window` trained ratings has fallen `drop` or more below
the best such mean since the adapter (re)started. A window full of low rewards from the start never
fires (the best is low too): a lane that has not learned yet is not started over. The rewards are those
of the ratings the lane trained on, after the influence caps (learner/influence.py), so a few keys
cannot down-vote a segment's adapter away.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class RestartOnDrop:
    def __init__(self, window: int, drop: float):
        if window < 1 or not 0 < drop <= 1:
            raise ValueError(f"restart window must be >= 1 and drop in (0, 1], got {window}, {drop}")
        self.window, self.drop = window, drop
        self.rewards: deque[float] = deque(maxlen=window)
        self.best: float | None = None
        self.restarts = 0

    def add(self, rewards: Iterable[float]) -> bool:
        """Take a step's rewards in order; True when the lane should start over (the window then starts
        empty: the next verdict needs `window` new ratings)."""
        for r in rewards:
            self.rewards.append(float(r))
            mean = self.window_mean
            if mean is None:
                continue
            self.best = mean if self.best is None else max(self.best, mean)
            if self.best - mean >= self.drop:
                self.forget()
                self.restarts += 1
                return True
        return False

    @property
    def window_mean(self) -> float | None:
        """The mean reward of the last `window` ratings; None until the window is full."""
        return sum(self.rewards) / self.window if len(self.rewards) == self.window else None

    def forget(self) -> None:
        """Judge afresh (the lane now serves another adapter: an operator's rollback or publish)."""
        self.rewards.clear()
        self.best = None

    def stats(self) -> dict[str, float]:
        out = {"learner/restarts": float(self.restarts)}
        if self.window_mean is not None:
            out["learner/restart_window_mean"] = self.window_mean
        if self.best is not None:
            out["learner/restart_best"] = self.best
        return out
