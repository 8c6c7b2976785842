"""The script pack: ``script.Command`` runs a program a lab already has (``python
train.py --lr {lr}``) as a node, with what it prints, the metrics and progress it prints
as JSON lines, and the checkpoints it writes kept as the run's. Declarations only; the
code is in ``_script_impl`` and imported when a node executes.

A command runs code as the user of the server or the worker: the node type is
privileged (a class session may not submit it unless the teacher allows it)."""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

from subprocess_runner.node_types import NodeType, Pack, Param, Port, lazy

# Placeholders every command has besides its vars: the run's seed and id, and the Python
# that runs troupe's nodes on that machine (a lab's script needs its packages).
BUILT_IN = ("seed", "run_id", "python")


def placeholders(text: str) -> list[str]:
    """The ``{name}`` fields of one argv string (``{{`` and ``}}`` are braces); ValueError
    for a string that is not a template (a lone brace, a field with a format spec)."""
    names = []
    try:
        fields = list(string.Formatter().parse(text))
    except ValueError as exc:  # Python's own words ("Single '}' encountered") name no fix
        raise ValueError(f"{text[:80]!r} has a lone brace ({exc}): a literal {{ or }} is written {{{{ or }}}}, a "
                         "placeholder {name}") from None
    for _, field, spec, conversion in fields:
        if field is None:
            continue
        if not field.isidentifier() or spec or conversion:
            raise ValueError(f"{{{field}}} is not a placeholder: write {{name}} with a name of vars")
        names.append(field)
    return names


def _escaped(key: Any) -> str:
    """A mapping's key as a JSON pointer's part."""
    return str(key).replace("~", "~0").replace("/", "~1")


def _check(params: Mapping[str, Any]) -> tuple[str, str] | None:
    """Every placeholder of argv names a var (or seed, run_id): said at submission, with
    its pointer, not as a failure when the run starts."""
    known = set(params.get("vars") or {}) | set(BUILT_IN)
    argv = params.get("argv") or []
    if not argv:
        return "argv", "argv needs the program to run (a list of strings, never a shell line)"
    # A NUL ends a C string: no argument, variable or value of one can hold it.
    for where, text in [*((f"argv/{i}", t) for i, t in enumerate(argv)),
                        *((f"vars/{_escaped(k)}", v) for k, v in (params.get("vars") or {}).items()),
                        *((f"env/{_escaped(k)}", f"{k}={v}") for k, v in (params.get("env") or {}).items())]:
        if isinstance(text, str) and "\0" in text:
            return where, (f"{where.split('/')[0]} holds a NUL character, which no program's argument or "
                           "environment variable can hold")
    for index, text in enumerate(argv):
        try:
            missing = [name for name in placeholders(text) if name not in known]
        except ValueError as exc:
            return f"argv/{index}", str(exc)
        if missing:
            return f"argv/{index}", (f"argv has {{{missing[0]}}}, which vars does not set (it sets "
                                     f"{', '.join(sorted(params.get('vars') or {})) or 'nothing'}; seed, run_id and "
                                     "python are always there)")
    return None


PACK = Pack(
    name="script",
    node_types=(
        NodeType(
            "script.Command", lazy("subprocess_runner.packs._script_impl:run_command"),
            outputs=(Port("exit_code", "int"), Port("result", "any")),
            params=(
                Param("argv", "list", description="the program and its arguments; {name} takes vars' value"),
                Param("vars", "mapping", default={}, description="values for the {name} placeholders of argv "
                                                                 "(a sweep or --set addresses them as vars.NAME)"),
                Param("cwd", "string", default="", description="where it runs: the run's folder (empty), a "
                                                               "storage label (data:scripts) or a data root"),
                Param("env", "mapping", default={}, description="extra environment variables"),
                Param("timeout_s", "float", default=0.0, min=0.0,
                      description="stop it (and fail the run) after this many seconds; 0: no limit"),
            ),
            description="Runs a program: its prints are the run's console, its JSON lines with a metric or "
                        "progress key are metrics and progress, files it renames into TROUPE_CHECKPOINT_DIR "
                        "are checkpoints.",
            privileged=True,
            check=_check,
        ),
    ),
)
