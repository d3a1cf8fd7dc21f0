"""Operations: GET /healthz and GET /metrics."""
