"""The asyncio actor: a mailbox drained one message at a time, by a task that exists
only while there is mail (a burst): an idle actor holds no task, coroutine or future.

Lifecycle::

    start() -> on_start() -> receive(msg) ... -> on_stop(reason)   (normal stop)
                                       \\-> on_failure(exc)        (crash)
    then: pending asks fail with ActorDeadError, on_exit(Exit) is called.

A handler that raises a ``TroupeError`` answers the ask with it and the actor lives on;
any other exception crashes the actor, and its supervisor decides what happens next.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from troupe.actors.errors import ActorDeadError, AskTimeout
from troupe.protocol.errors import TroupeError

log = logging.getLogger("troupe.actors")

DEFAULT_ASK_TIMEOUT = 10.0


@dataclass(frozen=True)
class Exit:
    """Why an actor ended: ``error`` is None after a normal stop."""

    name: str
    reason: str
    error: BaseException | None = None
    # The crash came while answering an ask: what one caller sent broke the handler (its
    # content, say), and the caller was told. Such a crash says nothing about the actor's
    # health, so a supervisor restarts it without counting it toward its intensity, or
    # six bad requests would stop the whole control plane.
    provoked: bool = False

    @property
    def crashed(self) -> bool:
        return self.error is not None


@dataclass(frozen=True)
class Snapshot:
    """Ask: the actor's state as a JSON-ready dict (queues, ledgers, workers, cpus)."""


@dataclass(frozen=True)
class Shutdown:
    """A graceful stop began. ``leave_worker_runs``: worker runs keep executing and are
    adopted by the next start, queued runs stay queued for it."""

    leave_worker_runs: bool = False


@dataclass(slots=True)
class _Envelope:
    # The reply future travels beside the message, never inside it.
    message: Any
    reply: asyncio.Future[Any] | None


@dataclass(frozen=True)
class _Stop:
    reason: str


class _Tombstone:
    """What an actor's ref points at once the actor has exited: its name, its last view
    and its exit, which is all a ref reads of a dead actor (``_alive`` is False, so every
    message to it is dropped or refused without touching a mailbox)."""

    __slots__ = ("_exited", "_view", "name")
    _alive = False

    def __init__(self, name: str, view: Any, exited: asyncio.Future[Exit]) -> None:
        self.name, self._view, self._exited = name, view, exited


class _Mailbox:
    """An actor's line of envelopes; a read may go ahead of the line (``put_first``),
    behind the reads put there before it: they leave in the order they came. One reader
    (the actor's burst) and no bound, so it is a deque: an ``asyncio.Queue`` did the same
    with a getter list, a putter list and an event."""

    __slots__ = ("_ahead", "_queue")

    def __init__(self) -> None:
        self._queue: collections.deque[_Envelope] = collections.deque()
        self._ahead = 0  # envelopes put first, at the head of the line

    def put_nowait(self, envelope: _Envelope) -> None:
        self._queue.append(envelope)

    def put_first(self, envelope: _Envelope) -> None:
        self._queue.insert(self._ahead, envelope)
        self._ahead += 1

    def empty(self) -> bool:
        return not self._queue

    def get_nowait(self) -> _Envelope:
        if self._ahead:
            self._ahead -= 1
        return self._queue.popleft()


class ActorRef:
    """The only handle other code gets to an actor."""

    __slots__ = ("_actor",)

    def __init__(self, actor: Actor) -> None:
        self._actor: Actor | _Tombstone = actor

    @property
    def name(self) -> str:
        return self._actor.name

    @property
    def is_alive(self) -> bool:
        return self._actor._alive

    @property
    def view(self) -> Any:
        """The immutable snapshot the actor last published (None if it publishes none):
        a read that costs no ask, as fresh as the last message it handled."""
        return self._actor._view

    def tell(self, message: Any) -> None:
        """Fire and forget; a message to a dead actor is dropped."""
        actor = self._actor
        if actor._alive:
            actor._post(_Envelope(message, None))  # type: ignore[union-attr]  # alive: an Actor
        else:
            log.debug("dropped %s to dead actor %s", type(message).__name__, self.name)

    async def ask(self, message: Any, timeout: float = DEFAULT_ASK_TIMEOUT, *, first: bool = False) -> Any:
        """``first``: the ask goes ahead of the messages waiting in the mailbox (behind
        other such asks), for a read that a page waits on: it sees the state as it was
        a little earlier, instead of waiting for every message already in line."""
        if not self._actor._alive:
            raise ActorDeadError(f"actor {self.name} is not running")
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[Any] = loop.create_future()
        self._live()._post(_Envelope(message, reply), first=first)
        # One timer handle per ask, not wait_for's task and a shield's extra future: an
        # asker cancelled meanwhile still has its message handled (the actor skips only
        # asks that timed out), as a shielded ask had.
        timer = loop.call_later(timeout, _expire, reply, self.name, message, timeout)
        try:
            return await reply
        finally:
            timer.cancel()

    def stop(self, reason: str = "normal") -> None:
        """Asks the actor to stop after the messages already in its mailbox."""
        if self._actor._alive:
            self._live()._post(_Envelope(_Stop(reason), None))

    async def wait(self) -> Exit:
        return await asyncio.shield(self._actor._exited)

    def on_exit(self, callback: Callable[[Exit], None]) -> None:
        """``callback(exit)`` once the actor has ended (on the loop's next turn if it has)."""
        self._actor._exited.add_done_callback(lambda exited: callback(exited.result()))

    def _live(self) -> Actor:
        """The actor, which the caller found alive (not its tombstone)."""
        return cast("Actor", self._actor)


