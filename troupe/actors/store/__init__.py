"""The store: the only writer of the SQLite database (DESIGN section 3).

``actor`` owns the store's connection and dispatches; ``client`` is its asyncio face
(group commit, and the small hot batches committed on the loop); ``writer`` turns a batch
into one transaction on either connection; ``schema`` opens and migrates the file; one
module per concern holds its messages next to their SQL: ``runs`` (rows, queue order,
recovery, retention), ``events`` (a run's log), ``sweeps``, ``studies``, ``workers``.
Import messages from their module.
"""

from troupe.actors.store.actor import Commit, StoreActor
from troupe.actors.store.client import StoreClient

__all__ = ["Commit", "StoreActor", "StoreClient"]
