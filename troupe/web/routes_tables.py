"""The CSV tables as routes of their own: a run's ``metrics.csv``, a sweep's and a study's
``ranking.csv``. Each answers what ``?format=csv`` answers on its JSON route (the same
handler, asked for CSV), so the two never differ.

Why a route apart: one operation whose answer is JSON or CSV by a query parameter is one
answer type to a generated client, which read the CSV as JSON and failed; as operations
of their own, the OpenAPI document states one media type for each, and a generated call
reads the table as text."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from troupe.web.routes_runs import run_metrics
from troupe.web.routes_studies import get_study
from troupe.web.routes_sweeps import get_sweep

routes = web.RouteTableDef()

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _as_csv(handler: Handler) -> Handler:
    """``handler`` asked for its CSV, whatever ``format`` the request gave."""

    async def table(request: web.Request) -> web.StreamResponse:
        return await handler(request.clone(rel_url=request.rel_url.update_query(format="csv")))

    table.__doc__ = f"{handler.__name__} as CSV"
    return table


routes.get("/api/runs/{run_id}/metrics.csv")(_as_csv(run_metrics))
routes.get("/api/sweeps/{sweep_id}/ranking.csv")(_as_csv(get_sweep))
routes.get("/api/studies/{study_id}/ranking.csv")(_as_csv(get_study))
