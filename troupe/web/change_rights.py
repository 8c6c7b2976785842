"""What a session may change: the one rule every route that changes a run, a sweep, a
study or an uploaded file asks (``run_rights`` beside it says what a session may run).

A class is thirty people on one server with no accounts, so what protects one student's
work from another is the session that submitted it (``submitted_by``: a session's id, or
``server`` for the server's own token):

* the teacher's sessions and the server's token change everything;
* a class session changes only what it submitted itself: it cancels, deletes, renames,
  retags and notes its own runs, cancels its own sweeps, cancels and resumes its own
  studies, deletes its own uploads. Anyone else's is refused 403 ``not_your_run`` /
  ``not_your_sweep`` / ``not_your_study`` / ``not_your_file``, saying whose it is and who
  may. Without it, one loop of ``DELETE /api/runs/{id}`` erased a class's work,
  untagging the teacher's ``keep`` run handed it to retention, and deleting the
  teacher's uploaded dataset failed every run that read it after;
* a read session changes nothing (the guard in ``troupe/web/errors.py`` refuses it first).

What was stored without a submitter (by a troupe older than the column) is the
teacher's. Making a new run from another's stays open to a class session (a rerun, a
resume from a checkpoint): the new run is its own, and ``run_rights`` decides whether it
may run that graph. A new login is a new session: what an earlier session of the same
student submitted is no longer theirs to change (the teacher's still).

One tag is the teacher's alone: ``keep``. Retention never removes a run tagged so, so a
class session that could give it (even to its own runs) would keep as many as it liked
past the retention every session is held to (a student at 30 runs a minute, her storage
without bound). ``refuse_keep``: a class session may take ``keep`` off its own run, never
put it on one; it asks the teacher (403 ``keep_is_the_teachers``).

The routes that ask it: ``POST /api/runs/{id}/cancel``, ``DELETE /api/runs/{id}``,
``PATCH /api/runs/{id}``, ``POST /api/sweeps/{id}/cancel``, ``POST
/api/studies/{id}/cancel``, ``POST /api/studies/{id}/resume`` and ``DELETE
/api/files/{id}`` (a file's owner is its ``uploaded_by``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from troupe.actors.store.logins import ListSessions
from troupe.actors.store.retention import KEEP_TAG
from troupe.protocol.errors import KeepIsTheTeachers, NotYours
from troupe.web.login import SERVER_SUBMITTER, TEACHER, Who

_CODES = {"run": "not_your_run", "sweep": "not_your_sweep", "study": "not_your_study", "file": "not_your_file"}
_MADE = {"run": "submitted", "sweep": "started", "study": "started", "file": "uploaded"}
_PLURAL = {"run": "runs", "sweep": "sweeps", "study": "studies", "file": "files"}


async def refuse_theirs(svc: Any, who: Who | None, what: str, thing_id: str, owner: str | None,
                        doing: str) -> None:
    """403 (``not_your_<what>``) unless ``who`` may ``doing`` the ``what`` (run, sweep,
    study, file) ``thing_id`` that ``owner`` submitted (or uploaded): a teacher always, a
    class session when it is its own. ``doing``: the verb, as the refusal says it
    (``cancel``)."""
    if who is not None and (who.kind == TEACHER or (owner is not None and owner == who.session_id)):
        return
    whose, by = await _whose(svc, owner, "uploaded" if what == "file" else "submitted")
    rerun = " (running it again is open to you: the new run is your own)" if what == "run" else ""
    asker = f"a {who.kind} session" if who is not None else "a request without a session"
    raise NotYours(f"{what} {thing_id} is {whose}: {asker} may {doing} only the {_PLURAL[what]} it "
                   f"{_MADE[what]} itself; {by} the teacher may {doing} it{rerun}", pointer="", code=_CODES[what])


def refuse_keep(who: Who | None, run_id: str, before: Iterable[str], after: Iterable[str]) -> None:
    """403 ``keep_is_the_teachers`` when a session other than the teacher's (or the
    server's token) would put ``keep`` on run ``run_id`` (``before``: its tags now,
    ``after``: those asked for); keeping one already there, or taking it off, passes."""
    if KEEP_TAG not in after or KEEP_TAG in before or (who is not None and who.kind == TEACHER):
        return
    asker = f"a {who.kind} session" if who is not None else "a request without a session"
    raise KeepIsTheTeachers(
        f"the tag {KEEP_TAG} is the teacher's to give: retention never removes a run tagged {KEEP_TAG}, so {asker} "
        f"may not put it on a run, its own included (it may take it off its own). Ask the teacher to tag run "
        f"{run_id} {KEEP_TAG} if it should outlive retention", pointer="/tags")


async def _whose(svc: Any, owner: str | None, made: str) -> tuple[str, str]:
    """Whose it is in words, and who besides the teacher may change it. ``made``: how
    its owner made it (submitted, uploaded)."""
    if owner is None:
        unrecorded = "a submitter" if made == "submitted" else f"a record of who {made} it"
        return f"the teacher's (it was stored without {unrecorded})", "only"
    if owner == SERVER_SUBMITTER:
        return f"the teacher's ({made} with the server's token)", "only"
    for row in await svc.store.read(ListSessions()):
        if row["id"] == owner:
            if row["kind"] == TEACHER:
                return f"the teacher's (session {row['label'] or owner})", "only"
            name = row["label"] or f"session {owner}"
            return f"{name}'s", f"only {name} and"
    return f"session {owner}'s", f"only session {owner} and"
