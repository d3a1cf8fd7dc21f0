"""A small synchronous Python client for a liveloop server: chat (whole or streamed), feedback,
versions, and the operator's admin calls. It speaks the same HTTP API as any OpenAI client, plus
liveloop's own routes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx


class LiveloopError(RuntimeError):
    def __init__(self, status: int, body: Any):
        err = body.get("error", {}) if isinstance(body, dict) else {}
        super().__init__(f"HTTP {status}: {err.get('message', body)}")
        self.status = status
        self.body = body


@dataclass
class ChatReply:
    id: str
    text: str
    policy_version: int
    finish_reason: str | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI's shape: id, type, function {name, arguments}

    def message(self) -> dict[str, Any]:
        """The reply as the assistant message the next request's history holds."""
        if self.tool_calls:
            return {"role": "assistant", "content": self.text or None, "tool_calls": self.tool_calls}
        return {"role": "assistant", "content": self.text}


class LiveloopClient:
    def __init__(self, base_url: str = "http://127.0.0.1:8000", api_key: str = "", model: str | None = None, timeout: float = 120):
        self.http = httpx.Client(base_url=base_url.rstrip("/"), headers={"Authorization": f"Bearer {api_key}"}, timeout=timeout)
        self._model = model

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "LiveloopClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self, r: httpx.Response) -> Any:
        try:
            body = r.json()
        except ValueError:
            body = r.text
        if r.status_code >= 400:
            raise LiveloopError(r.status_code, body)
        return body

    @property
    def model(self) -> str:
        if self._model is None:
            self._model = self._check(self.http.get("/v1/models"))["data"][0]["id"]
        return self._model

    def _chat_body(self, messages: list[dict[str, str]], **params: Any) -> dict[str, Any]:
        return {"model": self.model, "messages": messages, "logprobs": True, "return_token_ids": True, **params}

    def chat(self, messages: list[dict[str, str]], **params: Any) -> ChatReply:
        body = self._check(self.http.post("/v1/chat/completions", json=self._chat_body(messages, **params)))
        choice = body["choices"][0]
        return ChatReply(
            id=body["id"],
            text=choice["message"]["content"] or "",
            policy_version=body["policy_version"],
            finish_reason=choice["finish_reason"],
            token_ids=choice.get("token_ids", []),
            logprobs=[e["logprob"] for e in (choice.get("logprobs") or {}).get("content", [])],
            usage=body.get("usage", {}),
            tool_calls=choice["message"].get("tool_calls") or [],
        )

    def stream_chat(self, messages: list[dict[str, str]], **params: Any) -> Iterator[str | ChatReply]:
        """Yields text pieces as they arrive, then the whole `ChatReply`."""
        body = self._chat_body(messages, stream=True, **params)
        reply = ChatReply(id="", text="", policy_version=-1, finish_reason=None)
        with self.http.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code >= 400:
                r.read()
                self._check(r)
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise LiveloopError(500, chunk)
                reply.id, reply.policy_version = chunk["id"], chunk["policy_version"]
                for choice in chunk["choices"]:
                    reply.token_ids += choice.get("token_ids", [])
                    reply.logprobs += [e["logprob"] for e in (choice.get("logprobs") or {}).get("content", [])]
                    reply.finish_reason = choice.get("finish_reason") or reply.finish_reason
                    delta = choice.get("delta", {})
                    _add_calls(reply.tool_calls, delta.get("tool_calls") or [])
                    piece = delta.get("content")
                    if piece:
                        reply.text += piece
                        yield piece
        yield reply

    def feedback(self, response_id: str, reward: int | str, comment: str | None = None) -> dict[str, Any]:
        payload: dict[str, Any] = {"response_id": response_id, "reward": reward}
        if comment:
            payload["comment"] = comment
        return self._check(self.http.post("/v1/feedback", json=payload))

    def versions(self) -> dict[str, Any]:
        return self._check(self.http.get("/v1/versions"))

    # -- operators (admin key) ---------------------------------------------------------------------
    # `segment`: one adapter segment's lineage (`[segments] adapters`); "base" lists the base weights' versions
    def admin_versions(self, segment: str | None = None, limit: int | None = None, before: int | None = None) -> dict[str, Any]:
        """A page of versions: the newest `limit` (the server's default: 200) older than `before`."""
        params = {k: v for k, v in (("segment", segment), ("limit", limit), ("before", before)) if v is not None}
        return self._check(self.http.get("/admin/versions", params=params or None))

    def adapters(self) -> dict[str, Any]:
        return self._check(self.http.get("/admin/adapters"))

    def evaluation(self, version: int) -> dict[str, Any]:
        """The release gate's latest evaluation of `version` (404 evaluation_not_found before it ran)."""
        return self._check(self.http.get(f"/admin/versions/{int(version)}/evaluation"))

    def rollback(self, version: int, reason: str | None = None, segment: str | None = None, expect_serving: int | None = None) -> dict[str, Any]:
        """`expect_serving`: the version you saw serving; refused (409 serving_changed) if another serves now."""
        body: dict[str, Any] = {"version": version, "reason": reason}
        if segment is not None:
            body["segment"] = segment
        if expect_serving is not None:
            body["expect_serving"] = expect_serving
        return self._check(self.http.post("/admin/rollback", json=body))

    def forget_key(self, key_id: str, weights: bool = False, dry_run: bool = False) -> dict[str, Any]:
        """Delete a key's responses and ratings; `weights`: also retrain the lineages it trained without
        it (server/control/forgetting.py); `dry_run` (with weights): only the plan."""
        body = {"weights": True, "dry_run": dry_run} if weights else {}
        return self._check(self.http.post(f"/admin/keys/{key_id}/forget", json=body))

    def set_learning(self, paused: bool, reason: str | None = None, segment: str | None = None) -> dict[str, Any]:
        path = "/admin/learning/pause" if paused else "/admin/learning/resume"
        body: dict[str, Any] = {"reason": reason}
        if segment is not None:
            body["segment"] = segment
        return self._check(self.http.post(path, json=body))

    def drift(self) -> dict[str, Any]:
        return self._check(self.http.get("/admin/drift"))

    def stats(self) -> dict[str, Any]:
        return self._check(self.http.get("/admin/stats"))

    def health(self) -> dict[str, Any]:
        return self._check(self.http.get("/healthz"))


def _add_calls(calls: list[dict[str, Any]], deltas: list[dict[str, Any]]) -> None:
    """Streamed tool-call deltas into whole calls: a call's first delta (its index, id and name), then
    fragments of its arguments."""
    for d in deltas:
        if d.get("id"):
            calls.append({"id": d["id"], "type": "function", "function": {"name": d["function"]["name"], "arguments": ""}})
        calls[d["index"]]["function"]["arguments"] += (d.get("function") or {}).get("arguments") or ""
