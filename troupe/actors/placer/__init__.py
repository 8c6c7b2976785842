"""Admission: who may run where, and when. The placer (``actor.py``) admits runs by lane,
seed gate and slot; a QueueActor per queue key (``queue.py``) and a LedgerActor per
physical device (``ledger.py``) keep the slots; ``eligibility.py`` says which worker a
submission may go to and ``placement.py`` where a worker run holds its slots, both
reading the one ``WorkerBook`` (``book.py``) the placer keeps. The modules import each
other, never this package, so it re-exports nothing."""
