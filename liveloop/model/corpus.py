"""Synthetic chat corpus for the embedded default model.

Owns the topics, the three writing styles ("cute", "chuunibyou", "classical"), the prompt and reply
templates, and the style markers a rule-based judge can look for. Every (topic, style) pair is equally
likely, so a model trained on this corpus mixes all three styles on every topic; learning online which
style users like is left to the rest of liveloop. Knows nothing about tokens or models.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

STYLES: tuple[str, ...] = ("cute", "chuunibyou", "classical")

# Lowercase words/phrases characteristic of each style. No marker occurs, even as a substring, in the
# replies of another style (tests check this over a whole corpus).
STYLE_MARKERS: dict[str, tuple[str, ...]] = {
    "cute": ("aww", "hehe", "uwu", "teehee", "so fluffy", "so cute", "~", "♡"),
    "chuunibyou": ("behold", "kukuku", "mortals", "fate", "sealed", "dark power", "the abyss",
                   "my right arm", "prophecy"),
    "classical": ("thou", "thee", "thy", "doth", "'tis", "verily", "hath", "forsooth", "methinks", "hark"),
}


@dataclass(frozen=True)
class _Topic:
    agent: str  # a singular noun that can do the `acts`
    nouns: tuple[str, ...]
    adjs: tuple[str, ...]
    acts: tuple[str, ...]  # base-form verb phrases: "nap in the sun"


_TOPICS: dict[str, _Topic] = {
    "cats": _Topic("cat", ("tail", "paw", "kitten", "purring", "windowsill", "yarn ball"),
                   ("soft", "sleepy", "curious", "striped", "tiny"),
                   ("nap in the sun", "chase a yarn ball", "purr on my lap", "stretch by the window")),
    "the sea": _Topic("wave", ("tide", "shore", "seashell", "salt spray", "harbor", "sailboat"),
                      ("blue", "restless", "deep", "foamy", "endless"),
                      ("crash on the rocks", "roll onto the sand", "carry the boats", "sparkle at noon")),
    "rain": _Topic("raindrop", ("puddle", "umbrella", "storm cloud", "drizzle", "rooftop", "wet pavement"),
                   ("gentle", "grey", "cold", "pattering", "misty"),
                   ("tap on the roof", "fill the puddles", "wash the streets", "drip from the leaves")),
    "bread": _Topic("loaf", ("crust", "oven", "dough", "butter", "bakery", "sourdough"),
                    ("golden", "crusty", "fresh", "warm", "buttery"),
                    ("rise in the oven", "cool on the rack", "fill the kitchen with smell", "crackle when cut")),
    "the moon": _Topic("moon", ("moonlight", "night sky", "crescent", "evening star", "silver glow", "crater"),
                       ("pale", "silver", "round", "quiet", "glowing"),
                       ("glow over the hills", "rise above the roofs", "hide behind clouds", "light the path")),
    "forests": _Topic("old oak", ("pine cone", "moss", "mushroom", "tall pine", "fern", "birdsong"),
                      ("green", "mossy", "ancient", "shady", "wild"),
                      ("whisper in the wind", "shelter the deer", "drop its leaves", "reach for the sky")),
    "trains": _Topic("train", ("station", "railway", "carriage", "whistle", "signal", "timetable"),
                     ("fast", "rumbling", "long", "steam", "midnight"),
                     ("roll past the station", "rush through the valley", "sound its whistle",
                      "cross the old bridge")),
    "music": _Topic("melody", ("piano", "violin", "song", "chorus", "drum", "lullaby"),
                    ("sweet", "lively", "soft", "bright", "gentle"),
                    ("drift through the room", "fill the hall", "make my feet tap", "linger after the end")),
}
TOPICS: tuple[str, ...] = tuple(_TOPICS)


@dataclass(frozen=True)
class Example:
    prompt: str
    reply: str
    topic: str
    style: str


_PROMPTS = (
    "Tell me about {t}.", "Write a line about {t}.", "What do you think of {t}?", "Say something about {t}.",
    "Describe {t}.", "Can you talk about {t}?", "Give me a few words on {t}.", "How would you describe {t}?",
    "Tell me something nice about {t}.", "What is your take on {t}?", "I like {t}. What about you?",
    "Write something short about {t}.",
)

# Templates: {adj} {agent} {act} (3rd person), {act_base}, {noun}, {noun2}, {topic}.
_OPENERS = {
    "cute": ("Aww, {topic}!", "Hehe~", "Uwu,", "Teehee~", "Aww~", "Ooh, {topic}! Hehe~"),
    "chuunibyou": ("Behold!", "Kukuku...", "Tremble, mortals!", "Behold, fools!", "Kukuku, {topic}?"),
    "classical": ("Verily,", "Hark!", "Forsooth,", "'Tis true:", "Ah, {topic}, verily."),
}
_BODIES = {
    "cute": (
        "the {adj} {agent} {act}, so cute~",
        "I wanna cuddle the {noun} all day, hehe!",
        "look at the {adj} {noun}, it is so fluffy and sweet ♡",
        "a tiny {agent} {act} and my heart goes doki doki~",
        "everything about the {noun} is so soft and happy, uwu.",
        "the {noun} and the {noun2} make me do a little happy dance~",
        "I love the {adj} {noun} so much, teehee ♡",
    ),
    "chuunibyou": (
        "the {adj} {agent} {act}, just as fate decreed.",
        "my sealed dark power stirs whenever the {noun} draws near.",
        "even the {noun} cannot escape the abyss that dwells within my right arm.",
        "I, the dark sovereign, foresaw the {adj} {noun} in the crimson prophecy.",
        "the {agent} {act}... a sign that my sealed eye is awakening!",
        "the {noun} and the {noun2} are bound to me by fate, forged in the abyss.",
        "mortals see only the {adj} {noun}, but I see the dark power behind it.",
    ),
    "classical": (
        "'tis a {adj} {agent} that doth {act_base}, and fair it is to see.",
        "thou shalt find the {noun} most {adj}, I do declare.",
        "the {noun} hath a {adj} grace that doth gladden mine heart.",
        "methinks the {agent} doth {act_base} with gentle grace.",
        "hark, how the {adj} {noun} doth stir thy soul!",
        "'tis said the {noun} and the {noun2} have ever been friends to poets.",
        "verily, no {noun} was ever so {adj} as this, good friend.",
    ),
}
_CLOSERS = {
    "cute": ("So cute~", "Hehe!", "Uwu ♡", "Aww, I love it~", "So fluffy~"),
    "chuunibyou": ("Such is fate.", "Kukuku...", "The abyss awaits.", "Do not underestimate my sealed power!"),
    "classical": ("So it hath ever been.", "Fare thee well.", "Mark my words, good friend.", "Verily."),
}


def _third_person(act_base: str) -> str:
    verb, _, rest = act_base.partition(" ")
    if verb.endswith(("s", "sh", "ch", "x", "z")):
        verb += "es"
    elif verb.endswith("y") and verb[-2:-1] not in "aeiou":
        verb = verb[:-1] + "ies"
    else:
        verb += "s"
    return f"{verb} {rest}".strip()


def _capitalize(s: str) -> str:
    i = 1 if s.startswith("'") else 0
    return s[:i] + s[i : i + 1].upper() + s[i + 1 :]


def make_prompt(topic: str, rng: random.Random) -> str:
    """A short user prompt that names `topic`."""
    text = rng.choice(_PROMPTS).format(t=topic)
    return _capitalize(text)


def _fill(template: str, topic: str, rng: random.Random) -> str:
    t = _TOPICS[topic]
    noun, noun2 = rng.sample(t.nouns, 2)
    act_base = rng.choice(t.acts)
    return template.format(topic=topic, agent=t.agent, adj=rng.choice(t.adjs), noun=noun, noun2=noun2,
                           act=_third_person(act_base), act_base=act_base)


def make_reply(topic: str, style: str, rng: random.Random) -> str:
    """A 15-45 word reply about `topic` in `style`: an opener, one or two sentences, maybe a closer."""
    if topic not in _TOPICS:
        raise ValueError(f"unknown topic {topic!r}; expected one of {TOPICS}")
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}; expected one of {STYLES}")
    while True:
        parts = [_fill(rng.choice(_OPENERS[style]), topic, rng)]
        for template in rng.sample(_BODIES[style], rng.choice((1, 2, 2))):
            body = _fill(template, topic, rng)
            parts.append(body if parts[-1].endswith(",") else _capitalize(body))
        if rng.random() < 0.5:
            parts.append(rng.choice(_CLOSERS[style]))
        reply = " ".join(parts)
        if 15 <= len(reply.split()) <= 45:
            return reply


def generate_corpus(n: int, seed: int) -> list[Example]:
    """`n` examples; every (topic, style) pair appears n / (topics * styles) times, give or take one."""
    rng = random.Random(seed)
    pairs = [(topic, style) for topic in TOPICS for style in STYLES]
    examples: list[Example] = []
    while len(examples) < n:
        block = pairs[:]
        rng.shuffle(block)
        for topic, style in block[: n - len(examples)]:
            examples.append(Example(make_prompt(topic, rng), make_reply(topic, style, rng), topic, style))
    return examples
