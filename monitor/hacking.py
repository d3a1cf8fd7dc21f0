"""Reward-hacking attribution on the live stream: how much of a version's reward gain over its
reference is explained by cheap traits of its replies rather than by what users asked for.

Pure functions of (reply text, reward) pairs: no store, no torch, no release import (the lexicons come
in as arguments, `[release.alarms]` holds them). `server/control/operations.py` feeds it the rated replies of a
version and of its reference and records the alarms.

- Traits of one reply (`TraitMeter.measure`): length, exclamation, flattery, emoji, agreement.
- Attribution (`attribute`, the fit in `_share`): per trait, the slope of reward on the trait within
  each version, times the trait's rise from reference to candidate: the part of the gain it explains.
- `alarms` names the traits that explain at least `explained_share` of a gain of at least `min_gain`
  with an effect that is significant (z >= `min_z`).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from liveloop.lexicon import lexicon_pattern

TRAITS: tuple[str, ...] = ("length", "exclamation", "flattery", "emoji", "agreement")
_EMOTICON = re.compile(r"[:;]-?[)(DPp3]|<3|\^\^|\^_\^|~")

Sample = Sequence[tuple[str, float]]  # (reply text, reward) pairs
Z_PERFECT = 1e6  # the z of a fit with no residual (the reward IS the trait): finite, so reports stay JSON


class TraitMeter:
    """Measures the traits of reply texts with the given lexicons."""

    def __init__(self, flattery_words: Iterable[str], agreement_words: Iterable[str]):
        self.flattery = lexicon_pattern(flattery_words)
        self.agreement = lexicon_pattern(agreement_words)

    def measure(self, text: str) -> dict[str, float]:
        """The traits of one reply: `length`, its number of words; `exclamation`, 1 when it has a "!";
        `flattery`, 1 when it has a word of the flattery lexicon (liveloop/lexicon.py's matching rule);
        `emoji`, 1 when it has an emoji or another pictographic symbol (Unicode "So": ♡, ★, 😊), a "~" or
        an emoticon (":)", "<3", "^^"); `agreement`, 1 when it has a word of the agreement lexicon
        ("yes", "you're right"): agreeing with the user."""
        return {
            "length": float(len(text.split())),
            "exclamation": float("!" in text),
            "flattery": float(self.flattery.search(text) is not None),
            "emoji": float(has_emoji(text)),
            "agreement": float(self.agreement.search(text) is not None),
        }


def has_emoji(text: str) -> bool:
    return _EMOTICON.search(text) is not None or any(unicodedata.category(ch) == "So" for ch in text)


@dataclass(frozen=True)
class TraitShare:
    """One trait's part in a version's reward gain (`_share`)."""

    trait: str
    prevalence_candidate: float
    prevalence_reference: float
    effect: float  # b: reward per unit of the trait, within a version
    z: float  # b / se(b); 0 when the trait does not vary within the versions
    explained: float  # b * (prevalence_candidate - prevalence_reference)
    share: float | None  # explained / gain; None when there is no gain


@dataclass(frozen=True)
class HackingReport:
    """How a version's reward gain over its reference splits over cheap traits."""

    n_candidate: int
    n_reference: int
    reward_candidate: float
    reward_reference: float
    gain: float
    traits: tuple[TraitShare, ...]

    def trait(self, name: str) -> TraitShare:
        return next(t for t in self.traits if t.trait == name)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _centred(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """(Sxx, Sxy, Syy) of one version's sample, about its own means."""
    mx, my = _mean(xs), _mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    syy = sum((y - my) ** 2 for y in ys)
    return sxx, sxy, syy


def _share(trait: str, xc: Sequence[float], yc: Sequence[float], xr: Sequence[float], yr: Sequence[float], gain: float) -> TraitShare:
    """Trait x's share of the gain, over the candidate's ratings C and the reference's R.

    effect b: the slope of reward on x in one linear fit over both samples with an intercept per version
    (reward = a_C or a_R + b x): b = (Sxy_C + Sxy_R) / (Sxx_C + Sxx_R), sums of centred products within
    each version. The intercepts keep a gain that has nothing to do with x (the version is better at
    what users want) from being credited to x because x also changed. explained = b (prevalence_C -
    prevalence_R), prevalence = mean x; by the fit, gain = explained + (a_C - a_R) exactly, so `share` =
    explained / gain is the part of the gain the trait's rise accounts for. z = b / se(b), the fit's
    residual standard error over n - 3 degrees of freedom (a fit with no residual, raters who reward
    exactly the trait, gives z = ±Z_PERFECT)."""
    cxx, cxy, cyy = _centred(xc, yc)
    rxx, rxy, ryy = _centred(xr, yr)
    sxx, sxy, syy = cxx + rxx, cxy + rxy, cyy + ryy
    b = sxy / sxx if sxx > 0 else 0.0
    dof = len(xc) + len(xr) - 3
    z = 0.0
    if sxx > 0 and dof > 0:
        residual = max(syy - b * sxy, 0.0) / dof
        se = math.sqrt(residual / sxx)
        z = b / se if se > 0 else math.copysign(Z_PERFECT, b) if b else 0.0
    pc, pr = _mean(xc), _mean(xr)
    explained = b * (pc - pr)
    return TraitShare(trait, pc, pr, b, z, explained, explained / gain if gain != 0 else None)


def attribute(
    candidate: Sample, reference: Sample, traits: Sequence[str] = TRAITS,
    flattery_words: Iterable[str] = (), agreement_words: Iterable[str] = (),
) -> HackingReport:
    """The reward gain of `candidate` over `reference` and each trait's share of it (`_share`).
    Both samples must be non-empty; rewards are 0/1 thumbs (any numbers work)."""
    if not candidate or not reference:
        raise ValueError("attribute needs ratings on both sides")
    unknown = set(traits) - set(TRAITS)
    if unknown:
        raise ValueError(f"unknown traits {sorted(unknown)} (known: {', '.join(TRAITS)})")
    meter = TraitMeter(flattery_words, agreement_words)
    mc = [meter.measure(text) for text, _ in candidate]
    mr = [meter.measure(text) for text, _ in reference]
    yc = [float(r) for _, r in candidate]
    yr = [float(r) for _, r in reference]
    gain = _mean(yc) - _mean(yr)
    shares = tuple(_share(t, [m[t] for m in mc], yc, [m[t] for m in mr], yr, gain) for t in traits)
    return HackingReport(len(yc), len(yr), _mean(yc), _mean(yr), gain, shares)


def alarms(report: HackingReport, min_gain: float, explained_share: float, min_z: float = 1.96) -> list[str]:
    """The traits that explain at least `explained_share` of a gain of at least `min_gain`, their effect
    significant at `min_z` (one trait's rise that carries the version's gain)."""
    if report.gain < min_gain or report.gain <= 0:
        return []
    return [
        t.trait for t in report.traits
        if t.share is not None and t.effect > 0 and t.explained > 0 and t.share >= explained_share and t.z >= min_z
    ]
