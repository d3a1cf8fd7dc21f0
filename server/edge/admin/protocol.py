"""The admin API's request bodies (server/edge/admin/routes.py): swaps, rollbacks, pauses, forgetting and
quarantining keys."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from liveloop.server.edge.protocol import INT32_MAX, Text, _Strict


class SwapRequest(_Strict):
    path: Annotated[Text, Field(min_length=1, max_length=4096)]
    note: Annotated[Text, Field(max_length=1000)] | None = None


Segment = Annotated[Text, Field(min_length=1, max_length=256)]  # an adapter segment's name (`[learner] segments`)


class RollbackRequest(_Strict):
    version: Annotated[int, Field(ge=0, le=INT32_MAX)]
    reason: Annotated[Text, Field(max_length=1000)] | None = None
    segment: Segment | None = None  # move this segment's adapter lineage only (to a base version: no adapter)
    # the version the operator saw serving (that lineage): 409 serving_changed if another serves now
    expect_serving: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None


class PauseRequest(_Strict):
    reason: Annotated[Text, Field(max_length=1000)] | None = None
    segment: Segment | None = None  # pause or resume this segment's lane only


class ForgetRequest(_Strict):
    weights: bool = False  # also roll the key's training out of the weights (server/control/forgetting.py)
    dry_run: bool = False  # with weights: only report what it would do

    @model_validator(mode="after")
    def _dry_run_needs_weights(self) -> "ForgetRequest":
        if self.dry_run and not self.weights:
            raise ValueError("dry_run: only a forget with weights: true has a plan to report")
        return self


class QuarantineRequest(_Strict):
    reason: Annotated[Text, Field(max_length=1000)] | None = None
