"""Token in, token out: a resent conversation keeps the tokens the model sampled (docs/design.md,
"Episodes").

An agent on Chat Completions or Messages resends the whole conversation, its earlier replies as text.
Re-tokenizing that text often gives other tokens than the ones sampled (a grammar-constrained call
writes `{` then `"`, the tokenizer merges them into `{"`): the prompt would then not carry the sampled
tokens, the turns could not be one rollout, and the model would be asked to continue a text it never
wrote token by token. So before a chat prompt is tokenized, the server looks for the longest earlier
turn of the same key whose prompt text and reply text the rendered text starts with (hashes at the
places a stop token's text starts, one indexed store read), checks it by decoding those tokens, and
then takes its prompt and sampled tokens as they are and tokenizes only the rest. The store's linking
(store/episode_links.py) then finds them exactly. An earlier turn comes back as an assistant message,
so a conversation without one carries none and is not looked up (`carries`): a first turn costs no
store read.

A turn's text hash is its prompt's text and its sampled tokens' text without a final stop token (the
template writes its own end marker after a reply). Nothing is reused when the store cannot be read
(counted in `server/splice_failures`; the prompt is tokenized whole, as without this), when the
decoded tokens differ from the text (a tokenizer whose decoding does not give the text back), or for
/v1/completions (its client owns its tokens: it can send ids).

What a client typed of the model's special tokens is tokenized as text, in the prompt tokenized whole
and in the rest after a carried turn alike (server/edge/pipeline/markers.py); a turn whose tokens hold
more special ids than the template wrote (one stored with a forged turn) is not carried."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from liveloop.server.edge.pipeline.markers import Markers, PromptText
from liveloop.store.linking import text_candidates, text_hash, trimmed

log = logging.getLogger(__name__)

# (key id, text hashes longest first) -> (the hash found, its prompt ids, its sampled ids) or None
CarriedTurn = Callable[[str, Sequence[int]], tuple[int, np.ndarray, np.ndarray] | None]


def carries(messages: Sequence[dict[str, Any]]) -> bool:
    """Whether a conversation can carry an earlier served turn: that turn comes back as an assistant
    message, so a conversation without one carries none (and costs no store read)."""
    return any(m.get("role") == "assistant" for m in messages)


class Splicer:
    def __init__(self, tokenizer: Any, stop_ids: Sequence[int], find: CarriedTurn | None, metrics: Any = None):
        self.tokenizer, self.stop_ids, self.find, self.metrics = tokenizer, tuple(stop_ids), find, metrics
        self.markers = tuple(t for t in tokenizer.convert_ids_to_tokens(list(self.stop_ids)) if t)
        self.specials = Markers(tokenizer)

    def prompt_ids(self, text: str | PromptText, key_id: str | None) -> list[int]:
        """`text`'s tokens: the longest earlier turn it carries as that turn's own tokens, the rest
        tokenized (a PromptText's typed markers as text; a str has none)."""
        prompt = text if isinstance(text, PromptText) else PromptText(text)
        whole = lambda: self.specials.ids(prompt)  # noqa: E731
        if self.find is None or key_id is None:
            return whole()
        candidates = text_candidates(prompt.text, self.markers)
        if not candidates:
            return whole()
        try:
            found = self.find(key_id, [h for _, h in reversed(candidates)])
        except Exception as exc:  # the store is down or slow: serve, tokenized as without this
            log.warning("splice: the store could not be read (%s): the prompt is tokenized whole", exc)
            if self.metrics is not None:
                self.metrics.inc("server/splice_failures")
            return whole()
        if found is None:
            return whole()
        h, prompt_ids, response = found
        ids = self.continued(prompt, prompt_ids, response)
        if ids is None or len(ids) < len(prompt_ids):
            return whole()  # a hash collision, or a tokenizer whose decoding does not give the text back
        if self.metrics is not None:
            self.metrics.inc("server/splices")
        return ids

    def continued(self, text: str | PromptText, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> list[int] | None:
        """`text`'s tokens as the continuation of a turn (its prompt and sampled tokens, a final stop token
        left out) when `text` starts with what those tokens decode to and they hold no typed marker as a
        special token; else None."""
        prompt = text if isinstance(text, PromptText) else PromptText(text)
        carried = [int(t) for t in prompt_ids] + [int(t) for t in response_ids[: trimmed(response_ids, self.stop_ids)]]
        head = self.tokenizer.decode(carried, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if not prompt.text.startswith(head):
            return None
        if self.specials.forges(carried, prompt.head(len(head))):
            return None
        return carried + self.specials.ids(prompt.tail(len(head)))

    def text_hash(self, prompt_text: str | None, response_ids: Sequence[int]) -> int | None:
        """A served turn's text hash (None: a prompt without text, a completion's ids)."""
        if prompt_text is None:
            return None
        reply = self.tokenizer.decode(list(response_ids[: trimmed(response_ids, self.stop_ids)]),
                                      skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return text_hash(prompt_text + reply)
