"""What an API key may read and delete of its responses: THE rule every route that reads a stored
response or deletes one goes through (chat completions, the Responses API, DELETE /v1/responses/{id}).
Any other key, and an id that does not exist, get the same 404: ids do not leak."""

from __future__ import annotations

import asyncio

from liveloop.server.edge.admission import Admission
from liveloop.server.edge.errors import APIError
from liveloop.server.edge.pipeline.streaming import Generating
from liveloop.server.edge.principal import Principal
from liveloop.server.edge.response_ids import issued
from liveloop.store import StoredConversation
from liveloop.store.conversations import ConversationQueries
from liveloop.store.rights import RightsQueries


def check_response_id(response_id: str, param: str) -> None:
    """A response id as a path holds it: what the store's id column can (1 to 64 characters, no NUL)."""
    if not 0 < len(response_id) <= 64 or "\x00" in response_id:
        raise APIError(400, f"{param}: 1 to 64 characters, no NUL", param=param)


class Ownership:
    """A key's responses: the stored ones it may read (`owned`) and the ones it may delete (`delete`),
    those still being generated included."""

    def __init__(self, conversations: ConversationQueries, rights: RightsQueries, generating: Generating, admission: Admission):
        self.conversations = conversations
        self.rights = rights
        self.generating = generating
        self.admission = admission

    async def owned(self, response_id: str, principal: Principal, endpoints: tuple[str, ...], param: str,
                    what: str, code: str | None = None) -> StoredConversation:
        """The stored conversation of a response of `endpoints` this key received (any other key, or no
        such response, gets the same 404)."""
        self.count_read(principal)
        check_response_id(response_id, param)
        found = await asyncio.to_thread(self.conversations.get, response_id, principal.key_id, endpoints)
        if found is None:
            raise APIError(404, f"no {what} `{response_id}` for this API key", param=param, code=code)
        return found

    def count_read(self, principal: Principal) -> None:
        """One read of this key's stored responses, against its `stored_reads_per_minute` (RateLimited)."""
        self.admission.check_rate("reads", principal.key_id)

    async def delete(self, response_id: str, principal: Principal, param: str) -> int:
        """THE deletion rule, for every route that deletes a response (any endpoint's id): the key that
        received it deletes it with its ratings, also while it is still being generated (a tombstone keeps
        its row out when it lands, store/rights.py); any other key, or an id that does not exist, gets the
        same 404. An id this server never issues (server/edge/response_ids.py) is a 404 before the store
        is touched: no tombstone, no deletion lock. Returns the ratings deleted."""
        self.admission.check_rate("feedback", principal.key_id)
        check_response_id(response_id, param)
        if not issued(response_id):
            raise APIError(404, f"no response `{response_id}` for this API key", param=param)
        # looked at first: a generation that ends meanwhile lands after the tombstone, which drops it
        generating = self.generating.owner(response_id) == principal.key_id
        deleted = await asyncio.to_thread(self.rights.delete_response, response_id, principal.key_id)
        if not deleted.responses and not generating:
            raise APIError(404, f"no response `{response_id}` for this API key", param=param)
        return deleted.ratings
