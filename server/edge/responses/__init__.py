"""OpenAI's Responses API: POST /v1/responses, conversations kept server-side."""
