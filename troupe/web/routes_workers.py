"""``/api/workers``: enrollment, credentials, the list of workers, revoke and drain.

A one-time enrollment token (made with the session token) is exchanged by the agent for
a per-worker credential. Only hashes are stored. The credential exchange is the one
mutation that does not take the session token: the enrollment token is its proof.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from troupe.actors.base import ActorRef, Snapshot
from troupe.actors.placer.book import INSTANCE_MARK
from troupe.actors.placer.ledger import PROMISING
from troupe.actors.placer.messages import CardPolicy
from troupe.actors.ssh_session import SshTarget
from troupe.actors.store.memory import CardPolicies, SetCardPolicy
from troupe.actors.store.workers import CreateEnrollment, ListWorkers, RedeemEnrollment, RevokeWorker
from troupe.actors.worker import Drain, Revoked
from troupe.actors.worker_view import ConnectionView
from troupe.protocol import jsonsafe
from troupe.protocol.api import CardSharing, NewEnrollment, Redeem, SshWorker
from troupe.protocol.errors import NotFound, StateConflict
from troupe.web.context import Services, services
from troupe.web.errors import json_reply
from troupe.web.requests import read_model

routes = web.RouteTableDef()
CREDENTIALS_PATH = "/api/workers/credentials"
# A worker's own routes; the names of the routes beside it never match (they are
# reserved worker names), so ``Allow`` on those routes lists only their own methods.
WORKER_PATH = r"/api/workers/{name:(?!(?:credentials|enrollments|ssh)(?![a-z0-9_.-]))[^/]+}"


@routes.post("/api/workers/enrollments")
async def enroll(request: web.Request) -> web.Response:
    svc = services(request)
    body = await read_model(request, NewEnrollment)
    token = secrets.token_urlsafe(24)
    expires_at = await svc.store.write(CreateEnrollment(token, body.name, body.ttl_s, body.uses))
    url = svc.public_url
    command = f"troupe agent start --url {url} --token {token}"
    if body.name:
        command += f" --name {body.name}"
    return json_reply({
        "token": token, "command": command, "uses": body.uses, "name": body.name,
        "expires_at": datetime.fromtimestamp(expires_at, UTC).isoformat().replace("+00:00", "Z"),
    }, status=201)


@routes.post(CREDENTIALS_PATH)
async def redeem(request: web.Request) -> web.Response:
    svc = services(request)
    body = await read_model(request, Redeem)
    credential = secrets.token_urlsafe(32)
    name = await svc.store.write(RedeemEnrollment(body.token, body.name, body.machine_id, credential))
    return json_reply({"name": name, "credential": credential}, status=201)


@routes.get("/api/workers")
async def list_workers(request: web.Request) -> web.Response:
    texts = await worker_texts(services(request))
    return web.Response(text='{"workers": [' + ", ".join(texts) + "]}", content_type="application/json")


async def worker_texts(svc: Services) -> list[str]:
    """Each worker of the Workers list as its JSON text (``/metrics`` counts the same)."""
    listed, policies = await asyncio.gather(svc.store.read(ListWorkers()), svc.store.read(CardPolicies()))
    enrolled = [row for row in listed if not row["revoked"]]
    # Each connection's published view, read without an ask: 800 workers cost no message.
    lives = [svc.registry.lookup(f"workers/{row['name']}") for row in enrolled]
    views = [_connection_view(live) for live in lives]
    instances = _instances(svc, [row["name"] for row in enrolled])
    cards = _Cards(svc, policies)
    shown = _TEXTS.heads(cards)
    failures = svc.failed_workers()
    texts: list[str] = []  # each worker's JSON: a view's own part is encoded once per view
    for row, live, view in zip(enrolled, lives, views, strict=True):
        mine = instances.get(row["name"], [])
        failed = failures.get(row["name"])
        if view is not None and not mine and (failed is None or live is not None):
            texts.append(view.with_heard(shown(view, row["enrolled_at"])))
            continue
        if view is None and row["exited_at"] and not mine:
            continue  # a spent one-shot worker whose agent exited: its history is in its runs
        snapshot = view.as_json() if view is not None else {
            "name": row["name"], "state": "disconnected", "degraded": False, "draining": False,
            "missing_node_types": [], "version": None, "one_shot": False, "machine_id": row["machine_id"],
            "devices": [], "mounts": {},
            "inventory": None, "slots": [], "running_runs": [], "warm_pool": None}
        if failed is not None and live is None:
            snapshot = {**snapshot, "state": "failed", "failed_reason": failed}
        if mine:  # a batch array's worker: its tasks connect as instances
            snapshot = {**snapshot, "one_shot": True, "state": "connected" if any(
                i["state"] == "connected" for i in mine) else snapshot["state"]}
        texts.append(jsonsafe.dumps({**snapshot, "cards": cards(view.cards if view is not None else []),
                                     "instances": mine, "enrolled_at": row["enrolled_at"]}))
    texts += [jsonsafe.dumps(row) for row in await _not_enrolled(svc, {row["name"] for row in enrolled})]
    return texts


async def _not_enrolled(svc: Services, enrolled: set[str]) -> list[dict[str, Any]]:
    """Workers served over SSH whose agent has not enrolled yet (connecting, or failed
    before it could, such as a refused key)."""
    sessions = {name.removeprefix("ssh/"): ref for name in svc.registry.names("ssh/")
                if (ref := svc.registry.lookup(name)) is not None}
    failures = svc.failed_workers()
    names = sorted((set(sessions) | set(failures)) - enrolled)
    rows: list[dict[str, Any]] = []
    for name in names:
        session = _view(sessions.get(name))
        failed = failures.get(name)
        rows.append({"name": name, "state": "failed" if failed else "connecting", "failed_reason": failed,
                     "ssh": session, "one_shot": False, "devices": [], "inventory": None, "slots": [],
                     "running_runs": [], "cards": [], "instances": [], "degraded": False, "draining": False,
                     "missing_node_types": [], "version": None, "machine_id": None, "enrolled_at": None,
                     "mounts": {}})
    return rows


@routes.post("/api/workers/ssh")
async def add_ssh_worker(request: web.Request) -> web.Response:
    """The control plane opens ``ssh -R`` to the host and starts an agent there; see
    ``troupe/actors/ssh_session.py``. Its state shows in ``GET /api/workers``."""
    svc = services(request)
    body = await read_model(request, SshWorker)
    target = SshTarget(body.name, body.host, body.user, body.port, body.identity_file, body.remote_command,
                       body.known_hosts_file)
    if svc.start_ssh(target) is None:
        raise StateConflict(f"an SSH session for worker {body.name} is open already; remove the worker to end it",
                            code="ssh_session_open", pointer="/name")
    return json_reply({"name": body.name, "host": body.host, "state": "connecting"}, status=201)


def _instances(svc: Services, names: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Each worker's live instances (``name#id`` connections)."""
    found = [(name, ref) for name in svc.registry.names("workers/")
             if INSTANCE_MARK in name and (ref := svc.registry.lookup(name)) is not None]
    snapshots = [_connection(ref) for _, ref in found]
    by_worker: dict[str, list[dict[str, Any]]] = {}
    for (name, _), snapshot in zip(found, snapshots, strict=True):
        worker, _, instance = name.removeprefix("workers/").partition(INSTANCE_MARK)
        if snapshot is None or worker not in names:
            continue
        by_worker.setdefault(worker, []).append({
            "instance": instance, "state": snapshot["state"], "machine_id": snapshot["machine_id"],
            "devices": snapshot["devices"], "run_id": (snapshot["running_runs"] or [None])[0]})
    return {worker: sorted(found, key=lambda i: i["instance"]) for worker, found in by_worker.items()}


