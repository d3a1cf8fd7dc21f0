"""A context-length refusal on Anthropic's endpoint in Anthropic's words (server/edge/errors.py
`anthropic_too_long`): Claude Code reads "prompt is too long: N tokens > M maximum" to compact."""

from liveloop.server.edge.errors import anthropic_too_long


def test_prompt_past_the_context():
    said = anthropic_too_long("this model's maximum context length is 65536 tokens; the prompt has 76372")
    assert said == "prompt is too long: 76372 tokens > 65536 maximum"


def test_max_tokens_past_the_room():
    said = anthropic_too_long("this model's maximum context length is 512 tokens: 500 in the prompt + 64 max_tokens "
                              "is too many")
    assert said.startswith("input length and `max_tokens` exceed context limit: 500 + 64 > 512")


def test_characters_past_the_bound():
    message = ("this model's maximum context length is 512 tokens; the text and tools have 20000 characters "
               "(at most 16384 are taken)")
    assert anthropic_too_long(message) == f"prompt is too long: {message}"
