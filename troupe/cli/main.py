"""The ``troupe`` command: typer parses flags, the *_cmd modules do the work.

Exit codes: 0 success (or detached), 1 failure of any kind (the run failed, or the
command could not do its job), 2 usage error (typer's), 130 Ctrl+C.
"""

from __future__ import annotations

import json
import math
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Annotated, Any

import typer

from troupe.cli import connect, terminal
from troupe.cli.errors import EXIT_FAILED, EXIT_USAGE, BadOption, CliError, NoServer
from troupe.cli.flags import flag
from troupe.cli.render import output_form, printable

app = typer.Typer(
    no_args_is_help=True, pretty_exceptions_enable=False,
    help="troupe: a run control plane for ML graphs.",
)


def _print_version(asked: bool) -> None:
    if asked:
        from troupe.protocol.version import __version__

        print(f"troupe {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: Annotated[bool, flag(
        "--version", is_eager=True, callback=_print_version,
        help="print troupe's version and exit (a server and its agents must run the same)")] = False) -> None:
    """troupe: a run control plane for ML graphs."""


QUIET_HELP = "print the run's id alone (with --detach, then return; else the exit code says how it ended)"
JSON_HELP = "print the submission as JSON (with --detach), else the ended run's record"
PACKS_HELP = "a folder of packs (.py files or package folders) to load besides TROUPE_HOME/packs (repeatable)"
DEVICE_HELP = "cpu | auto | cuda | cuda:N | mps (default: the graph's settings.device, else cpu)"
RESUME_HELP = ("go on from the run's newest checkpoint instead of starting over: each TrainingLoop's "
               "(checkpoint_every), or the newest file a script command wrote to TROUPE_CHECKPOINT_DIR")


def _fail(exc: CliError) -> None:
    print(f"troupe: {printable(exc.message)}", file=sys.stderr)
    raise typer.Exit(exc.exit_code)


