"""Which node the running thread (or task) executes: set by the engine around each
node's call, read by whatever logs on a node's behalf (the console's routed streams, a
helper's events). Its own module so that the console and the execution context both
read it without importing each other."""

from __future__ import annotations

import contextvars

running_node: contextvars.ContextVar[str | None] = contextvars.ContextVar("troupe_node_id", default=None)


def current_node_id() -> str | None:
    """The id of the node executing in this thread, for helpers that log on its behalf."""
    return running_node.get()
