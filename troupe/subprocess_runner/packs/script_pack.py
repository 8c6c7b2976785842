"""The script pack: ``script.Command`` runs a program a lab already has (``python
train.py --lr {lr}``) as a node, with what it prints, the metrics and progress it prints
as JSON lines, and the checkpoints it writes kept as the run's. Declarations only; the
code is in ``_script_impl`` and imported when a node executes.

A command runs code as the user of the server or the worker: the node type is
privileged (a class session may not submit it unless the teacher allows it)."""

from __future__ import annotations

import os
import string
import sys
from collections.abc import Mapping
from typing import Any

from troupe.subprocess_runner.node_types import NodeType, Pack, Param, Port, lazy

# Placeholders every command has besides its vars: the run's seed and id, and the Python
# that runs troupe's nodes on that machine (a lab's script needs its packages).
BUILT_IN = ("seed", "run_id", "python")
# What the numeric libraries a script may use read for their thread pools: set from the
# node's declared cpus.
THREAD_CAPS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")
# What troupe's MLflow endpoint gives a command beside its address (mlflow_endpoint's
# RUN_VAR and TOKEN_VAR): the run it logs into and that run's secret. A command that set
# them would log into another run (or present another's secret). MLFLOW_TRACKING_URI
# stays the command's to set: a lab's own tracking server, and then troupe sets neither.
MLFLOW_OWN = ("MLFLOW_RUN_ID", "MLFLOW_TRACKING_TOKEN")
# Variables troupe sets for a command, which its env may not replace: the run's mark and
# folders (TROUPE_*, the prefix), unbuffered output, the thread caps, the cards a worker
# run was given, and MLflow's run and secret. A command that set TROUPE_RUN_ID would carry
# another run's mark (and be stopped with it); one that set CUDA_VISIBLE_DEVICES would use
# cards its run was not given.
RESERVED_ENV = frozenset({"PYTHONUNBUFFERED", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", *THREAD_CAPS, *MLFLOW_OWN})
RESERVED_PREFIX = "TROUPE_"
# Linux's limit on one argument or one environment string (MAX_ARG_STRLEN, 32 pages);
# the total is the system's ARG_MAX.
_ARG_STRLEN_MAX = 32 * 4096
_POINTER_BYTES = 8  # each string of argv and of the environment is one pointer more


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
    """What a command's params must be, said at submission with a pointer rather than as
    a failure when the run starts: a program to run, no NUL, no variable troupe sets, no
    var named as a placeholder troupe fills, every placeholder a var and every var a
    placeholder (a typo such as ``vars.lrr`` would otherwise run with the default), and
    an argv and env the system can pass to a program."""
    argv = params.get("argv") or []
    if not argv:
        return "argv", "argv needs the program to run (a list of strings, never a shell line)"
    variables = params.get("vars") or {}
    env = params.get("env") or {}
    # A NUL ends a C string: no argument, variable or value of one can hold it.
    for where, text in [*((f"argv/{i}", t) for i, t in enumerate(argv)),
                        *((f"vars/{_escaped(k)}", v) for k, v in variables.items()),
                        *((f"env/{_escaped(k)}", f"{k}={v}") for k, v in env.items())]:
        if isinstance(text, str) and "\0" in text:
            return where, (f"{where.split('/')[0]} holds a NUL character, which no program's argument or "
                           "environment variable can hold")
    return _names(variables, env) or _placeholders(argv, variables) or _size(argv, variables, env) or _warm(params)


def _names(variables: Mapping[str, Any], env: Mapping[str, Any]) -> tuple[str, str] | None:
    """No env name troupe sets itself, and no var named as a placeholder troupe fills."""
    for name in env:
        if name in RESERVED_ENV or name.startswith(RESERVED_PREFIX):
            return f"env/{_escaped(name)}", (f"env sets {name}, which troupe sets for the command itself "
                                              f"({RESERVED_PREFIX}*, PYTHONUNBUFFERED, the thread caps such as "
                                              "OMP_NUM_THREADS, the cards' CUDA_VISIBLE_DEVICES, MLflow's "
                                              "MLFLOW_RUN_ID and MLFLOW_TRACKING_TOKEN): it may not be replaced")
    for name in variables:
        if name in BUILT_IN:
            return f"vars/{_escaped(name)}", (f"vars may not be named {name}: {{{name}}} is filled by troupe "
                                               f"({', '.join(BUILT_IN)} are)")
    return None


def _placeholders(argv: list[Any], variables: Mapping[str, Any]) -> tuple[str, str] | None:
    """Every placeholder of argv names a var (or a built-in one), and every var is used."""
    known = set(variables) | set(BUILT_IN)
    used: set[str] = set()
    for index, text in enumerate(argv):
        try:
            names = placeholders(text)
        except ValueError as exc:
            return f"argv/{index}", str(exc)
        missing = [name for name in names if name not in known]
        if missing:
            return f"argv/{index}", (f"argv has {{{missing[0]}}}, which vars does not set (it sets "
                                     f"{', '.join(sorted(variables)) or 'nothing'}; seed, run_id and "
                                     "python are always there)")
        used.update(names)
    for name in variables:
        if name not in used:
            uses = sorted(used & set(variables))
            return f"vars/{_escaped(name)}", (f"vars sets {name!r}, which no placeholder of argv uses (argv "
                                               f"uses {', '.join(uses) if uses else 'no var'}): a misspelt name "
                                               "would run with the value argv already has")
    return None


def _size(argv: list[Any], variables: Mapping[str, Any], env: Mapping[str, Any]) -> tuple[str, str] | None:
    """argv with its placeholders filled (the run's id and seed at their longest), and
    env, within what this system passes to a program (``ARG_MAX``; on Linux each string
    within ``MAX_ARG_STRLEN`` too). The rest of the environment is the machine's own."""
    values = {"seed": "9" * 20, "run_id": "0" * 32, "python": sys.executable,
              **{k: var_text(v) for k, v in variables.items()}}
    total = 0
    for where, text in [*((f"argv/{i}", t.format_map(values)) for i, t in enumerate(argv)),
                        *((f"env/{_escaped(k)}", f"{k}={v}") for k, v in env.items())]:
        size = len(text.encode("utf-8", "surrogatepass")) + 1
        if sys.platform == "linux" and size > _ARG_STRLEN_MAX:
            return where, (f"{where.split('/')[0]} holds a string of {size} bytes once filled; a program's "
                           f"argument or variable holds at most {_ARG_STRLEN_MAX} here")
        total += size + _POINTER_BYTES
    limit = _arg_max()
    if limit is not None and total > limit:
        return "argv", (f"argv and env come to {total} bytes once filled; this system passes at most {limit} "
                        "(ARG_MAX) to a program: pass a file's name instead")
    return None


def _warm(params: Mapping[str, Any]) -> tuple[str, str] | None:
    """``warm`` runs a Python script in a fork of an interpreter that started long ago:
    ``{python} SCRIPT ...`` or ``{python} -m MODULE ...`` (``-u`` allowed, output is
    unbuffered anyway), never another program or an interpreter option."""
    if not params.get("warm"):
        return None
    argv = list(params.get("argv") or [])
    if argv[0] != "{python}":
        return "argv/0", "warm runs a Python script: argv starts with {python}, then the script (or -m MODULE)"
    at = 1
    while at < len(argv) and argv[at] == "-u":
        at += 1
    if at >= len(argv) or (argv[at] == "-m" and at + 1 >= len(argv)):
        return "argv", "warm needs the script to run after {python} (or -m and a module)"
    if isinstance(argv[at], str) and argv[at].startswith("-") and argv[at] != "-m":
        return f"argv/{at}", (f"warm runs {{python}} SCRIPT or {{python}} -m MODULE: the option {argv[at]!r} cannot "
                              "apply to a process forked from an interpreter already started (set warm: false)")
    return None


def var_text(value: Any) -> str:
    """A var as its placeholder writes it (a flag as JSON's true or false)."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _arg_max() -> int | None:
    try:
        limit = os.sysconf("SC_ARG_MAX")
    except (AttributeError, ValueError, OSError):  # not a POSIX system, or not one that says
        return None
    return limit if limit > 0 else None


PACK = Pack(
    name="script",
    node_types=(
        NodeType(
            "script.Command", lazy("troupe.subprocess_runner.packs._script_impl:run_command"),
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
                Param("warm", "bool", default=False,
                      description="run the Python script ({python} SCRIPT) forked from the worker's zygote, torch "
                                  "already imported (troupe agent start --warm N); elsewhere a fresh interpreter, "
                                  "with a warning"),
                Param("keep_checkpoints", "int", default=0, min=0,
                      description="keep the newest N checkpoints it writes (the rest are let go); 0: all"),
                Param("keep_best", "string", default="",
                      description="also keep the best checkpoint by this series (val_loss; max:reward)"),
            ),
            description="Runs a program: its prints are the run's console, its JSON lines with a metric or "
                        "progress key are metrics and progress, files it renames into TROUPE_CHECKPOINT_DIR "
                        "are checkpoints.",
            privileged=True,
            check=_check,
        ),
    ),
)
