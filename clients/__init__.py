"""Clients that speak HTTP only: a small Python client (`client.LiveloopClient`), the interactive
`liveloop chat` CLI, and simulated users (`simulator`, driven by a `scenario` and a `judge`)."""

from liveloop.clients.client import ChatReply, LiveloopClient, LiveloopError

__all__ = ["ChatReply", "LiveloopClient", "LiveloopError"]
