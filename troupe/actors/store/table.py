"""How a concern module plugs into the store.

Each module of this package (runs, events, sweeps, studies, workers) declares its
messages next to their SQL and ends with two tables, ``WRITES`` and ``READS``, from a
message class to its handler. The actor merges them; adding a message is one dataclass,
one function and one table entry in one file.

A handler gets a ``Session``: the connection (inside the open transaction for a write)
and the hooks that other concerns hang on a fact of this one (a run ended or is about to
be deleted: sweeps and studies harvest its result first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw


@dataclass(frozen=True)
class Session:
    conn: apsw.Connection
    runs_dir: Path
    # Called with run ids that just ended, or are about to be deleted, in the same
    # transaction: the tables that outlive runs copy what they need from them.
    runs_ended: Callable[[Sequence[str]], None]


Handler = Callable[[Session, Any], Any]
Table = dict[type, Handler]
