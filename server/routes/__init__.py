"""HTTP routes, one module per audience: OpenAI-compatible generation, feedback, operations, admin."""
