"""docs/cli.md's reference: every command and option of the CLI, rendered from the CLI's
own tree, so the page cannot leave one out. ``python -m troupe.cli.reference docs/cli.md``
(``make cli-reference``) rewrites the part between the two markers; a test checks the
page holds what this renders."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperArgument, TyperGroup, TyperOption

START = "<!-- reference: `make cli-reference` writes what follows; edit the CLI, not this -->"
END = "<!-- end of the reference -->"


def commands(app: typer.Typer) -> Iterator[tuple[str, Any]]:
    """``(path, command)`` of every command, groups walked depth first, by name."""
    root = typer.main.get_command(app)

    def walk(path: str, command: Any) -> Iterator[tuple[str, Any]]:
        if isinstance(command, TyperGroup):
            if command.invoke_without_command and path != "troupe":  # a group that is a command too
                yield path, command  # (``troupe workers`` lists them; ``troupe workers add`` enrolls one)
            for name in sorted(command.commands):
                yield from walk(f"{path} {name}", command.commands[name])
        else:
            yield path, command

    yield from walk("troupe", root)


def options(command: Any) -> Iterator[tuple[str, str]]:
    """``(how it is written, its help)`` of each argument and option but ``--help``."""
    for param in command.params:
        if isinstance(param, TyperArgument):
            yield param.display_name_raw.upper() + ("..." if param.nargs != 1 else ""), str(param.help or "")
        elif isinstance(param, TyperOption) and "--help" not in param.opts:
            yield " / ".join([*param.opts, *param.secondary_opts]), param.help or ""


def markdown(app: typer.Typer) -> str:
    parts = []
    for path, command in commands(app):
        summary = (command.help or "").strip().split("\n\n", 1)[0].replace("\n", " ")
        rows = "\n".join(f"| `{how}` | {text.replace('|', '/')} |" for how, text in options(command))
        parts.append(f"### `{path}`\n\n{summary}\n\n| argument or option | what it is |\n| --- | --- |\n{rows}\n")
    return "\n".join(parts)


def rewrite(page: Path, app: typer.Typer) -> None:
    text = page.read_text()
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    page.write_text(f"{head}{START}\n\n{markdown(app)}\n{END}{tail}")


if __name__ == "__main__":
    from troupe.cli.main import app

    rewrite(Path(sys.argv[1]), app)
