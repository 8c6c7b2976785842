"""A run's metrics as a streamed reply, JSON or CSV, read a page of points at a time.

The reply is the text one ``json_reply`` of every point would have been (the same
order, separators and non-finite marks), written as it is read: the server holds one
page, not the run. A run of 4,000,000 points, read whole, answered 503 after the read's
deadline, peaked at 1.7 GiB and kept 1.4 GiB after (issue 62). A page is a store read of
its own, so the store's thread serves other reads between pages.

Once the status line has gone, an error can no longer be a JSON error: the connection
is dropped mid-body instead, which every client sees as a cut reply (no final chunk),
never as a shorter, whole-looking one.
"""

from __future__ import annotations

import asyncio
import csv
import io
import logging
from collections.abc import AsyncIterator
from json.encoder import encode_basestring_ascii
from math import isfinite

from aiohttp import web

from troupe.actors.store.metric_pages import MetricPage, MetricSeries, PointRow
from troupe.protocol import jsonsafe
from troupe.web.context import Services

log = logging.getLogger("troupe.web")

PAGE_POINTS = 20_000  # about 2 MB of reply and 5 MB of Python objects while it is written


async def stream_metrics(request: web.Request, svc: Services, run_id: str, as_csv: bool) -> web.StreamResponse:
    """The whole reply of ``GET /api/runs/{id}/metrics`` without ``lineage``; the run is
    known to exist. Its first page is read before the status line goes: a small run's
    reply (one page) still fails whole, as a JSON error (a damaged page: 503)."""
    names, until = await svc.store.read(MetricSeries(run_id))
    chunks = (_csv if as_csv else _json)(svc, run_id, names, until)
    first = await anext(chunks)
    response = web.StreamResponse()
    response.content_type = "text/csv" if as_csv else "application/json"
    response.charset = "utf-8"
    if as_csv:
        response.headers["Content-Disposition"] = f'attachment; filename="{run_id}-metrics.csv"'
    await response.prepare(request)
    try:
        async with asyncio.timeout(svc.settings.stream_write_timeout_s):  # a reader that stops holds nothing
            await response.write(first.encode())
        async for chunk in chunks:
            async with asyncio.timeout(svc.settings.stream_write_timeout_s):
                await response.write(chunk.encode())
        async with asyncio.timeout(svc.settings.stream_write_timeout_s):
            await response.write_eof()
    except Exception as exc:
        if not isinstance(exc, ConnectionResetError):
            log.warning("the metrics of run %s were cut after the reply began: %s: %s", run_id,
                        type(exc).__name__, exc)
        if request.transport is not None:
            request.transport.abort()
        raise ConnectionResetError("the metrics reply was cut") from exc
    return response


async def _pages(svc: Services, run_id: str, name: str, until: int) -> AsyncIterator[list[PointRow]]:
    after = 0
    while True:
        rows: list[PointRow] = await svc.store.read(MetricPage(run_id, name, after, until, PAGE_POINTS))
        if rows:
            yield rows
        if len(rows) < PAGE_POINTS:
            return
        after = rows[-1][0]


async def _json(svc: Services, run_id: str, names: list[str], until: int) -> AsyncIterator[str]:
    """The reply's text, a page of points a chunk (the first with what comes before it)."""
    text = '{"series": {'
    for index, name in enumerate(names):
        text += ("" if index == 0 else "], ") + jsonsafe.dumps(name) + ": ["
        first = True
        async for rows in _pages(svc, run_id, name, until):
            yield text + ("" if first else ", ") + ", ".join([_point(*row) for row in rows])
            text, first = "", False
    yield text + ("]" if names else "") + "}}"


def _point(seq: int, step: int, value: float | None, non_finite: str | None, ts: str) -> str:
    """A point as ``jsonsafe.dumps`` writes it, formatted here: twice as fast as a dict
    handed to the encoder, for the few million of a large run. Anything but an ordinary
    point (a non-finite one, a value not a finite float) goes to the encoder."""
    if non_finite is None and type(value) is float and isfinite(value) and type(step) is int and type(ts) is str:
        return f'{{"step": {step}, "value": {float.__repr__(value)}, "ts": {encode_basestring_ascii(ts)}}}'
    point: dict[str, object] = {"step": step, "value": value, "ts": ts}
    if non_finite is not None:
        point["non_finite"] = non_finite
    return jsonsafe.dumps(point)


async def _csv(svc: Services, run_id: str, names: list[str], until: int) -> AsyncIterator[str]:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["series", "step", "value", "ts"])
    for name in names:
        async for rows in _pages(svc, run_id, name, until):
            writer.writerows([name, step, value if value is not None else non_finite or "", ts]
                             for _seq, step, value, non_finite, ts in rows)
            yield out.getvalue()
            out.seek(0)
            out.truncate()
    yield out.getvalue()