@app.command()
def start(
    host: Annotated[str | None, typer.Option(help="address to bind (default 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="port (default 8765; 0 picks a free one)", min=0, max=65535)] = None,
    examples: Annotated[Path | None, typer.Option(exists=True, file_okay=False,
                                                  help="folder of example graphs to serve")] = None,
    tls_cert: Annotated[Path | None, typer.Option(
        "--tls-cert", help="serve https with this certificate (PEM; with --tls-key). Agents and terminals "
                           "trust a self-signed one with --ca")] = None,
    tls_key: Annotated[Path | None, typer.Option("--tls-key", help="the certificate's private key (PEM)")] = None,
    packs: Annotated[list[Path] | None, typer.Option("--packs", exists=True, file_okay=False, help=PACKS_HELP)] = None,
) -> None:
    """Start the control plane in the foreground; Ctrl+C stops it gracefully."""
    from troupe.cli.config import load_settings
    from troupe.cli.start_cmd import start as run_start

    try:
        code = run_start(load_settings(host, port, examples, tls_cert, tls_key, packs))
    except CliError as exc:
        _fail(exc)
    raise typer.Exit(code)


@app.command()
def stop(
    timeout: Annotated[float, typer.Option(help="seconds to wait for the graceful stop")] = 60.0,
    leave_worker_runs: Annotated[bool, flag(
        "--leave-worker-runs", help="keep runs on workers executing and queued runs queued; the next "
        "`troupe start` adopts them (for updating the server under a long training)")] = False,
) -> None:
    """Stop the server of this TROUPE_HOME gracefully."""
    from troupe.cli.config import load_settings
    from troupe.cli.start_cmd import stop as run_stop

    try:
        raise typer.Exit(run_stop(load_settings(), timeout, leave_worker_runs))
    except CliError as exc:
        _fail(exc)


@app.command()
def run(
    graph: Annotated[str, typer.Argument(help="a saved graph (JSON)")],
    name: Annotated[str | None, typer.Option(help="a name to show wherever runs are listed")] = None,
    device: Annotated[str | None, typer.Option(help=DEVICE_HELP)] = None,
    seed: Annotated[int | None, typer.Option(help="seed every node for a reproducible run", min=0,
                                             max=2**32 - 1)] = None,
    deterministic: Annotated[bool, flag("--deterministic", help="ask for deterministic kernels")] = False,
    record_outputs: Annotated[bool, flag("--record-outputs", help="keep node outputs")] = False,
    wait: Annotated[bool, flag("--wait/--detach", help="follow the run (default) or detach")] = True,
    timeout: Annotated[float | None, typer.Option(help="stop waiting after S seconds", min=0)] = None,
    target: Annotated[str | None, typer.Option(help="a worker to run on")] = None,
    require_device: Annotated[bool, flag(
        "--require-device", help="refuse the run (exit 1, device_unavailable) rather than fall back to cpu when "
                                 "the device is not there")] = False,
    sets: Annotated[list[str] | None, typer.Option("--set", help="change a param: NODE.PARAM=VALUE (repeatable)")]
    = None,
    quiet: Annotated[bool, flag("-q", "--quiet", help=QUIET_HELP)] = False,
    as_json: Annotated[bool, flag("--json", help=JSON_HELP)] = False,
    host: terminal.Host = None,
    port: terminal.Port = None,
) -> None:
    """Submit a graph to the running server and follow it to its result."""
    from troupe.cli.run_cmd import submit_and_follow

    options = {
        "device": device, "seed": seed, "deterministic": deterministic or None,
        "record_outputs": record_outputs or None, "target": {"worker": target} if target else None,
        "require_device": require_device or None,
    }
    try:
        code = submit_and_follow(connect.client(host, port), graph, options, name, not wait, timeout, sets or (),
                                 output_form(quiet, as_json, "text"))
    except CliError as exc:
        _fail(exc)
    raise typer.Exit(code)


@app.command()
def rerun(
    run_id: Annotated[str, typer.Argument(help="the run to queue again")],
    resume: Annotated[bool, flag("--resume", help=RESUME_HELP)] = False,
    wait: Annotated[bool, flag("--wait/--detach", help="follow the run (default) or detach")] = True,
    timeout: Annotated[float | None, typer.Option(help="stop waiting after S seconds", min=0)] = None,
    sets: Annotated[list[str] | None, typer.Option("--set", help="change a param: NODE.PARAM=VALUE (repeatable)")]
    = None,
    quiet: Annotated[bool, flag("-q", "--quiet", help=QUIET_HELP)] = False,
    as_json: Annotated[bool, flag("--json", help=JSON_HELP)] = False,
    host: terminal.Host = None,
    port: terminal.Port = None,
) -> None:
    """Queue a run again with its graph, options and target; --resume goes on from its last checkpoint
    (a TrainingLoop's, or the newest file a script command wrote to TROUPE_CHECKPOINT_DIR)."""
    from troupe.cli.run_cmd import rerun_and_follow

    try:
        code = rerun_and_follow(connect.client(host, port), run_id, resume, not wait, timeout, sets or (),
                                output_form(quiet, as_json, "text"))
    except CliError as exc:
        _fail(exc)
    raise typer.Exit(code)


@app.command(name="exec")
def exec_(
    graph: Annotated[str, typer.Argument(help="a saved graph (JSON)")],
    seed: Annotated[int | None, typer.Option(min=0, max=2**32 - 1, help="seed every node for a reproducible run")]
    = None,
    device: Annotated[str | None, typer.Option(help=DEVICE_HELP)] = None,
    max_parallel: Annotated[int, typer.Option(min=1, help="nodes executing at once")] = 4,
    events_json: Annotated[bool, flag("--events-json", help="print every event as a JSON line")] = False,
    sets: Annotated[list[str] | None, typer.Option("--set", help="change a param: NODE.PARAM=VALUE (repeatable)")]
    = None,
    packs: Annotated[list[Path] | None, typer.Option("--packs", exists=True, file_okay=False, help=PACKS_HELP)] = None,
) -> None:
    """Execute a graph here, without a server."""
    from troupe.cli.exec_cmd import exec_graph

    try:
        code = exec_graph(graph, seed, device, max_parallel, events_json, sets or (), packs or ())
    except CliError as exc:
        _fail(exc)
    raise typer.Exit(code)


@app.command()
def export(
    graph: Annotated[str, typer.Argument(help="a saved graph (JSON)")],
    output: Annotated[str | None, typer.Option("-o", "--output", help="the script to write (default: NAME.py)")] = None,
    seed: Annotated[int | None, typer.Option(min=0, max=2**32 - 1, help="seed the script's run")] = None,
    deterministic: Annotated[bool, flag("--deterministic", help="ask for deterministic kernels")] = False,
    sets: Annotated[list[str] | None, typer.Option("--set", help="change a param: NODE.PARAM=VALUE (repeatable)")]
    = None,
) -> None:
    """Write a graph as a Python script that runs without a server."""
    from troupe.cli.exec_cmd import load_valid_graph
    from troupe.subprocess_runner.codegen import generate_script, script_name

    try:
        raw, _, _ = load_valid_graph(graph, sets or ())
        target = Path(output or script_name(raw))
        try:
            target.write_text(generate_script(raw, seed, deterministic), encoding="utf-8")  # as Python reads source
        except OSError as exc:
            raise CliError(f"cannot write {target}: {exc.strerror or exc}") from None
    except CliError as exc:
        _fail(exc)
    print(f"wrote {target}")


@app.command(name="open")
def open_(
    browser: Annotated[bool | None, flag("--browser/--no-browser", help="open it in this machine's browser "
                                                 "(default: for a teacher's one-time link only)")] = None,
    uses: Annotated[int | None, typer.Option(min=1, max=10_000, help="a class link, good for N browsers or "
                                                                      "terminals")] = None,
    expires: Annotated[str, typer.Option(help="how long it is good for: 90s, 30m, 2h, 1d")] = "12h",
    read_only: Annotated[bool, flag("--read-only", help="a link for a projector or a guest: reads only")]
    = False,
    max_running: Annotated[int | None, typer.Option(min=1, help="each session it opens runs at most N runs at "
                                                                 "once; the others wait")] = None,
    max_waiting: Annotated[int | None, typer.Option(min=0, help="each session has at most N runs waiting; more "
                                                                 "are refused")] = None,
    max_memory_gib: Annotated[float | None, typer.Option(min=0.001, help="each session's runs hold at most this "
                                                                          "much memory budget (GiB) at once")] = None,
    max_submits_per_minute: Annotated[int | None, typer.Option(
        min=0, help="each session submits at most N runs a minute, a sweep's each counted (a class link's default: "
                    "the server's, 30; 0: no limit)")] = None,
) -> None:
    """A login link: one-time for you (the teacher), or with --uses for a class, whose
    sessions --max-running, --max-waiting, --max-memory-gib and --max-submits-per-minute
    limit."""
    from troupe.cli.config import load_settings
    from troupe.cli.logins import seconds
    from troupe.cli.session import read_session

    settings = load_settings()
    session = read_session(settings.home)
    try:
        if not session:
            raise NoServer(f"no troupe server runs on {settings.home}; start one with `troupe start`")
        body: dict[str, Any] = {"expires_s": seconds(expires), "read_only": read_only}
        if uses is not None:
            body["uses"] = uses
        if max_memory_gib is not None and not math.isfinite(max_memory_gib):
            raise BadOption(f"--max-memory-gib is a number of GiB, not {max_memory_gib}")
        limits = {"max_running": max_running, "max_waiting": max_waiting, "max_memory_gib": max_memory_gib,
                  "max_submits_per_minute": max_submits_per_minute}
        body.update({name: value for name, value in limits.items() if value is not None})
        status, reply = connect.client(None, None).request("POST", "/api/login-links", body)
        if status != 201:
            error = reply.get("error", {}) if isinstance(reply, dict) else {}
            raise CliError(f"the server refused a login link ({status} {error.get('code', '')}): "
                           f"{error.get('message', reply)}")
    except CliError as exc:
        _fail(exc)
    print(reply["login_url"])
    if reply["kind"] != "teacher":
        limited = ", ".join(f"{name.replace('_', ' ')} {value}" for name, value in (reply.get("quotas") or {}).items())
        good_for = "one browser or terminal" if reply["uses"] == 1 else f"{reply['uses']} browsers or terminals"
        print(f"  a {reply['kind']} link, good for {good_for} for {expires}"
              + (f"; each session: {limited}" if limited else ""), file=sys.stderr)
    if browser if browser is not None else reply["kind"] == "teacher":
        import webbrowser

        webbrowser.open(reply["login_url"])


@app.command()
def links(revoke: Annotated[str | None, typer.Option(
        help="revoke the link of this id: no one logs in with it any more, and its sessions end")] = None) -> None:
    """The login links this server made (never their tokens): kind, uses left, expiry."""
    from troupe.cli.runs_cmd import answer, table

    client = connect.client(None, None)
    try:
        if revoke is not None:
            if not revoke.strip():
                raise BadOption("--revoke needs a link's id (troupe links lists them)")
            ended = answer(client.request("DELETE", f"/api/login-links/{urllib.parse.quote(revoke.strip(), safe='')}"),
                           f"revoking link {revoke}")
            print(f"revoked link {revoke}; {len(ended['sessions_ended'])} session(s) it opened ended")
            return
        found = answer(client.request("GET", "/api/login-links"), "listing the login links")["links"]
    except CliError as exc:
        _fail(exc)
    now = time.time()
    rows = [(link["id"], link["kind"], str(link["uses_left"]), str(link["sessions"]),
             "revoked" if link["revoked"] else "expired" if link["expires_at"] < now else
             f"{(link['expires_at'] - now) / 3600:.1f} h left") for link in found]
    print(table(rows, ("ID", "KIND", "USES LEFT", "SESSIONS", "STATE")))


@app.command()
def packs(as_json: Annotated[bool, flag("--json", help="the server's answer as JSON")] = False) -> None:
    """The packs the server loaded (version, digest, node types), then the broken ones with their error."""
    from troupe.cli.runs_cmd import answer, table

    client = connect.client(None, None)
    try:
        found = answer(client.request("GET", "/api/packs"), "listing the packs")
    except CliError as exc:
        _fail(exc)
    if as_json:
        print(json.dumps(found, indent=2))
        return
    rows = [(pack["name"], pack["version"], (pack["digest"] or "")[:12] or "-", pack["source"],
             ", ".join(pack["node_types"])) for pack in found["packs"]]
    print(table(rows, ("PACK", "VERSION", "DIGEST", "FROM", "NODE TYPES")))
    for broken in found["broken"]:
        print(f"broken: {broken['name']}: {broken['error']}")


@app.command()
def token() -> None:
    """Print the bearer token this terminal uses (the server's session token here, or the
    session `troupe login` keeps), for curl: TOKEN=$(troupe token)."""
    client = connect.client(None, None)
    if not client.token:
        _fail(NoServer("no troupe server runs in this TROUPE_HOME and this terminal is not logged in to one; "
                       "start one with `troupe start`, or `troupe login URL`"))
    print(client.token)


@app.command()
def login(url: Annotated[str, typer.Argument(help="the login link you were given, or the server's address")],
          token: Annotated[str | None, typer.Option(help="a teacher's session token instead of a link")] = None,
          ca: Annotated[Path | None, typer.Option(
              "--ca", help="trust this certificate for a server serving https with a self-signed one")] = None,
          name: Annotated[str | None, typer.Option(
              help="the name the teacher sees for this terminal (at most 40 characters, not another's); without "
                   "it: terminal and this machine's address")] = None,
          ) -> None:
    """Log this terminal in to a server on another machine; later commands use it."""
    from troupe.cli.logins import login as log_in

    try:
        raise typer.Exit(log_in(url, token, str(ca.resolve()) if ca else None, name))
    except CliError as exc:
        _fail(exc)


@app.command()
def logout(url: Annotated[str | None, typer.Argument(help="the server (default: the last one logged in to)")]
           = None) -> None:
    """End this terminal's session on the server, and forget it here."""
    from troupe.cli.logins import logout as log_out

    try:
        raise typer.Exit(log_out(url))
    except CliError as exc:
        _fail(exc)


agent_app = typer.Typer(no_args_is_help=True, help="The worker agent: dials out to a control plane, never listens.")
app.add_typer(agent_app, name="agent")


@agent_app.command("start")
def agent_start(
    url: Annotated[str, typer.Option(help="the control plane, as the join command gives it")],
    token: Annotated[str | None, typer.Option(help="a one-time enrollment token (first start only)")] = None,
    name: Annotated[str | None, typer.Option(help="this worker's name")] = None,
    one_shot: Annotated[bool, flag(
        "--one-shot", help="take one run, report it, exit with its outcome (0 succeeded, 1 failed, 2 cancelled, "
                           "3 interrupted, 4 no run came): for a batch job")] = False,
    idle_timeout: Annotated[float, typer.Option(
        min=0.0, help="with --one-shot: seconds to wait for a run before exiting 4")] = 600.0,
    instance: Annotated[str | None, typer.Option(
        help="with --one-shot: this task's id in a batch array ($SLURM_ARRAY_TASK_ID); one join command serves "
             "every task, each connecting as instance ID of the worker")] = None,
    deadline: Annotated[float | None, typer.Option(
        help="when this batch job ends, epoch seconds (default: SLURM_JOB_END_TIME); a run declaring a longer "
             "duration_s is not sent here")] = None,
    unix_socket: Annotated[str | None, typer.Option(
        help="dial the control plane through this Unix socket (an ssh -R forward; the control plane's SSH "
             "sessions set it)")] = None,
    foreground: Annotated[bool, flag(
        "--foreground", help="stay attached to this terminal (a one-shot agent always does)")] = False,
    mount: Annotated[list[str] | None, typer.Option(
        help="LABEL=PATH, repeatable: storage this machine has, reported to the control plane")] = None,
    warm: Annotated[int, typer.Option(
        min=0, max=64, help="keep N run processes forked from a zygote that imported torch, so a run need not "
                            "wait for an interpreter (Linux; the zygote holds a few hundred MB)")] = 0,
    ca: Annotated[str | None, typer.Option(
        "--ca", help="trust this certificate (or authority) for an https control plane with a self-signed "
                     "certificate; kept with the credential")] = None,
    packs: Annotated[list[Path] | None, typer.Option("--packs", exists=True, file_okay=False, help=PACKS_HELP)] = None,
    accept_packs: Annotated[bool, flag(
        "--accept-packs", help="fetch the control plane's packs (code) as its runs need them, checked by digest; "
                               "off: a run needing a pack this machine lacks is not sent here")] = False,
) -> None:
    """Start a worker agent; it goes on in the background unless --foreground."""
    from troupe.cli.agent_cmd import StartOptions
    from troupe.cli.agent_cmd import start as run_agent
    from troupe.cli.config import load_simulated_inventory

    try:
        code = run_agent(url, token, name, load_simulated_inventory(), StartOptions(
            one_shot, idle_timeout, instance, deadline, unix_socket, foreground, tuple(mount or ()), warm,
            str(Path(ca).resolve()) if ca else None, tuple(str(p) for p in packs or ()), accept_packs))
    except CliError as exc:
        _fail(exc)
    raise typer.Exit(code)


@agent_app.command("stop")
def agent_stop(
    name: Annotated[str | None, typer.Option(help="the worker to stop (default: every agent here)")] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for running runs before stopping at once")] = 600.0,
) -> None:
    """Stop the agents running on this machine: no new runs, then stop once the running
    ones have ended (at once past --timeout)."""
    from troupe.cli.agent_cmd import stop as stop_agent

    try:
        raise typer.Exit(stop_agent(name, timeout))
    except CliError as exc:
        _fail(exc)


@agent_app.command("forget")
def agent_forget(
    url: Annotated[str | None, typer.Option(help="only credentials for this control plane")] = None,
    name: Annotated[str | None, typer.Option(help="only this worker's credential")] = None,
) -> None:
    """Drop stored agent credentials."""
    from troupe.cli.agent_cmd import forget

    try:
        raise typer.Exit(forget(url, name))
    except CliError as exc:
        _fail(exc)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
    except CliError as exc:  # pragma: no cover - every command catches its own
        print(f"troupe: {printable(exc.message)}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except UnicodeError as exc:  # an argument with bytes that are not UTF-8 (a file name, a pasted id)
        print(f"troupe: text that is not valid UTF-8 cannot be sent to the server ({exc})", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except OSError as exc:  # the output cannot be written (a full disk); a closed pipe is click's, quietly
        print(f"troupe: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""), file=sys.stderr)
        sys.exit(EXIT_FAILED)


terminal.register(app, connect.client, _fail)

if __name__ == "__main__":
    main()
