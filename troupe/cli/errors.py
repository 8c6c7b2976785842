"""CLI failures with the exit code each one means (DESIGN section 4)."""

from __future__ import annotations

from troupe.protocol.errors import TroupeError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class CliError(TroupeError):
    """Printed as one line to stderr; the command exits with ``exit_code``."""

    code = "cli_error"
    exit_code = EXIT_FAILED


class NoServer(CliError):
    code = "no_server"


class ReplyShape(CliError, KeyError):
    """A success whose JSON lacks a field every troupe server sends: something else
    answers at that address (or a server of another version). A KeyError too, so code
    that looks a field up and copes with its absence still does."""

    code = "reply_shape"

    def __str__(self) -> str:
        return self.message


class BadOption(CliError):
    """An option's value that no command could use (``--instance ../x``)."""

    code = "bad_option"
    exit_code = EXIT_USAGE


class BadAddress(CliError):
    """A host or port that is no address at all (``--port 70000``, ``--host "[::1"``)."""

    code = "bad_address"
    exit_code = EXIT_USAGE


class AlreadyRunning(CliError):
    code = "already_running"


class SubmitRejected(CliError):
    code = "submit_rejected"
