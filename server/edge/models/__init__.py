"""The model this server serves: GET /v1/models."""
