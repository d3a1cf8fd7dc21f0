"""The policy versions users may read: GET /v1/versions."""
