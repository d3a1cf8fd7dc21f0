"""Hypothesis strategies for the property tests (test_properties.py): values at and past every type's
limit, JSON text that `json.dumps` cannot write (NaN/Infinity literals, 5000-digit numbers, deep nesting,
duplicate keys), valid-shaped chat and completion bodies with 0-2 mutations, and the other routes'
bodies, content types and query values."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

MODEL = "liveloop-tiny"


# -- JSON text with literals json.dumps cannot write --------------------------------------------------
@dataclass(frozen=True)
class Raw:
    """A JSON token written as-is: NaN, Infinity, a 5000-digit number, 1e400."""

    text: str


@dataclass(frozen=True)
class Pairs:
    """A JSON object that may repeat a key."""

    items: tuple[tuple[str, Any], ...]


DELETE = Raw("<delete>")  # a mutation that removes the key


def encode(value: Any) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Pairs):
        return "{" + ",".join(f"{json.dumps(k)}:{encode(v)}" for k, v in value.items) + "}"
    if isinstance(value, dict):
        return encode(Pairs(tuple(value.items())))
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(encode(v) for v in value) + "]"
    return json.dumps(value)  # ensure_ascii: lone surrogates and NUL go out as \\uXXXX escapes; nan as NaN


# -- values ----------------------------------------------------------------------------------------
NAN, INF = float("nan"), float("inf")
DIGITS = "9" * 5000
EDGE_INTS = st.sampled_from(
    [0, -1, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**53 + 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1,
     2**64 - 1, 2**64, -(2**64), 10**30, -(10**30), 10**400]
)
RAW_NUMBERS = st.sampled_from(
    [Raw("NaN"), Raw("-NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1e400"), Raw("-1e400"), Raw("1e-400"), Raw("-0"),
     Raw("-0.0"), Raw("1E2"), Raw("1.0"), Raw("4.0"), Raw("0.5e1"), Raw(DIGITS), Raw("-" + DIGITS), Raw("0." + DIGITS),
     Raw("1" + "0" * 400), Raw("01"), Raw("+1"), Raw(".5")]
)
EDGE_FLOATS = st.sampled_from(
    [0.0, -0.0, 5e-324, -5e-324, 1e-300, 1e-30, 1e308, -1e308, 1.7976931348623157e308, NAN, INF, -INF, 2.0,
     2.0000000000000004, 1.0, 1.0000000000000002, 0.9999999999999999, 0.5]
)
SPECIAL_STRINGS = st.sampled_from(
    ["", " ", "\x00", "a\x00b", "\ud800", "x\udc00", "\ufeff", "\u202e", "\U0001f4a5", "é" * 300, "x" * 64, "x" * 65,
     "x" * 256, "x" * 257, "a" * 300, "x" * 513, "x" * 1001, "x" * 4096, "x" * 4097, "<|user|>", "<|end|>",
     "<|assistant|>\n", "{{ messages }}", "{% raw %}", "null", "NaN", MODEL, MODEL.upper(), MODEL + "\x00", "../../etc/passwd",
     "/", "/proc/self", "/dev/null", "%00", "\\", "\n\r\t", "chatcmpl-" + "0" * 32]
)
TEXT = st.one_of(st.text(max_size=24), SPECIAL_STRINGS)
SHORT_TEXT = st.text(st.characters(codec="utf-8"), min_size=1, max_size=16)
# integers that are cheap as max_tokens: at most 4 tokens to generate, or rejected (<= 0, > 512)
CHEAP_INTS = st.integers().filter(lambda x: x <= 4 or x > 512)
SCALARS = st.one_of(st.none(), st.booleans(), CHEAP_INTS, st.floats(), st.text(max_size=8), RAW_NUMBERS)
JUNK = st.recursive(SCALARS, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=8)
DEEP = st.sampled_from([100, 1000, 30_000]).map(lambda n: Raw("[" * n + "]" * n))
EDGE = st.one_of(EDGE_INTS, RAW_NUMBERS, EDGE_FLOATS, SPECIAL_STRINGS, JUNK, DEEP, st.just([""] * 2000))


# -- valid-shaped generation bodies, then 0-2 mutations ---------------------------------------------
ROLES = ["system", "developer", "user", "assistant"]
PART = st.fixed_dictionaries({"type": st.just("text"), "text": SHORT_TEXT})
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(ROLES), "content": st.one_of(SHORT_TEXT, st.lists(PART, min_size=1, max_size=2), TEXT)},
    optional={"name": st.one_of(st.text(max_size=8), st.just("n" * 64))},
)
STOP = st.one_of(st.none(), SHORT_TEXT, st.lists(SHORT_TEXT, max_size=4), st.just(["s" * 256] * 4), st.just("\x00"))
METADATA = st.one_of(
    st.none(),
    st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    st.just({f"k{i:062d}": "v" * 512 for i in range(16)}),
    st.just({"nul": "\x00", "": ""}),
)
SAMPLING = {
    "temperature": st.one_of(st.floats(0, 2), st.sampled_from([0, 2, 0.0, -0.0, 5e-324, 1e-300, 1e-30, 2.0])),
    "top_p": st.one_of(st.floats(0, 1, exclude_min=True), st.sampled_from([1, 5e-324, 1e-300, 1e-30, 1.0])),
    "stop": STOP,
    "seed": st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.sampled_from([-(2**63), 2**63 - 1, 0])),
    "stream": st.booleans(),
    "stream_options": st.one_of(st.none(), st.fixed_dictionaries({}, optional={"include_usage": st.booleans()})),
    "n": st.just(1),
    "user": st.one_of(st.none(), st.text(max_size=8), st.just("u" * 256)),
    "metadata": METADATA,
    "presence_penalty": st.sampled_from([0, 0.0, -0.0]),
    "frequency_penalty": st.sampled_from([0, 0.0, -0.0]),
    "return_token_ids": st.booleans(),
    "store": st.booleans(),
}
# max_tokens is nearly always there and at most 4 (leaving it out generates 128 tokens)
MAX_TOKENS = st.integers(0, 15).flatmap(lambda i: st.just(DELETE) if i == 0 else st.integers(1, 4))
CHAT_BASE = st.fixed_dictionaries(
    {"model": st.just(MODEL), "messages": st.lists(MESSAGE, min_size=1, max_size=3), "max_tokens": MAX_TOKENS},
    optional={
        **SAMPLING,
        "max_completion_tokens": st.integers(1, 4),
        "logprobs": st.booleans(),
        "top_logprobs": st.one_of(st.none(), st.integers(0, 20)),
    },
)
TOKEN_IDS = st.lists(st.integers(0, 200), min_size=1, max_size=8)
COMPLETION_BASE = st.fixed_dictionaries(
    {
        "model": st.just(MODEL),
        "prompt": st.one_of(SHORT_TEXT, TOKEN_IDS, st.lists(SHORT_TEXT, min_size=1, max_size=1), st.sampled_from([[7] * 510, [7] * 511, [7] * 512])),
        "max_tokens": MAX_TOKENS,
    },
    optional={**SAMPLING, "logprobs": st.one_of(st.none(), st.integers(0, 20)), "echo": st.just(False), "suffix": st.none()},
)
CHAT_FIELDS = sorted({"model", "messages", "max_tokens", "max_completion_tokens", "logprobs", "top_logprobs", *SAMPLING})
COMPLETION_FIELDS = sorted({"model", "prompt", "max_tokens", "logprobs", "echo", "suffix", *SAMPLING})


def mutations(fields: list[str], values: st.SearchStrategy = EDGE) -> st.SearchStrategy:
    """0-2 of: a field set to an edge value, removed, repeated (duplicate key) or an unknown key added."""
    name = st.one_of(st.sampled_from(fields), st.sampled_from(fields), st.text(max_size=12))
    one = st.tuples(st.sampled_from(["set", "set", "delete", "dup"]), name, st.one_of(values, st.just(DELETE)))
    return st.lists(one, max_size=2)


def mutate(base: dict, muts: list[tuple[str, str, Any]]) -> Pairs:
    items = list(base.items())
    for op, name, value in muts:
        if op == "dup":
            items.append((name, value))
            continue
        items = [(k, v) for k, v in items if k != name]
        if op == "set" and value is not DELETE:
            items.append((name, value))
    return Pairs(tuple((k, v) for k, v in items if v is not DELETE))


def message_mutation() -> st.SearchStrategy:
    """A message (or the list) at its edges: bad roles, parts, extra keys, too many messages."""
    part = st.one_of(
        PART,
        st.fixed_dictionaries({"type": st.one_of(TEXT, JUNK), "text": st.one_of(TEXT, JUNK)}),
        st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.just({"url": "http://x"})}),
    )
    message = st.fixed_dictionaries(
        {"role": st.one_of(st.sampled_from(ROLES), TEXT, JUNK), "content": st.one_of(TEXT, st.lists(part, max_size=3), JUNK)},
        optional={"name": st.one_of(TEXT, JUNK), "tool_calls": JUNK},
    )
    return st.one_of(
        st.lists(message, min_size=1, max_size=3),
        st.sampled_from([[], [{"role": "user", "content": ""}] * 1024, [{"role": "user", "content": ""}] * 1025, "hi"]),
        st.lists(st.one_of(message, JUNK), min_size=1, max_size=2),
    )


# -- other bodies --------------------------------------------------------------------------------------
VALID_REWARDS = st.sampled_from([0, 1, "up", "down", "0", "1"])
REWARDS = st.one_of(
    VALID_REWARDS,
    VALID_REWARDS,
    st.sampled_from([2, -1, True, False, 1.0, 0.0, -0.0, "UP", " up", "1.0", None, [], {}, 2**64, Raw("1e0"), Raw("NaN")]),
)
COMMENTS = st.one_of(st.none(), st.text(max_size=20), st.just("c" * 4096), st.just("c" * 4097), st.just("a\x00b"), JUNK)
RAW_BODIES = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        [b"", b" ", b"null", b"{}", b"[]", b'"x"', b"{", b"}", b"NaN", b"Infinity", b"\xef\xbb\xbf{}", b"\x00", b"{\"a\":1}\x00",
         b"[" * 30_000, b'{"a":' * 10_000, DIGITS.encode(), ("{" + '"a":1,' * 5000 + '"b":2}').encode()]
    ),
    JUNK.map(lambda v: encode(v).encode()),
)
CONTENT_TYPES = st.sampled_from(
    [None, "application/json", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=zz",
     "application/json; charset=utf-16", "application/octet-stream", "", "*/*", "application/json, application/json"]
)
QUERY_VALUES = st.one_of(
    st.sampled_from(
        ["", "0", "1", "200", "5000", "5001", "-1", "1.5", "1e3", "nan", "NaN", "inf", "-inf", "Infinity", "1e308", "-1e308",
         "1e400", DIGITS, str(2**63), str(-(2**63) - 1), "0x10", " 1", "1 ", "\x00", "\u0661", "true", "[]", "%", "1_000"]
    ),
    st.floats().map(repr),
    st.integers().map(str),
    st.text(max_size=10),
)
