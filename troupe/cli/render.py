"""How run events read on a terminal, shared by ``troupe run`` and ``troupe exec``; and
how any text the server holds is printed."""

from __future__ import annotations

import re
from typing import Any

from troupe.protocol import events as ev

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: Any) -> str:
    """``text`` with each control character written out (``\\x1b``): a name or a note
    that someone else typed never moves the cursor, clears the screen or sets the
    clipboard of the terminal that lists it (rows stored before names were checked, a
    note, an error that quotes what it refused)."""
    return _CONTROL.sub(lambda found: found.group().encode("unicode_escape").decode("ascii"), str(text))


def output_form(quiet: bool, as_json: bool, plain: str, ids: str = "quiet") -> str:
    """What a command prints: ids alone (``quiet``: the form named ``ids``), JSON, or
    ``plain`` (its text or table). Both asked for is a usage mistake (exit 2), not one of
    them chosen silently."""
    if quiet and as_json:
        from troupe.cli.errors import BadOption

        raise BadOption("-q/--quiet and --json each choose what is printed; give one of them")
    return ids if quiet else "json" if as_json else plain


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _value(payload: dict[str, Any]) -> str:
    return str(payload["non_finite"]) if payload.get("value") is None and "non_finite" in payload \
        else _number(payload.get("value"))


class Renderer:
    """Lines for a person to follow, with one line per epoch that carries every metric of
    that epoch (``trainer  epoch 3/10  loss=0.1235  val_loss=0.1302``): the metrics of an
    epoch are held until an event that is not one of them arrives."""

    def __init__(self) -> None:
        self._epoch: tuple[Any, Any] | None = None  # (node, epoch) being gathered
        self._head = ""
        self._parts: list[str] = []

    def feed(self, event: dict[str, Any]) -> list[str]:
        node, payload = event.get("node_id"), event.get("payload") or {}
        if event["type"] == ev.METRIC and "epoch" in payload:
            lines = [] if self._epoch in (None, (node, payload["epoch"])) else self.flush()
            if self._epoch is None:
                self._epoch = (node, payload["epoch"])
                total = f"/{payload['epochs']}" if "epochs" in payload else ""
                self._head = f"    {node}  epoch {payload['epoch']}{total}"
            name = "loss" if payload.get("name") == "train_loss" else payload.get("name")
            self._parts.append(f"{name}={_value(payload)}")
            return lines
        line = render_event(event)
        return [*self.flush(), *([line] if line else [])]

    def flush(self) -> list[str]:
        if self._epoch is None:
            return []
        line = "  ".join([self._head, *self._parts])
        self._epoch, self._parts = None, []
        return [line]


def render_event(event: dict[str, Any]) -> str | None:
    """One line for the events a person follows, None for the rest."""
    kind, node, payload = event["type"], event.get("node_id"), event.get("payload") or {}
    if kind == ev.RUN_STARTED:
        return "  ▸ started"
    if kind == ev.NODE_FINISHED:
        return f"  ✓ {node}"
    if kind == ev.NODE_FAILED:
        return f"  ✗ {node}  {payload.get('error', '')}"
    if kind == ev.METRIC:
        return f"    {node}  {payload.get('name')}={_value(payload)}  step {payload.get('step')}"
    if kind == ev.LOG:
        return f"    {node}  {payload.get('message', '')}"
    if kind == ev.WARNING:
        return f"  ⚠ {payload.get('message', '')}"
    if kind == ev.RUN_FINISHED:
        status = payload.get("status")
        if status == ev.SUCCEEDED:
            return "  ✓ run complete"
        return f"  ✗ run {status}: {payload.get('error') or ''}".rstrip(": ")
    return None


def size_text(size: int | None) -> str:
    """A file's size as a person reads it (decimal units: 1.5 MB); ``-`` for none known."""
    if size is None:
        return "-"
    value, unit = float(size), "B"
    for bigger in ("KB", "MB", "GB"):
        if value < 1000:
            break
        value, unit = value / 1000, bigger
    return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
