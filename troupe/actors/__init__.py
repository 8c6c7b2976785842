"""The control plane's actors, one kind per module: its state, its messages, its handlers.

Every actor is reached through a ref (``tell``, ``ask``); none reads another's fields.
This package never imports ``web`` or ``cli``.
"""

from troupe.actors.base import Actor, ActorRef, Exit, Registry
from troupe.actors.errors import ActorDeadError, AskTimeout
from troupe.actors.threaded import ThreadActor, ThreadActorRef, start_thread_actor

__all__ = [
    "Actor",
    "ActorDeadError",
    "ActorRef",
    "AskTimeout",
    "Exit",
    "Registry",
    "ThreadActor",
    "ThreadActorRef",
    "start_thread_actor",
]
