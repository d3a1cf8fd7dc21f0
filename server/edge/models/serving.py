"""GET /v1/models' handler: the one model this server serves, with the policy version serving now."""

from __future__ import annotations

from typing import Any

from liveloop.server.edge.errors import APIError
from liveloop.server.edge.pipeline.serving import Serving


class ServingModels:
    """The served model as OpenAI's model object (`created`: when this server started)."""

    def __init__(self, serving: Serving, started_at: int):
        self.serving = serving
        self.started_at = started_at

    def model(self) -> dict[str, Any]:
        serving = self.serving
        return {
            "id": serving.model_name,
            "object": "model",
            "created": self.started_at,
            "owned_by": "liveloop",
            "max_model_len": serving.max_model_len,
            "policy_version": serving.engine.version,
        }

    def listed(self) -> dict[str, Any]:
        return {"object": "list", "data": [self.model()]}

    def named(self, model_id: str) -> dict[str, Any]:
        if model_id != self.serving.model_name:
            raise APIError(404, f"the model `{model_id}` does not exist", param="model", code="model_not_found")
        return self.model()
