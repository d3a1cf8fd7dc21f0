"""Tool-call parsers (server/edge/formats/tool_parsers/): whole replies and streams read the same, per family;
the content's whitespace rule; what stays text; the call formats constrained decoding forces parse
back."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from liveloop.server.edge.formats.tool_parsers import PARSERS, CallDelta, Parsed, StreamDelta, ToolCall, detect_parser

TOOLS = ["get_weather", "search"]
HERMES = PARSERS["hermes"](TOOLS)
LLAMA = PARSERS["llama3_json"](TOOLS)


def shape(parsed: Parsed) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """A result without its random ids."""
    return parsed.content, tuple((c.name, c.arguments) for c in parsed.calls)


def run(parser, pieces: list[str]) -> Parsed:
    """Stream `pieces`, check what went out against the result, and return the result."""
    stream = parser.stream()
    deltas = [stream.feed(p) for p in pieces] + [stream.finish()]
    result = stream.result
    assert "".join(d.text for d in deltas) == (result.content or "")
    sent = [c for d in deltas for c in d.calls]
    assert sorted({c.index for c in sent}) == list(range(len(result.calls)))
    for index, call in enumerate(result.calls):
        mine = [c for c in sent if c.index == index]
        assert (mine[0].id, mine[0].name) == (call.id, call.name)
        assert call.id.startswith("call_") and len(call.id) == 29 and call.id[5:].isalnum()
        assert all(c.id is None and c.name is None for c in mine[1:])
        assert "".join(c.arguments for c in mine) == call.arguments
    return result


def split(text: str, cuts: list[int]) -> list[str]:
    points = [0, *sorted(c % (len(text) + 1) for c in cuts), len(text)]
    return [text[a:b] for a, b in zip(points, points[1:])]


def call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def assert_streams_alike(parser, text: str) -> None:
    """One piece, one character at a time and random splits all read as the whole text parses."""
    whole = shape(run(parser, [text]))
    assert shape(run(parser, list(text))) == whole
    rng = random.Random(text)
    for _ in range(5):
        assert shape(run(parser, split(text, [rng.randrange(len(text) + 1) for _ in range(4)]))) == whole


# -- hermes, whole texts --------------------------------------------------------------------------

HERMES_CASES = [
    ("Hello there.", "Hello there.", ()),
    ("", None, ()),
    (call("get_weather", '{"city": "Oslo"}'), None, (("get_weather", '{"city": "Oslo"}'),)),
    ('<tool_call>{"name":"search","arguments":{"q":"x"}}</tool_call>', None, (("search", '{"q":"x"}'),)),
    (
        '<tool_call> \n { "name" : "search" ,\n"arguments"\t:  {"q": 1} \n} </tool_call>',
        None,
        (("search", '{"q": 1}'),),
    ),
    (
        call("get_weather", '{"city": "Oslo"}') + "\n" + call("search", '{"q": "rain"}'),
        None,
        (("get_weather", '{"city": "Oslo"}'), ("search", '{"q": "rain"}')),
    ),
    ("Let me check.\n" + call("search", "{}"), "Let me check.", (("search", "{}"),)),
    (  # `}` and the closing tag inside a string do not end the call
        call("search", r'{"q": "a \"}\" </tool_call> b"}'),
        None,
        (("search", r'{"q": "a \"}\" </tool_call> b"}'),),
    ),
    (call("search", '{"a": [1, {"b": "]}"}], "c": {}}'), None, (("search", '{"a": [1, {"b": "]}"}], "c": {}}'),)),
    (call("search", '"just text"'), None, (("search", '"just text"'),)),
    (call("search", "[1, 2]"), None, (("search", "[1, 2]"),)),
    (call("search", "-1.5e3"), None, (("search", "-1.5e3"),)),
    (call("search", "true"), None, (("search", "true"),)),
    (call("search", "null"), None, (("search", "null"),)),
    ('<tool_call>{"name": "se\\u0061rch", "arguments": {}}</tool_call>', None, (("search", "{}"),)),
    (  # keys in the other order
        '<tool_call>{"arguments": {"q": "x"}, "name": "search"}</tool_call>',
        None,
        (("search", '{"q": "x"}'),),
    ),
]

HERMES_TEXT = [
    "<tool_call>hello</tool_call>",
    "use <tool_call> tags",
    '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',  # unknown name
    '<tool_call>{"arguments": {}, "name": "nope"}</tool_call>',
    '<tool_call>{"name": "search", "arguments": {"q": }}</tool_call>',  # arguments not JSON
    '<tool_call>{"name": "search", "arguments": {"q": "x"}}',  # no closing tag
    '<tool_call>{"name": "search", "arguments": {"q": "x"}</tool_call>',  # no closing brace
    '<tool_call>{"name": "search", "arguments": {"q": "x"}, "n": 1}</tool_call>',  # another key
    '<tool_call>{"name": "search", "arguments": }</tool_call>',
    '<tool_call>{"name": "search", "arguments": {"q": "x</tool_call>',
    '<tool_call>{"name": "search", "args": {}}</tool_call>',
    '<tool_call>{"id": 1, "name": "search", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "search", "arguments": {}, "name": "search"}</tool_call>',
    '<tool_call>{"arguments": {}, "name": "search", "name": "search"}</tool_call>',  # a key twice
    '<tool_call>{"arguments": {}, "name": "search", "x": 1}</tool_call>',
    '<tool_call>{"arguments": {}, "name": 3}</tool_call>',
]


@pytest.mark.parametrize(("text", "content", "calls"), HERMES_CASES)
def test_hermes_parses(text, content, calls):
    assert shape(HERMES.parse(text)) == (content, calls)
    assert_streams_alike(HERMES, text)


@pytest.mark.parametrize("text", HERMES_TEXT)
def test_hermes_what_is_not_a_whole_valid_call_stays_text(text):
    assert shape(HERMES.parse(text)) == (text, ())


def test_a_valid_call_after_a_malformed_one_is_still_a_call():
    bad = '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
    assert shape(HERMES.parse(bad + "\n" + call("search", "{}"))) == (bad, (("search", "{}"),))
    assert shape(HERMES.parse("<tool_call>" + call("search", "{}"))) == ("<tool_call>", (("search", "{}"),))


def test_calls_of_names_not_offered_are_never_calls():
    text = call("search", "{}")
    assert shape(PARSERS["hermes"]([]).parse(text)) == (text, ())
    assert shape(run(PARSERS["hermes"](["get_weather"]), list(text))) == (text, ())
    assert shape(PARSERS["llama3_json"](["other"]).parse('{"name": "search", "parameters": {}}'))[1] == ()


# -- the whitespace rule --------------------------------------------------------------------------

C = call("search", "{}")


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ("Let me check.\n" + C, "Let me check."),  # whitespace before a call
        (C + "\nDone.", "Done."),  # after a call, with no content before it
        ("A\n" + C + "\nB", "A\nB"),  # between content and text after: stays, as the separator
        ("A \n" + C + "\n" + C + " B  ", "A B  "),
        ("A\n" + C + "\n", "A"),  # after the last call
        (C + "\n" + C, None),
        (C + "  \n ", None),
        ("  hi  ", "  hi  "),  # no call: the text as it is
        ("A" + C + "B", "AB"),
    ],
)
def test_content_drops_the_whitespace_next_to_calls(text, content):
    assert HERMES.parse(text).content == content
    assert run(HERMES, list(text)).content == content  # a stream sends exactly that text


# -- llama3_json, whole texts ---------------------------------------------------------------------

LLAMA_CASES = [
    ("The weather is nice.", "The weather is nice.", ()),
    ('{"name": "get_weather", "parameters": {"city": "Oslo"}}', None, (("get_weather", '{"city": "Oslo"}'),)),
    ('<|python_tag|>{"name": "search", "parameters": {"q": "x"}}', None, (("search", '{"q": "x"}'),)),
    (' \n<|python_tag|> {"name":"search","parameters":{}}', None, (("search", "{}"),)),
    (
        '{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "search", "parameters": {"q": "rain"}}',
        None,
        (("get_weather", '{"city": "Oslo"}'), ("search", '{"q": "rain"}')),
    ),
    ('{"name": "search", "parameters": {"q": "a \\"}\\" ; b"}}', None, (("search", '{"q": "a \\"}\\" ; b"}'),)),
    ('{"name": "search", "parameters": [1, "x"]}', None, (("search", '[1, "x"]'),)),
    ('{"name": "search", "parameters": 7}', None, (("search", "7"),)),
    ('{"name": "search", "arguments": {"q": "x"}}', None, (("search", '{"q": "x"}'),)),  # vLLM reads both keys
    ('{"parameters": {"q": "x"}, "name": "search"}', None, (("search", '{"q": "x"}'),)),
    ('{"name": "search", "parameters": {}}\nThat is all.', "That is all.", (("search", "{}"),)),
]

LLAMA_TEXT = [
    'Sure: {"name": "search", "parameters": {}}',  # not at the start
    '{"name": "nope", "parameters": {}}',
    '{"name": "search", "parameters": {"q": }}',
    '{"name": "search", "parameters": {"q": "x"}',
    '{"name": "search", "parameters": {}, "x": 1}',
    '{"q": 1}',
    "<|python_tag|>print(1)",
    "<|python",
    "",
]


@pytest.mark.parametrize(("text", "content", "calls"), LLAMA_CASES)
def test_llama3_json_parses(text, content, calls):
    assert shape(LLAMA.parse(text)) == (content, calls)
    assert_streams_alike(LLAMA, text)


@pytest.mark.parametrize("text", LLAMA_TEXT)
def test_llama3_json_what_is_not_a_whole_valid_call_stays_text(text):
    assert shape(LLAMA.parse(text)) == (text or None, ())


# -- streaming ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", HERMES_TEXT + [t for t, _, _ in HERMES_CASES])
def test_hermes_streams_read_alike_however_split(text):
    assert_streams_alike(HERMES, text)


@pytest.mark.parametrize("text", LLAMA_TEXT + [t for t, _, _ in LLAMA_CASES])
def test_llama3_json_streams_read_alike_however_split(text):
    assert_streams_alike(LLAMA, text)


def test_a_stream_holds_back_only_what_could_start_a_call():
    s = HERMES.stream()
    assert s.feed("Hello <tool_c").text == "Hello"  # the space too: it would go if a call followed
    assert s.feed("all>") == StreamDelta("", ())
    assert s.feed('{"name": "sea') == StreamDelta("", ())  # undecided: nothing
    s = HERMES.stream()
    s.feed("Hi <tool_call>")
    assert s.feed('{"name": "nope"').text == ' <tool_call>{"name": "nope"'  # an unknown name: text at once
    assert s.feed(", x").text == ", x"
    s = HERMES.stream()
    assert s.feed("a <tool").text == "a"
    assert s.feed("box>").text == " <toolbox>"
    s = HERMES.stream()  # a name string longer than any offered name's could be is text before it closes
    assert s.feed('<tool_call>{"name": "' + "x" * 200).text.startswith("<tool_call>")


def test_a_call_goes_out_as_its_head_completes_then_its_arguments_as_they_arrive():
    s = HERMES.stream()
    first = s.feed('OK\n<tool_call>\n{"name": "search", "arguments": ')
    assert first.text == "OK"
    (head,) = first.calls
    assert (head.index, head.name, head.arguments) == (0, "search", "") and head.id.startswith("call_")
    assert s.feed('{"q": "ab').calls == (CallDelta(0, None, None, '{"q": "ab'),)
    assert s.feed('c"}').calls == (CallDelta(0, None, None, 'c"}'),)
    assert s.feed("}\n</tool_call>\n").calls == ()
    second = s.feed('<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>')
    assert [(c.index, c.name, c.arguments) for c in second.calls] == [(1, "get_weather", "{}")]
    assert s.finish() == StreamDelta("", ())
    assert s.result == Parsed("OK", (ToolCall(head.id, "search", '{"q": "abc"}'), ToolCall(second.calls[0].id, "get_weather", "{}")))


def test_a_bare_number_goes_out_once_its_end_shows():
    s = HERMES.stream()
    s.feed('<tool_call>{"name": "search", "arguments": 12')
    assert s.feed("3").calls == ()
    assert s.feed(" }").calls == (CallDelta(0, None, None, "123"),)


def test_keys_in_the_other_order_are_held_then_sent_whole():
    text = '<tool_call>{"arguments": {"q": "x"}, "name": "search"}\n</tool_call>'
    s = HERMES.stream()
    deltas = [s.feed(ch) for ch in text] + [s.finish()]
    sent = [c for d in deltas for c in d.calls]
    assert len(sent) == 1 and (sent[0].name, sent[0].arguments) == ("search", '{"q": "x"}') and sent[0].id
    assert "".join(d.text for d in deltas) == ""


def test_llama3_json_holds_back_the_message_start_only():
    s = LLAMA.stream()
    assert s.feed(" ").text == ""
    assert s.feed("<|py").text == ""
    assert s.feed("x {").text == " <|pyx {"
    s = LLAMA.stream()
    assert s.feed('{"na').text == ""
    assert s.feed('me": "search", "parameters": {}}').calls[0].name == "search"
    s = LLAMA.stream()
    assert s.feed("Hi").text == "Hi"


def test_an_unfinished_call_stays_in_a_streams_result_but_not_in_a_parse():
    for text, arguments in [
        ('<tool_call>{"name": "search", "arguments": {"q": "ab', '{"q": "ab'),
        ('<tool_call>{"name": "search", "arguments": 12', "12"),
        ('<tool_call>{"name": "search", "arguments": {}}\n</tool_', "{}"),
        ('<tool_call>{"name": "search", "arguments": ', ""),
    ]:
        assert shape(run(HERMES, list(text))) == (None, (("search", arguments),))
        assert shape(HERMES.parse(text)) == (text, ())
    assert shape(run(LLAMA, ['{"name": "search", "parameters": {"q"'])) == (None, (("search", '{"q"'),))


def test_what_follows_a_calls_arguments_that_is_not_its_end_is_text():
    text = '<tool_call>{"name": "search", "arguments": {"q": 1}, "x": 2}</tool_call>'
    assert shape(run(HERMES, list(text))) == (', "x": 2}</tool_call>', (("search", '{"q": 1}'),))
    assert shape(HERMES.parse(text)) == (text, ())


# -- properties -----------------------------------------------------------------------------------

NAMES = st.from_regex(r"[a-z_][a-z0-9_]{0,15}", fullmatch=True)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
WS = st.sampled_from(["", " ", "\n", " \n\t "])
CUTS = st.lists(st.integers(min_value=0, max_value=10_000), max_size=8)
FREE_TEXT = st.text(max_size=20).filter(lambda t: "<tool_call>" not in t)


@st.composite
def rendered_call(draw, key: str) -> tuple[str, str, object, str]:
    """(name, arguments text, value, the call object as a model might write it)."""
    name, value = draw(NAMES), draw(VALUES)
    arguments = json.dumps(value, ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, 1])))
    w = [draw(WS) for _ in range(9)]
    obj = f'{w[0]}{{{w[1]}"name"{w[2]}:{w[3]}{json.dumps(name)}{w[4]},{w[5]}"{key}"{w[6]}:{w[7]}{arguments}{w[8]}}}'
    return name, arguments, value, obj


def expected_content(before: str, after: str) -> str | None:
    """The whitespace rule for `before <calls> after`."""
    kept = before.rstrip()
    if after.strip():
        kept += after if kept else after.lstrip()
    return kept or None


def check_calls(parser, text: str, calls, content: str | None, cuts: list[int]) -> None:
    parsed = parser.parse(text)
    assert parsed.content == content
    assert [(c.name, c.arguments) for c in parsed.calls] == [(n, a) for n, a, _, _ in calls]
    assert [json.loads(c.arguments) for c in parsed.calls] == [v for _, _, v, _ in calls]
    assert shape(run(parser, split(text, cuts))) == shape(parsed)


@settings(max_examples=200, deadline=None)
@given(st.lists(rendered_call("arguments"), min_size=1, max_size=3), FREE_TEXT, FREE_TEXT, WS, WS, CUTS)
def test_hermes_recovers_every_call_however_streamed(calls, before, after, gap, end_gap, cuts):
    blocks = [f"<tool_call>{obj}{end_gap}</tool_call>" for _, _, _, obj in calls]
    text = before + gap.join(blocks) + after
    parser = PARSERS["hermes"]({n for n, _, _, _ in calls})
    check_calls(parser, text, calls, expected_content(before, after), cuts)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(rendered_call("parameters"), min_size=1, max_size=3),
    st.sampled_from(["", " ", "\n", "<|python_tag|>", " <|python_tag|>\n"]),
    FREE_TEXT,
    WS,
    CUTS,
)
def test_llama3_json_recovers_every_call_however_streamed(calls, lead, after, gap, cuts):
    text = lead + f"{gap};{gap}".join(obj for _, _, _, obj in calls) + after
    parser = PARSERS["llama3_json"]({n for n, _, _, _ in calls})
    check_calls(parser, text, calls, expected_content("", after), cuts)


PIECES = [
    "<tool_call>", "</tool_call>", "<|python_tag|>", "{", "}", "[", "]", '"name"', '"arguments"',
    '"parameters"', ":", ",", ";", '"f"', '"g"', '"h"', " ", "\n", "\\", '"', "1", "true", "x", "<", "é",
]
TEXTS = st.one_of(st.text(max_size=60), st.lists(st.sampled_from(PIECES), max_size=30).map("".join))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(PARSERS)), TEXTS, CUTS)
def test_any_text_reads_alike_however_split_and_never_raises(family, text, cuts):
    parser = PARSERS[family](["f", "g"])
    assert shape(run(parser, split(text, cuts))) == shape(run(parser, [text]))
    parsed = parser.parse(text)
    for c in parsed.calls:
        assert c.name in ("f", "g")
        json.loads(c.arguments)
    if not parsed.calls:
        assert parsed.content == (text or None)  # nothing lost, nothing stripped


# -- call formats ---------------------------------------------------------------------------------

def test_call_formats_write_each_familys_syntax():
    from liveloop.server.edge.formats.tools import json_format

    content = json_format({"type": "object"}, "canonical")
    fmt = HERMES.call_format('we"ird', content)
    assert (fmt.begin, fmt.end, fmt.content) == ('<tool_call>\n{"name": "we\\"ird", "arguments": ', "}\n</tool_call>", content)
    fmt = LLAMA.call_format("search", content)
    assert (fmt.begin, fmt.end) == ('{"name": "search", "parameters": ', "}")
    assert (HERMES.separator, LLAMA.separator) == ("\n", "; ")


SCHEMAS = {
    "search": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    'we"ird': {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
}


@pytest.mark.parametrize("family", sorted(PARSERS))
def test_a_call_the_format_accepts_parses_back(family):
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.structural_tag import StructuralTag, TagsWithSeparatorFormat
    from xgrammar.testing import _is_grammar_accept_string

    from liveloop.server.edge.formats.tools import json_format

    parser = PARSERS[family](SCHEMAS)
    tags = [parser.call_format(name, json_format(schema, "canonical")) for name, schema in SCHEMAS.items()]
    tag = StructuralTag(format=TagsWithSeparatorFormat(tags=tags, separator=parser.separator, at_least_one=True))
    grammar = xgr.Grammar.from_structural_tag(tag.model_dump_json())

    def written(name: str, arguments: str) -> str:
        fmt = parser.call_format(name, json_format(SCHEMAS[name], "canonical"))
        return fmt.begin + arguments + fmt.end

    one = written("search", '{"q": "a \\"}\\" </tool_call> b"}')
    two = one + parser.separator + written('we"ird', '{"n": 3}')
    for text, calls in [
        (one, [("search", '{"q": "a \\"}\\" </tool_call> b"}')]),
        (two, [("search", '{"q": "a \\"}\\" </tool_call> b"}'), ('we"ird', '{"n": 3}')]),
    ]:
        assert _is_grammar_accept_string(grammar, text)
        assert shape(parser.parse(text)) == (None, tuple(calls))
        assert shape(run(parser, list(text))) == (None, tuple(calls))
    assert not _is_grammar_accept_string(grammar, written("search", '{"q": 3}'))
    assert not _is_grammar_accept_string(grammar, "")


@pytest.mark.parametrize(
    ("template", "family"),
    [
        ("{% for tool in tools %}<tool_call>{{ tool }}</tool_call>{% endfor %}", "hermes"),
        ("{{- '<|python_tag|>' }}", "llama3_json"),
        ('{%- if message.role == "ipython" %}{{ "parameters" }}', "llama3_json"),
        ("{{ messages }}", None),
        ("", None),
        (None, None),
    ],
)
def test_detect_parser(template, family):
    assert detect_parser(template) == family
