"""Formats: tool use and structured output (the constraint, the per-family call parsers) and the body
shapes OpenAI's chat and completions share."""
