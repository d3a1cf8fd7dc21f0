"""Clients that speak HTTP only: a small Python client (`client.LiveloopClient`) and the interactive
`liveloop chat` CLI. (Simulated users and operator tools come later.)"""

from liveloop.clients.client import ChatReply, LiveloopClient, LiveloopError

__all__ = ["ChatReply", "LiveloopClient", "LiveloopError"]
