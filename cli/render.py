"""How run events read on a terminal; shared by ``troupe run`` and ``troupe exec``."""

from __future__ import annotations

from typing import Any

from protocol import events as ev


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


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
        if "epoch" in payload:
            total = f"/{payload['epochs']}" if "epochs" in payload else ""
            name = "loss" if payload.get("name") == "train_loss" else payload.get("name")
            return f"    {node}  epoch {payload['epoch']}{total}  {name}={_number(payload.get('value'))}"
        return f"    {node}  {payload.get('name')}={_number(payload.get('value'))}  step {payload.get('step')}"
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
