"""The control plane's supervision tree, declared once, as data.

A reader sees here every supervisor and every kind of child, in the order they start:
what each child is, how its supervisor restarts it, and what a crash leads to (the
limit is 5 restarts in 10 s). ``troupe/supervisors/root.py`` builds the tree
from these declarations and takes each child's restart policy from them;
docs/architecture.md shows ``drawing()``, and a test keeps the two the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from troupe.supervisors.supervisor import Restart


@dataclass(frozen=True)
class Kind:
    """A child of the root (``branch`` False), or a branch: a supervisor of many children
    of one kind, each named ``<name>/<key>`` (``runs/<run id>``)."""

    name: str
    what: str
    restart: Restart
    on_crash: str  # what a crash leads to, and what happens past the limit
    branch: bool = False


_ESCALATES = "restarted; past the limit the server stops"
STORE = Kind("store", "thread actor: the store's apsw connection (reads, large batches)", Restart.PERMANENT, _ESCALATES)
EVENTS = Kind("events", "the hub: committed events -> stream subscribers", Restart.PERMANENT, _ESCALATES)
PLACER = Kind("placer", "admission: lanes, the seed gate, the book of workers", Restart.PERMANENT, _ESCALATES)
CPUS = Kind("cpus", "the CPU ledger: TROUPE_CPUS lent to declared nodes", Restart.PERMANENT, _ESCALATES)
QUEUES = Kind("queues", "QueueActor per queue key (cpu, cuda:0, ...)", Restart.PERMANENT,
              "restarted; past the limit the key is quarantined (503)", branch=True)
LEDGERS = Kind("ledgers", "LedgerActor per physical device (card, cpu@host)", Restart.TEMPORARY,
               "the placer's next ask makes a fresh one", branch=True)
RUNS = Kind("runs", "RunActor per active run; in-process graphs walk on executor threads (a few quick nodes: "
            "on the loop)", Restart.TEMPORARY, "its run fails; never retried", branch=True)
STUDIES = Kind("studies", "StudyActor per running study (stops on halt or finish)", Restart.TRANSIENT,
               "restarted; past the limit the study becomes failed", branch=True)
WORKERS = Kind("workers", "WorkerConnection per connected worker (stops past the grace)", Restart.TRANSIENT,
               "restarted; past the limit the worker shows failed and its runs end interrupted",
               branch=True)
SSH = Kind("ssh", "SshSession per worker served over SSH (in the workers supervisor)", Restart.TEMPORARY,
           "the worker shows failed with the reason", branch=True)
WEB = Kind("web", "the aiohttp server", Restart.TEMPORARY, "not restarted in place (its port); a handler's error stays "
           "in its request")

# The root's children and branches, in the order they start; they stop in reverse, the
# branches first (runs are asked to stop within the grace before the web closes).
TREE: tuple[Kind, ...] = (STORE, EVENTS, PLACER, QUEUES, LEDGERS, RUNS, CPUS, STUDIES, WORKERS, SSH, WEB)


def drawing() -> str:
    """The tree as docs/architecture.md shows it."""
    lines = ["root                  troupe/supervisors/root.py, declared in troupe/supervisors/tree.py"]
    for index, kind in enumerate(TREE):
        edge = "└──" if index == len(TREE) - 1 else "├──"
        name = f"{kind.name}/" if kind.branch else kind.name
        lines.append(f"{edge} {name:<10} {kind.what}")
        lines.append(f"{'   ' if index == len(TREE) - 1 else '│  '} {'':<10} {kind.restart}: {kind.on_crash}")
    return "\n".join(lines)
