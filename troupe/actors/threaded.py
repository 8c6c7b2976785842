"""Where pykka's thread actors meet the asyncio loop (DESIGN section 3).

Awaiting a pykka future would block the loop, so an ask puts a
``concurrent.futures.Future`` in the envelope beside the message and awaits it through
``asyncio.wrap_future`` under a timeout. Every handler is wrapped: its exception goes to
the reply and the actor lives on, unless ``is_broken`` says its resource is gone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pykka

from troupe.actors.base import DEFAULT_ASK_TIMEOUT, Exit
from troupe.actors.errors import ActorDeadError, AskTimeout

log = logging.getLogger("troupe.actors")


@dataclass(slots=True)
class _Call:
    message: Any
    reply: concurrent.futures.Future[Any] | None


class ThreadActor(pykka.ThreadingActor):
    """Base of the actors that own a blocking resource. Subclasses implement
    ``handle(message)``, which runs in the actor's own thread."""

    def __init__(self, name: str, loop: asyncio.AbstractEventLoop, on_exit: Callable[[Exit], None] | None) -> None:
        super().__init__()
        self.name = name
        self._loop = loop
        self._on_exit = on_exit

    def handle(self, message: Any) -> Any:
        raise NotImplementedError

    def is_broken(self, error: Exception) -> bool:
        """True when ``error`` means the resource itself is gone; the actor then stops
        and its supervisor is told."""
        return False

    def on_receive(self, message: Any) -> Any:
        if not isinstance(message, _Call):
            return super().on_receive(message)
        reply = message.reply
        # The asker may have given up already; then the work is not done at all.
        if reply is not None and not reply.set_running_or_notify_cancel():
            return None
        try:
            result = self.handle(message.message)
        except Exception as exc:
            if reply is not None:
                reply.set_exception(exc)
            else:
                log.error("%s: %s while handling %s", self.name, exc, type(message.message).__name__)
            if self.is_broken(exc):
                log.error("%s: resource broken, stopping: %s", self.name, exc)
                self.mark_broken(exc)
            return None
        if reply is not None:
            reply.set_result(result)
        return None

    def on_stop(self) -> None:
        """Runs in the actor's thread. Fails the asks still in the inbox (pykka fails
        only its own futures), so no caller waits out its timeout for nothing."""
        while not self.actor_inbox.empty():
            call = self.actor_inbox.get().message
            if isinstance(call, _Call) and call.reply is not None and call.reply.set_running_or_notify_cancel():
                call.reply.set_exception(ActorDeadError(f"actor {self.name} stopped"))
        error = getattr(self, "_broken", None)
        self._notify(Exit(self.name, "broken" if error else "normal", error))

    def mark_broken(self, error: Exception) -> None:
        """Stops the actor as broken (its resource is gone); its supervisor is told."""
        self._broken = error
        self.stop()

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        self._notify(Exit(self.name, f"crashed: {exception_value}", exception_value))

    def _notify(self, exit_: Exit) -> None:
        if self._on_exit is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._on_exit, exit_)


class ThreadActorRef:
    """The asyncio face of a thread actor: ``ask`` awaits without blocking the loop."""

    def __init__(self, ref: pykka.ActorRef[Any], name: str, exited: asyncio.Future[Exit]) -> None:
        self._ref = ref
        self.name = name
        self._exited = exited

    async def wait(self) -> Exit:
        return await asyncio.shield(self._exited)

    def on_exit(self, callback: Callable[[Exit], None]) -> None:
        """``callback(exit)`` once the actor has ended (on the loop's next turn if it has)."""
        self._exited.add_done_callback(lambda exited: callback(exited.result()))

    @property
    def is_alive(self) -> bool:
        return self._ref.is_alive()

    def tell(self, message: Any) -> None:
        try:
            self._ref.tell(_Call(message, None))
        except pykka.ActorDeadError:
            log.debug("dropped %s to dead actor %s", type(message).__name__, self.name)

    def submit(self, message: Any) -> concurrent.futures.Future[Any]:
        reply: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            self._ref.tell(_Call(message, reply))
        except pykka.ActorDeadError:
            raise ActorDeadError(f"actor {self.name} is not running") from None
        return reply

    async def ask(self, message: Any, timeout: float = DEFAULT_ASK_TIMEOUT) -> Any:
        reply = self.submit(message)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(reply), timeout)
        except TimeoutError:
            raise AskTimeout(f"{self.name} did not answer {type(message).__name__} within {timeout}s") from None

    async def stop(self, timeout: float = 10.0) -> None:
        """Stops after the messages already sent, joining the thread with a deadline."""
        try:
            await asyncio.to_thread(functools.partial(self._ref.stop, block=True, timeout=timeout))
        except pykka.Timeout:
            log.error("%s did not stop within %ss", self.name, timeout)


def start_thread_actor(cls: type[ThreadActor], name: str, *args: Any, on_exit: Callable[[Exit], None] | None = None,
                       **kwargs: Any) -> ThreadActorRef:
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[Exit] = loop.create_future()

    def _exited(exit_: Exit) -> None:
        if not exited.done():
            exited.set_result(exit_)
        if on_exit is not None:
            on_exit(exit_)

    return ThreadActorRef(cls.start(name, loop, _exited, *args, **kwargs), name, exited)
