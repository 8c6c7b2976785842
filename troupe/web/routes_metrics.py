"""``/metrics``: the control plane in Prometheus's terms. Gauges are read at the scrape
from the same sources the API answers from (the queues' rows, the runs' counts, the
Workers list, the editor cache); counters and histograms are the ``RunTally`` the event
hub keeps since the server started. Prometheus's text format, or OpenMetrics when the
scraper asks for it (prometheus_client's own negotiation of ``Accept``)."""

from __future__ import annotations

import json
from collections import Counter as Tally
from collections.abc import Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from troupe.actors.events import SubscriberCount
from troupe.actors.store.runs import StatusCounts
from troupe.protocol import events as ev
from troupe.web.context import Services, services
from troupe.web.routes_meta import queue_rows
from troupe.web.routes_workers import worker_texts

routes = web.RouteTableDef()


class _Scrape:
    """One scrape's families, from what was read for it."""

    def __init__(self, families: list[Metric], tally: CollectorRegistry) -> None:
        self._families, self._tally = families, tally

    def collect(self) -> Iterator[Metric]:
        yield from self._families
        yield from self._tally.collect()


async def _families(svc: Services) -> list[Metric]:
    depth = GaugeMetricFamily("troupe_queue_depth", "Runs waiting on a queue key.", labels=["queue_key"])
    running = GaugeMetricFamily("troupe_queue_running", "Runs holding a slot of a queue key.", labels=["queue_key"])
    limit = GaugeMetricFamily("troupe_queue_limit", "Slots of a queue key.", labels=["queue_key"])
    # A key's device, which other keys may share (the server's cpu and a same-machine
    # worker's): its slots and the runs holding it through any key; a key that shares
    # nothing repeats its own. A key waits with a slot free only if both pairs say so.
    device_running = GaugeMetricFamily("troupe_queue_device_running", "Runs holding the physical device of a queue "
                                       "key, through it or another key that shares the device.", labels=["queue_key"])
    device_limit = GaugeMetricFamily("troupe_queue_device_limit", "Slots of the physical device of a queue key "
                                     "(the smallest limit of the keys that share it).", labels=["queue_key"])
    shared = GaugeMetricFamily("troupe_queue_shared_device", "1 for a queue key whose physical device other keys "
                               "share, labelled with that device.", labels=["queue_key", "device"])
    for row in await queue_rows(svc):
        key, shares = row["queue_key"], row.get("shares")
        depth.add_metric([key], row["queued"])
        running.add_metric([key], row["running"])
        limit.add_metric([key], row["limit"])
        device_running.add_metric([key], shares["running"] if shares else row["running"])
        device_limit.add_metric([key], shares["limit"] if shares else row["limit"])
        if shares:
            shared.add_metric([key, shares["device"]], 1)
    runs = GaugeMetricFamily("troupe_runs", "Runs in the database by state.", labels=["state"])
    counts = await svc.store.read(StatusCounts())
    for state in sorted(ev.ALL_STATES):
        runs.add_metric([state], counts.get(state, 0))
    views = [json.loads(text) for text in await worker_texts(svc)]
    # The states the Workers list shows, counted from its rows (each state always there).
    states = Tally(view["state"] for view in views)
    workers = GaugeMetricFamily("troupe_workers", "Enrolled workers by state.", labels=["state"])
    for state in sorted({"connected", "disconnected", "failed", *states}):
        workers.add_metric([state], states.get(state, 0))
    pending = GaugeMetricFamily("troupe_artifacts_pending", "Files a worker's artifact outbox holds until the "
                                "control plane has them.", labels=["worker"])
    pending_bytes = GaugeMetricFamily("troupe_artifacts_pending_bytes", "Bytes a worker's artifact outbox holds.",
                                      labels=["worker"])
    for view in views:  # a connected worker that reports no outbox holds nothing in one
        outbox: dict[str, Any] = view.get("artifact_outbox") or {"entries": 0, "bytes": 0}
        if view["state"] == "connected":
            pending.add_metric([view["name"]], outbox["entries"])
            pending_bytes.add_metric([view["name"]], outbox["bytes"])
    subscribers = GaugeMetricFamily("troupe_stream_subscribers", "Open event-stream subscriptions.",
                                    value=await svc.actor("events").ask(SubscriberCount()))
    cache = svc.node_cache.stats()
    return [depth, running, limit, device_running, device_limit, shared, runs, workers, pending, pending_bytes,
            subscribers,
            GaugeMetricFamily("troupe_editor_cache_bytes", "Estimated bytes of node outputs in the editor cache.",
                              value=cache["bytes"]),
            GaugeMetricFamily("troupe_editor_cache_entries", "Node outputs in the editor cache.",
                              value=cache["entries"]),
            CounterMetricFamily("troupe_editor_cache_evictions", "Editor-cache entries evicted for room since start.",
                                value=cache["evictions"])]


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    svc = services(request)
    registry = CollectorRegistry()
    registry.register(_Scrape(await _families(svc), svc.tally.registry))
    try:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    except (TypeError, ValueError):  # prometheus_client compares an Accept's version=abc with numbers
        encoder, content_type = choose_encoder("")  # the plain text format every scraper reads
    return web.Response(body=encoder(registry), headers={"Content-Type": content_type})
