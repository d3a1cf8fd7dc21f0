"""OpenAI chat completions: POST /v1/chat/completions and the stored chat completions of a key."""