class _WorkerTexts:
    """Each worker's JSON text but for ``heard_s_ago``, for workers whose cards have no
    sharing policy and no memory promised (nearly every worker of a lab, nearly always):
    made once per connection view, so a poll of 800 workers encodes only the views that
    changed since the last. Kept for the views of the last list only; the others are
    made at each read."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[ConnectionView, str, str]] = {}  # view, enrolled at, head

    def heads(self, cards: _Cards) -> Callable[[ConnectionView, str], str]:
        last: dict[int, tuple[ConnectionView, str, str]] = self._kept
        kept: dict[int, tuple[ConnectionView, str, str]] = {}
        self._kept = kept

        def head(view: ConnectionView, enrolled_at: str) -> str:
            special = cards.special(view)
            found = None if special else last.get(id(view))
            if found is not None and found[0] is view and found[1] == enrolled_at:
                kept[id(view)] = found
                return found[2]
            text = view.head({"cards": jsonsafe.dumps(cards(view.cards)), "instances": "[]",
                              "enrolled_at": jsonsafe.dumps(enrolled_at)})
            if not special:
                kept[id(view)] = (view, enrolled_at, text)
            return text

        return head


_TEXTS = _WorkerTexts()


class _Cards:
    """Each card of a worker, as its agent reported it, with its policy and its ledger's
    books (memory promised to the runs holding it) as each physical card's ledger last
    published them. Only the ledgers that promise memory are looked up (they mark
    themselves so), not every card's."""

    def __init__(self, svc: Services, policies: dict[str, Any]) -> None:
        self._policies = policies
        self._books = {ref.name.removeprefix("ledgers/"): ref.view or {} for ref in svc.registry.marked(PROMISING)}
        self._special = frozenset(policies) | frozenset(self._books)
        self._context = svc.settings.cuda_context_mib

    def special(self, view: ConnectionView) -> bool:
        """Whether a card of the view has a policy or memory promised on it: then its
        entry is made at each read."""
        return not view.card_ids.isdisjoint(self._special)

    def __call__(self, reported: list[dict[str, Any]]) -> list[Any]:
        found = []
        for card in reported:
            policy = self._policies.get(card["uuid"], _EXCLUSIVE)
            budgets = self._books.get(card["uuid"], {}).get("budgets", {})
            found.append({
                "device": f"cuda:{card['index']}", "index": card["index"], "uuid": card["uuid"], "name": card["name"],
                "pci_bus_id": card.get("pci_bus_id"), **policy, "total_mib": card["memory_total_mib"],
                "free_mib": card["memory_free_mib"], "context_mib": self._context, "budgets": budgets,
                "promised_mib": sum(b + self._context for b in budgets.values())})
        return found


