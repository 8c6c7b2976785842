"""Workers: enrollment tokens and credentials. Called only from the store's thread. Tokens and
credentials are stored as SHA-256 hashes; the secrets themselves never touch the disk
of the control plane."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import apsw

from troupe.actors.errors import EnrollmentRefused, NameTaken
from troupe.actors.store.table import Table
from troupe.protocol import events as ev
from troupe.protocol.api import worker_name_problem

# Messages ----------------------------------------------------------------------


@dataclass(frozen=True)
class CreateEnrollment:
    """Answers the token's expiry (epoch seconds). ``replaces``: a token of the same
    issuer that is of no use any more (an SSH session's previous attempt), deleted."""

    token: str
    name: str | None
    ttl_s: float
    uses: int
    replaces: str | None = None


@dataclass(frozen=True)
class RedeemEnrollment:
    """Spends a use of the token on the worker's credential; answers the worker's name."""

    token: str
    name: str | None
    machine_id: str
    credential: str


@dataclass(frozen=True)
class RevokeWorker:
    name: str


@dataclass(frozen=True)
class WorkerExited:
    """A spent one-shot worker's agent has exited: the Workers list leaves it out while it
    is not connected (its history stays in its runs; its credential serves the next job)."""

    name: str


@dataclass(frozen=True)
class WorkerConnected:
    """An agent of the worker connected: it is listed again (it may have exited as a
    one-shot agent before, and run as a lasting one now)."""

    name: str


@dataclass(frozen=True)
class WorkerForCredential:
    credential: str


@dataclass(frozen=True)
class ListWorkers:
    pass


# SQL ---------------------------------------------------------------------------


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


# An expired token is kept this long, so that an agent given it is told "expired", not "unknown".
EXPIRED_KEPT_S = 86400.0


def create_enrollment(conn: apsw.Connection, token: str, name: str | None, ttl_s: float, uses: int,
                      now: str, replaces: str | None = None) -> float:
    """Stores a token; drops ``replaces`` and the tokens that expired over a day ago (an
    SSH session makes one each attempt, every few seconds while its host is away)."""
    expires_at = time.time() + ttl_s
    conn.execute("DELETE FROM enrollments WHERE expires_at < ?", (time.time() - EXPIRED_KEPT_S,))
    if replaces is not None:
        conn.execute("DELETE FROM enrollments WHERE token_hash = ?", (digest(replaces),))
    conn.execute(
        "INSERT INTO enrollments(token_hash, name, expires_at, uses_left, created_at) VALUES (?, ?, ?, ?, ?)",
        (digest(token), name, expires_at, uses, now),
    )
    return expires_at


def redeem(conn: apsw.Connection, token: str, name: str | None, machine_id: str, credential: str,
           now: str) -> str:
    """Spends one use of ``token`` on a credential for the worker; returns its name."""
    found = conn.execute(
        "SELECT name, expires_at, uses_left, revoked FROM enrollments WHERE token_hash = ?", (digest(token),)
    ).fetchall()
    if not found:
        raise EnrollmentRefused("this enrollment token is unknown; ask for a new join command")
    # The enrollments table's types (apsw types a column's value as any SQLite value).
    bound, expires_at, uses_left, revoked = cast("tuple[str | None, float, int, int]", found[0])
    if revoked:
        raise EnrollmentRefused("this enrollment token was revoked")
    if float(expires_at) < time.time():
        raise EnrollmentRefused("this enrollment token has expired; ask for a new join command")
    if int(uses_left) <= 0:
        raise EnrollmentRefused("this enrollment token was already used")
    worker = str(bound or name or _name_of_machine(machine_id))
    existing = conn.execute("SELECT machine_id, revoked FROM workers WHERE name = ?", (worker,)).fetchall()
    # A name changes hands only through a token issued for that name.
    if existing and not existing[0][1] and bound is None and existing[0][0] != machine_id:
        raise NameTaken(f"a worker named {worker!r} is enrolled from another machine; issue a token for that name")
    conn.execute("UPDATE enrollments SET uses_left = uses_left - 1 WHERE token_hash = ?", (digest(token),))
    conn.execute(
        "INSERT OR REPLACE INTO workers(name, credential_hash, machine_id, revoked, enrolled_at) "
        "VALUES (?, ?, ?, 0, ?)",
        (worker, digest(credential), machine_id, now),
    )
    return worker


def _name_of_machine(machine_id: str) -> str:
    """A worker enrolled without a name: ``worker-`` and its machine id's start, or of a
    digest of it where that start is no worker name (a machine id is any text an agent
    sends; a name ends up in queue keys and file names)."""
    name = f"worker-{machine_id[:8]}"
    if worker_name_problem(name) is None:
        return name
    return f"worker-{hashlib.sha256(machine_id.encode('utf-8', 'surrogateescape')).hexdigest()[:8]}"


def worker_for(conn: apsw.Connection, credential: str) -> dict[str, Any] | None:
    found = conn.execute(
        "SELECT name, machine_id, revoked FROM workers WHERE credential_hash = ?", (digest(credential),)
    ).fetchall()
    if not found:
        return None
    name, machine_id, revoked = found[0]
    return {"name": name, "machine_id": machine_id, "revoked": bool(revoked)}


def list_workers(conn: apsw.Connection) -> list[Mapping[str, Any]]:
    return [{"name": n, "machine_id": m, "revoked": bool(r), "enrolled_at": e, "exited_at": x}
            for n, m, r, e, x in conn.execute(
                "SELECT name, machine_id, revoked, enrolled_at, exited_at FROM workers ORDER BY name")]


def revoke(conn: apsw.Connection, name: str) -> bool:
    conn.execute("UPDATE workers SET revoked = 1 WHERE name = ? AND revoked = 0", (name,))
    return bool(conn.changes())


WRITES: Table = {
    CreateEnrollment: lambda s, op: create_enrollment(s.conn, op.token, op.name, op.ttl_s, op.uses, ev.utc_now(),
                                                      op.replaces),
    RedeemEnrollment: lambda s, op: redeem(s.conn, op.token, op.name, op.machine_id, op.credential, ev.utc_now()),
    RevokeWorker: lambda s, op: revoke(s.conn, op.name),
    WorkerConnected: lambda s, op: s.conn.execute(
        "UPDATE workers SET exited_at = NULL WHERE name = ? AND exited_at IS NOT NULL", (op.name,)),
    WorkerExited: lambda s, op: s.conn.execute("UPDATE workers SET exited_at = ? WHERE name = ?",
                                               (ev.utc_now(), op.name)),
}
READS: Table = {
    WorkerForCredential: lambda s, m: worker_for(s.conn, m.credential),
    ListWorkers: lambda s, m: list_workers(s.conn),
}
