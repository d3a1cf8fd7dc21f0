"""Tool calls in what a model wrote, per model family (vLLM's `--tool-call-parser`): each family's
call syntax, read out of a whole reply (`ToolParser.parse`) or incrementally from a stream
(`ToolParser.stream`, in OpenAI's delta shape), and written as the xgrammar structural-tag format of
one call (`ToolParser.call_format`), so constrained decoding can force a call in exactly that syntax.

    parser = PARSERS["hermes"](["get_weather"])
    parser.parse('Let me check.\\n<tool_call>\\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\\n</tool_call>')
    # Parsed(content='Let me check.', calls=(ToolCall(id='call_...', name='get_weather', arguments='{"city": "Oslo"}'),))

`base.py` the parser base class and the registry by name (`detect_parser`: how `auto` picks), one
module per family (`hermes.py`, `llama3_json.py`), `stream.py` the incremental reading,
`json_text.py` the JSON text read by hand, `results.py` what comes out.

Knows nothing of requests, schemas' meaning, tokenizers or HTTP: which family a model writes comes
from its chat template (`detect_parser`) or the configuration, which tools may be called from the
caller."""

from liveloop.server.edge.formats.tool_parsers.base import PARSERS, ToolParser, detect_parser

# Each family registers itself when its module is imported, in the order detect_parser tries them.
from liveloop.server.edge.formats.tool_parsers.hermes import HermesParser
from liveloop.server.edge.formats.tool_parsers.llama3_json import Llama3JsonParser  # noqa: F401 - registers
from liveloop.server.edge.formats.tool_parsers.results import CallDelta, Parsed, StreamDelta, ToolCall
from liveloop.server.edge.formats.tool_parsers.stream import ToolStream

__all__ = [
    "PARSERS",
    "CallDelta",
    "HermesParser",
    "Parsed",
    "StreamDelta",
    "ToolCall",
    "ToolParser",
    "ToolStream",
    "detect_parser",
]