def _expire(reply: asyncio.Future[Any], name: str, message: Any, timeout: float) -> None:
    if not reply.done():
        reply.set_exception(AskTimeout(f"{name} did not answer {type(message).__name__} within {timeout}s"))


class Registry:
    """Live actors by name (``placer``, ``queues/cpu``, ``runs/<id>``). Finding an actor
    by name, not holding its ref, lets a restarted actor be reached again."""

    def __init__(self) -> None:
        self._refs: dict[str, ActorRef] = {}
        # The same refs by kind (``runs/``, ``ledgers/``...): a lab has thousands of card
        # ledgers and worker connections, and listing one kind must not scan them all.
        self._kinds: dict[str, dict[str, ActorRef]] = {}
        # Refs an actor marked as having some state readers look for (a card's ledger
        # that promises memory): a reader finds the few among thousands without a scan.
        self._marks: dict[str, dict[str, ActorRef]] = {}

    def register(self, ref: ActorRef) -> None:
        self._refs[ref.name] = ref
        self._kinds.setdefault(_kind(ref.name), {})[ref.name] = ref

    def unregister(self, ref: ActorRef) -> None:
        if self._refs.get(ref.name) is ref:
            del self._refs[ref.name]
            kind = self._kinds[_kind(ref.name)]
            del kind[ref.name]
            for marked in self._marks.values():
                marked.pop(ref.name, None)

    def lookup(self, name: str) -> ActorRef | None:
        ref = self._refs.get(name)
        return ref if ref is not None and ref.is_alive else None

    def names(self, prefix: str = "") -> list[str]:
        refs = self._kinds.get(prefix, {}) if prefix.endswith("/") and prefix.count("/") == 1 else self._refs
        return [n for n, r in refs.items() if n.startswith(prefix) and r.is_alive]

    def mark(self, tag: str, ref: ActorRef, on: bool) -> None:
        """Whether ``ref`` (registered) is among those marked ``tag``."""
        marked = self._marks.setdefault(tag, {})
        if on and self._refs.get(ref.name) is ref:
            marked[ref.name] = ref
        elif not on and marked.get(ref.name) is ref:
            del marked[ref.name]

    def marked(self, tag: str) -> list[ActorRef]:
        """The live actors that marked themselves ``tag``."""
        return [ref for ref in self._marks.get(tag, {}).values() if ref.is_alive]


def _kind(name: str) -> str:
    """``runs/`` of ``runs/<id>``; a name without a slash is a kind of its own."""
    head, slash, _ = name.partition("/")
    return head + slash if slash else name