_EXCLUSIVE = {"sharing": "exclusive", "reserved_mib": 0}


def _view(live: ActorRef | None) -> dict[str, Any] | None:
    return None if live is None else live.view


def _connection_view(live: ActorRef | None) -> ConnectionView | None:
    view = None if live is None else live.view
    return view if isinstance(view, ConnectionView) else None


def _connection(live: ActorRef | None) -> dict[str, Any] | None:
    view = _connection_view(live)
    return view.as_json() if view is not None else None


@routes.delete(WORKER_PATH)
async def revoke(request: web.Request) -> web.Response:
    svc = services(request)
    name = request.match_info["name"]
    session = svc.registry.lookup(f"ssh/{name}")
    failed = svc.forget_failed(name)
    if not await svc.store.write(RevokeWorker(name)) and session is None and failed is None:
        raise NotFound(f"no enrolled worker {name!r}", code="worker_not_found")
    live = svc.registry.lookup(f"workers/{name}")
    if live is not None:
        live.tell(Revoked())
    if session is not None:
        session.stop("the worker was removed")  # its ssh process ends, and its agent with the forward
    return json_reply({"name": name, "revoked": True})


@routes.post(WORKER_PATH + "/drain")
async def drain(request: web.Request) -> web.Response:
    svc = services(request)
    name = request.match_info["name"]
    live = svc.registry.lookup(f"workers/{name}")
    if live is None:
        raise NotFound(f"worker {name!r} is not connected", code="worker_not_found")
    live.tell(Drain())
    return json_reply(await live.ask(Snapshot()))


@routes.put(WORKER_PATH + "/devices/{device}")
async def set_card_sharing(request: web.Request) -> web.Response:
    """One policy per physical card: set through any worker that offers it, it holds for
    every worker that does, and outlives restarts."""
    svc = services(request)
    name, device = request.match_info["name"], request.match_info["device"]
    body = await read_model(request, CardSharing)
    view = _connection_view(svc.registry.lookup(f"workers/{name}"))
    if view is None or view.said is None:
        raise NotFound(f"worker {name!r} has not connected since the server started, so its cards are not known",
                       code="worker_not_found")
    card = next((c for c in view.cards if f"cuda:{c['index']}" == device), None)
    if card is None:
        offered = ", ".join(f"cuda:{c['index']}" for c in view.cards) or "no cards"
        raise NotFound(f"worker {name} has no card {device} (it offers {offered}); only a CUDA card can be shared "
                       "by memory", code="device_not_found")
    await svc.store.write(SetCardPolicy(card["uuid"], body.sharing, body.reserved_mib))
    svc.actor("placer").tell(CardPolicy(card["uuid"], body.sharing, body.reserved_mib))
    return json_reply({"worker": name, "device": device, "uuid": card["uuid"], "sharing": body.sharing,
                       "reserved_mib": body.reserved_mib, "total_mib": card["memory_total_mib"]})
