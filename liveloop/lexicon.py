"""How a lexicon (words, phrases, symbols) is matched in a reply: the one rule the simulated judges
(clients/judge.py), the reward-hacking traits (monitor/hacking.py) and the evaluation's checks share.

Word entries ("aww", "so cute", "you're right") match whole words, case-insensitively, their plurals
included ("mortals" for "mortal", not "though" for "thou"); anything else ("~", "♡", "!") matches
anywhere. Imports no component."""

from __future__ import annotations

import re
from collections.abc import Iterable


def marker_pattern(marker: str) -> str:
    """The regular expression of one lexicon entry."""
    if re.fullmatch(r"[\w' ]+", marker):
        return r"(?<![\w'])" + re.escape(marker) + r"(?:s|es)?(?!\w)"
    return re.escape(marker)


def lexicon_pattern(words: Iterable[str]) -> re.Pattern[str]:
    """One compiled alternation of every entry (an empty lexicon matches nothing)."""
    parts = [marker_pattern(w.lower()) for w in words if w]
    return re.compile("|".join(parts) if parts else r"(?!x)x", re.IGNORECASE)