class Actor:
    """Base class; subclasses implement ``receive`` and any hooks."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._mailbox = _Mailbox()
        self._alive = False
        self._exited: asyncio.Future[Exit] = asyncio.get_running_loop().create_future()
        self._ref = ActorRef(self)
        self._home_registry: Registry | None = None
        # The burst draining the mailbox, None while idle; each runs in the actor's context.
        self._task: asyncio.Task[None] | None = None
        self._context: contextvars.Context | None = None
        self._started = False  # on_start ran (in the first burst)
        self._view: Any = None
        self._view_due = False
        # A message is in hand (its handler may be waiting on an ask): a view made now
        # could show half of what it changes, so it is made when the handler is done.
        self._handling = False
        self._view_owed = False
        self._provoked = False  # the crash, if any, came from answering an ask

    @property
    def ref(self) -> ActorRef:
        return self._ref

    def start(self, registry: Registry | None = None, on_exit: Callable[[Exit], None] | None = None) -> ActorRef:
        self._alive = True
        self._home_registry = registry
        if registry is not None:
            registry.register(self._ref)
        if on_exit is not None:
            self._exited.add_done_callback(lambda f: on_exit(f.result()))
        self._context = contextvars.copy_context()
        self._task = asyncio.get_running_loop().create_task(self._burst(), context=self._context)
        self.changed()
        return self._ref

    def stop_self(self, reason: str = "normal") -> None:
        """Stops after the current message; queued messages are failed at teardown."""
        self._post(_Envelope(_Stop(reason), None))

    def _post(self, envelope: _Envelope, first: bool = False) -> None:
        """Into the mailbox; an idle live actor starts a burst to drain it. A waiting task
        per idle actor (its coroutine, a future, the task's wake-up) was, at a lab's
        scale, thousands of objects in flight for every young collection to walk."""
        if first:
            self._mailbox.put_first(envelope)
        else:
            self._mailbox.put_nowait(envelope)
        if self._task is None and self._alive:
            self._task = asyncio.get_running_loop().create_task(self._burst(), context=self._context)

    def mark(self, tag: str, on: bool) -> None:
        """Says in its registry whether it has what ``tag`` names, part of what it
        publishes: readers list the few marked without looking at every view."""
        if self._home_registry is not None:
            self._home_registry.mark(tag, self._ref, on)

    def changed(self) -> None:
        """Readers should see the state anew: the view is rebuilt once, when this burst
        of messages has been handled (the loop's next turn), however many changed it."""
        if self.publishes_view and not self._view_due:
            self._view_due = True
            asyncio.get_running_loop().call_soon(self._publish_view)

    def _publish_view(self) -> None:
        self._view_due = False
        if self._handling:
            self._view_owed = True
            return
        self._view = self.make_view()

    # Hooks -----------------------------------------------------------------------
    publishes_view = False  # a kind that sets it rebuilds its view after every message
    # but these, which never change what it publishes (a view is rebuilt on the loop's
    # next turn: a worker run's acknowledgements alone would cost a rebuild each).
    quiet_messages: frozenset[type] = frozenset()

    def make_view(self) -> Any:
        """The immutable snapshot readers get from ``ref.view``; never mutated after."""
        return None

    async def on_start(self) -> None:
        """Runs in the actor's task before the first message."""

    async def receive(self, message: Any) -> Any:
        raise NotImplementedError

    async def on_stop(self, reason: str) -> None:
        """Runs after a normal stop, before pending asks are failed."""

    async def on_failure(self, error: BaseException) -> None:
        """Runs after a crash, instead of ``on_stop``."""

    # Loop ------------------------------------------------------------------------
    async def _burst(self) -> None:
        """Handles the mail there is, then ends (the actor idle, holding no task) unless
        a stop or a crash ends the actor: then it tears it down."""
        reason, error = "normal", None
        try:
            if not self._started:
                self._started = True
                await self.on_start()
            mailbox = self._mailbox
            while True:
                if not mailbox._queue:
                    self._task = None  # idle: the next message starts a burst
                    return
                envelope = mailbox.get_nowait()
                message, reply = envelope.message, envelope.reply
                if isinstance(message, _Stop):
                    reason = message.reason
                    break
                # Handled here, not in a coroutine of its own: one frame less per message.
                if reply is not None and reply.done() and not reply.cancelled():
                    continue  # the ask timed out: its asker gave up on it
                self._handling = True
                try:
                    result = await self.receive(message)
                except TroupeError as exc:
                    if reply is not None and not reply.done():
                        reply.set_exception(exc)
                    elif reply is None:
                        log.warning("actor %s: %s while handling %s", self.name, exc, type(message).__name__)
                    continue
                except Exception as exc:
                    if reply is not None and not reply.done():
                        reply.set_exception(ActorDeadError(f"actor {self.name} crashed: {exc}"))
                        self._provoked = True
                    raise
                finally:
                    self._handling = False
                    if self._view_owed or type(message) not in self.quiet_messages:
                        self._view_owed = False
                        self.changed()
                if reply is not None and not reply.done():
                    reply.set_result(result)
        except asyncio.CancelledError:
            reason = "cancelled"
        except Exception as exc:
            error, reason = exc, f"crashed: {type(exc).__name__}: {exc}"
            log.error("actor %s crashed", self.name, exc_info=exc)
        self._alive = False
        try:
            if error is None:
                await self.on_stop(reason)
            else:
                await self.on_failure(error)
        except Exception:
            log.exception("actor %s: stop hook failed", self.name)
        self._actor_teardown()
        if self._home_registry is not None:
            self._home_registry.unregister(self._ref)
        self._exited.set_result(Exit(self.name, reason, error, provoked=error is not None and self._provoked))
        if self._view_due:  # what its last message changed, before the view is kept
            self._publish_view()
        # Refs handed out outlive the actor; they now point at its tombstone, so the actor
        # and its ref no longer point at each other and a finished run is freed at once
        # by reference counting, not later by a full collection that walks them all.
        self._ref._actor = _Tombstone(self.name, self._view, self._exited)

    def _actor_teardown(self) -> None:
        while not self._mailbox.empty():
            envelope = self._mailbox.get_nowait()
            if envelope.reply is not None and not envelope.reply.done():
                envelope.reply.set_exception(ActorDeadError(f"actor {self.name} stopped"))
