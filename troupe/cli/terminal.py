"""The commands that look after runs, sweeps and studies from a terminal: ``ls``,
``show``, ``attach``, ``logs``, ``cancel``, ``wait``, ``rm``, ``tag``, ``note``, ``compare``,
``workers``, ``queues``, ``sweep ...``, ``study ...``. ``troupe.cli.main`` registers them on its
app (``register``); the work is in ``runs_cmd``, ``inspect_cmd``, ``sweeps_cmd`` and
``workers_cmd`` (``workers add``: an enrollment; revoking stays in the browser)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from troupe.cli import connect
from troupe.cli.errors import CliError
from troupe.cli.flags import flag
from troupe.cli.render import output_form

Client = Callable[[str | None, int | None], Any]


def _run_ids(incomplete: str) -> list[str]:
    """Run ids for shell completion, from the running server (none when it is down)."""
    try:
        status, body = connect.client(None, None).request("GET", "/api/runs?limit=100", timeout=2.0)
    except Exception:  # completion never fails the shell
        return []
    return [r["id"] for r in (body or {}).get("runs", []) if status == 200 and r["id"].startswith(incomplete)]


RunId = Annotated[str, typer.Argument(help="a run id, or a unique prefix of it (4+ characters)",
                                      autocompletion=_run_ids)]
RunIds = Annotated[list[str], typer.Argument(help="run ids (or unique prefixes, 4+ characters)",
                                             autocompletion=_run_ids)]
SweepId = Annotated[str, typer.Argument(help="a sweep id, or a unique prefix of it (4+ characters)")]
StudyId = Annotated[str, typer.Argument(help="a study id, or a unique prefix of it (4+ characters)")]
AsJson = Annotated[bool, flag("--json", help="print the API's own objects, for scripts")]
Quiet = Annotated[bool, flag("-q", "--quiet", help="ids only, one a line, newest first (for scripts)")]
Limit = Annotated[int | None, typer.Option(min=1, help="only the newest N")]
Host = Annotated[str | None, typer.Option(help="server host (default: the last `troupe start`)")]
Port = Annotated[int | None, typer.Option(min=1, max=65535, help="server port (default: the last `troupe start`)")]
Spec = Annotated[str, typer.Argument(help="a JSON file: the request's body")]
LOGS_JSON_HELP = ("one event a line, as the API gives it; as the text does, it leaves out the run's queued event, "
                  "its artifacts and the files it read (provenance), and keeps 20 metric points a series "
                  "(--metrics: all of them; --all: every event)")
Sets = Annotated[list[str] | None, typer.Option("--set", help="change a param of the base graph: NODE.PARAM=VALUE "
                                                               "(repeatable)")]


def register(app: typer.Typer, client: Client, fail: Callable[[CliError], None]) -> None:
    """Adds the commands to ``app``; ``client(host, port)`` reaches the server."""

    def done(work: Callable[[], int]) -> None:
        try:
            code = work()
        except CliError as exc:
            fail(exc)
            return
        raise typer.Exit(code)

    _runs(app, client, done)
    _follow(app, client, done)
    _inspect(app, client, done)
    sweep_app = typer.Typer(no_args_is_help=True, help="Sweeps: one graph queued as many runs, ranked.")
    study_app = typer.Typer(no_args_is_help=True, help="Studies: variants x repeats under a server-kept budget.")
    app.add_typer(sweep_app, name="sweep")
    app.add_typer(study_app, name="study")
    _sweeps(sweep_app, client, done)
    _studies(study_app, client, done)


def _runs(app: typer.Typer, client: Client, done: Callable[[Callable[[], int]], None]) -> None:
    from troupe.cli import runs_cmd

    @app.command(name="ls")
    def ls_(status: Annotated[str | None, typer.Option(
                help="queued, running, succeeded, failed, cancelled, interrupted or disconnected; several joined "
                     "by commas (queued,running)")] = None,
            sweep: Annotated[str | None, typer.Option(help="the runs of one sweep")] = None,
            study: Annotated[str | None, typer.Option(help="the runs of one study")] = None,
            search: Annotated[str | None, typer.Option(help="name, id, tag or note")] = None,
            tag: Annotated[str | None, typer.Option(help="the runs tagged so (troupe tag)")] = None,
            limit: Annotated[int, typer.Option(min=1, max=500, help="how many runs, newest first")] = 50,
            cursor: Annotated[str | None, typer.Option(help="the page after an earlier one (it prints the cursor "
                                                            "to use on stderr)")] = None,
            full: Annotated[bool, flag("--full", help="whole ids (the table shows 8 characters)")] = False,
            sort: Annotated[str | None, typer.Option(help="order by a metric's newest value, lowest first")] = None,
            desc: Annotated[bool, flag("--desc", help="with --sort: highest first")] = False,
            params: Annotated[bool, flag("--params", help="a column per swept param (a sweep's runs)")]
            = False,
            mine: Annotated[bool, flag("--mine", help="only the runs this login submitted (its sweeps' "
                                                              "and studies' runs too)")] = False,
            where: Annotated[str | None, typer.Option(help="a filter: KEY OP VALUE joined by and / or, e.g. "
                                                           "\"adam.lr = 0.01 and metric.val_loss < 0.1\" "
                                                           "(docs/runs.md, Finding runs)")] = None,
            group_by: Annotated[str | None, typer.Option("--group-by", help="a row per value of this key (a param, "
                                                                            "type, status, tag, by, sweep, ...)")]
            = None,
            metric: Annotated[str | None, typer.Option(help="with --group-by: each group's mean, min, max and std of "
                                                            "this series' newest values")] = None,
            keys: Annotated[bool, flag("--keys", help="the keys --where and --group-by can name, with how "
                                                              "many runs have each")] = False,
            as_json: AsJson = False, quiet: Quiet = False, host: Host = None, port: Port = None) -> None:
        """List runs, newest first, with who submitted each; find them by what they were (--where), fold
        them by a key (--group-by)."""
        from troupe.cli import find_cmd

        form = output_form(quiet, as_json, "table", "ids")
        asked = runs_cmd.Listing(status, sweep, study, search, tag, limit, cursor, form, full, sort, desc, params,
                                 mine, where)
        if metric is not None and group_by is None:
            done(lambda: find_cmd.usage("--metric goes with --group-by"))
        elif keys:
            done(lambda: find_cmd.list_keys(client(host, port), form))
        elif group_by is not None:
            done(lambda: find_cmd.group_runs(client(host, port), asked, group_by, metric))
        else:
            done(lambda: runs_cmd.list_runs(client(host, port), asked))


def _follow(app: typer.Typer, client: Client, done: Callable[[Callable[[], int]], None]) -> None:
    from troupe.cli import logs_cmd, runs_cmd

    @app.command()
    def show(run_id: RunId, as_json: AsJson = False, artifacts: Annotated[bool, flag(
                 "--artifacts", help="list every file it keeps, each checkpoint too (else they are one line)")] = False,
             host: Host = None, port: Port = None) -> None:
        """Everything about one run: status, where it ran, the code it ran, params, metrics, artifacts."""
        done(lambda: runs_cmd.show_run(client(host, port), run_id, as_json, artifacts))

    @app.command()
    def attach(run_id: RunId, timeout: Annotated[float | None, typer.Option(
                   min=0, help="stop following after S seconds (exit 1; the run goes on)")] = None, host: Host = None,
               port: Port = None) -> None:
        """Follow a run as `troupe run` does, to its result."""
        done(lambda: runs_cmd.attach(client(host, port), run_id, timeout))

    @app.command()
    def logs(run_id: RunId,
             follow: Annotated[bool, flag("-f", "--follow", help="stream live until the run ends")] = False,
             tail: Annotated[int | None, typer.Option(min=1, help="the last N entries")] = None,
             console: Annotated[bool, flag("--console", help="only what the run printed")] = False,
             metrics: Annotated[bool, flag("--metrics", help="every metric point (else 20 a series, or one "
                                                                     "a second live)")] = False,
             every: Annotated[bool, flag("--all", help="every event the run has, every metric point "
                                                               "among them")] = False,
             as_json: Annotated[bool, flag("--json", help=LOGS_JSON_HELP)] = False,
             debug: Annotated[bool, flag("--debug", help="tracebacks with troupe's own frames too")] = False,
             host: Host = None, port: Port = None) -> None:
        """What happened to a run: its nodes' starts and ends, failures with their traceback, logs,
        warnings, metric points and console lines, in order (--all: every event)."""
        done(lambda: logs_cmd.logs(client(host, port), run_id, follow, tail, console, as_json, metrics, every,
                                   debug))

    @app.command()
    def cancel(run_ids: RunIds, as_json: AsJson = False, host: Host = None, port: Port = None) -> None:
        """Cancel runs (a queued one leaves its queue, a running one stops)."""
        done(lambda: runs_cmd.cancel(client(host, port), run_ids, as_json))

    @app.command()
    def wait(run_ids: RunIds, timeout: Annotated[float | None, typer.Option(
                 min=0, help="stop waiting after S seconds: exit 1, as the runs have not succeeded yet")] = None,
             as_json: Annotated[bool, flag("--json", help="print each run's id and status at the end "
                                                                  "(running, when the wait timed out)")] = False,
             host: Host = None, port: Port = None) -> None:
        """Wait for runs to end; exit 0 only when all succeeded."""
        done(lambda: runs_cmd.wait(client(host, port), run_ids, timeout, as_json))

    @app.command()
    def rm(run_ids: RunIds, host: Host = None, port: Port = None) -> None:
        """Delete finished runs (their metrics, events and artifact rows)."""
        done(lambda: runs_cmd.remove(client(host, port), run_ids))


def _inspect(app: typer.Typer, client: Client, done: Callable[[Callable[[], int]], None]) -> None:
    from troupe.cli import inspect_cmd

    @app.command(context_settings={"ignore_unknown_options": True})
    def tag(run_id: RunId, changes: Annotated[list[str], typer.Argument(
                help="+name adds a tag, -name removes one (a bare name adds it)")],
            as_json: AsJson = False, host: Host = None, port: Port = None) -> None:
        """Add and remove a run's tags: troupe tag ID +best -old."""
        done(lambda: inspect_cmd.tag(client(host, port), run_id, changes, as_json))

    @app.command()
    def note(run_id: RunId, text: Annotated[str, typer.Argument(help="the note; \"\" clears it")],
             as_json: AsJson = False, host: Host = None, port: Port = None) -> None:
        """Set a run's note."""
        done(lambda: inspect_cmd.note(client(host, port), run_id, text, as_json))

    @app.command()
    def compare(run_ids: RunIds, as_json: AsJson = False, host: Host = None, port: Port = None) -> None:
        """Runs side by side: the params that differ, each series' last and best value with its step."""
        done(lambda: inspect_cmd.compare(client(host, port), run_ids, as_json))

    workers_app = typer.Typer(help="The workers: state, cards, slots busy, when each was last heard, the runs on "
                                   "it; `troupe workers add NAME` enrolls one.")
    app.add_typer(workers_app, name="workers")

    @workers_app.callback(invoke_without_command=True)
    def workers(ctx: typer.Context, as_json: AsJson = False, host: Host = None, port: Port = None) -> None:
        """The workers: state, cards, slots busy, when each was last heard, the runs on it."""
        if ctx.invoked_subcommand is None:
            done(lambda: inspect_cmd.workers(client(host, port), as_json))

    @workers_app.command("add")
    def workers_add(name: Annotated[str, typer.Argument(help="the worker's name (letters, digits, - _ .)")],
                    uses: Annotated[int, typer.Option(min=1, max=1000, help="agents the token enrolls (an array of "
                                                                               "one-shot agents: one each)")] = 1,
                    ttl: Annotated[float, typer.Option(min=1, help="seconds the token stays good")] = 86400,
                    as_json: AsJson = False, host: Host = None, port: Port = None) -> None:
        """Enroll a worker: prints the command that starts its agent on that machine."""
        from troupe.cli import workers_cmd

        done(lambda: workers_cmd.add(client(host, port), name, uses, ttl, as_json))

    @app.command()
    def queues(as_json: AsJson = False, host: Host = None, port: Port = None) -> None:
        """Each queue key: slots busy, runs waiting, what the first waiting run waits for."""
        done(lambda: inspect_cmd.queues(client(host, port), as_json))


def _sweeps(app: typer.Typer, client: Client, done: Callable[[Callable[[], int]], None]) -> None:
    from troupe.cli import sweeps_cmd

    @app.command("start")
    def start(spec: Spec, wait: Annotated[bool, flag(
                  "--wait/--detach", help="follow it to its end (exit 0 when every run succeeded), or detach")] = True,
              as_json: AsJson = False,
              sets: Sets = None, host: Host = None, port: Port = None) -> None:
        """Queue a sweep and follow it: done/total and the best so far."""
        done(lambda: sweeps_cmd.sweep_start(client(host, port), spec, not wait, as_json, sets or ()))

    @app.command("ls")
    def ls_(as_json: AsJson = False, quiet: Quiet = False, limit: Limit = None, host: Host = None,
            port: Port = None) -> None:
        """List sweeps, newest first."""
        done(lambda: sweeps_cmd.sweep_ls(client(host, port), output_form(quiet, as_json, "table", "ids"), limit))

    @app.command("show")
    def show(sweep_id: SweepId, as_json: AsJson = False, host: Host = None, port: Port = None) -> None:
        """A sweep's variants, ranked."""
        done(lambda: sweeps_cmd.sweep_show(client(host, port), sweep_id, as_json))

    @app.command("csv")
    def csv(sweep_id: SweepId, output: Annotated[str | None, typer.Option(
                "-o", "--output", help="the file to write (default: standard output)")] = None,
            host: Host = None, port: Port = None) -> None:
        """A sweep's ranked variants as CSV."""
        done(lambda: sweeps_cmd.sweep_csv(client(host, port), sweep_id, output))

    @app.command("cancel")
    def cancel(sweep_id: SweepId, host: Host = None, port: Port = None) -> None:
        """Cancel a sweep's active runs."""
        done(lambda: sweeps_cmd.sweep_cancel(client(host, port), sweep_id))


def _studies(app: typer.Typer, client: Client, done: Callable[[Callable[[], int]], None]) -> None:
    from troupe.cli import sweeps_cmd

    @app.command("start")
    def start(spec: Spec, wait: Annotated[bool, flag(
                  "--wait/--detach",
                  help="follow it until it finishes or its budget halts it (exit 0; 1 if cancelled), or detach")]
              = True, as_json: AsJson = False, sets: Sets = None, host: Host = None, port: Port = None) -> None:
        """Start a study; the server runs it under its budget."""
        done(lambda: sweeps_cmd.study_start(client(host, port), spec, as_json, wait, sets or ()))

    @app.command("ls")
    def ls_(as_json: AsJson = False, quiet: Quiet = False, limit: Limit = None, host: Host = None,
            port: Port = None) -> None:
        """List studies, newest first."""
        done(lambda: sweeps_cmd.study_ls(client(host, port), output_form(quiet, as_json, "table", "ids"), limit))

    @app.command("show")
    def show(study_id: StudyId, as_json: AsJson = False, host: Host = None, port: Port = None) -> None:
        """A study's ranking and what it used."""
        done(lambda: sweeps_cmd.study_show(client(host, port), study_id, as_json))

    @app.command("resume")
    def resume(study_id: StudyId,
               max_runs: Annotated[int | None, typer.Option("--max-runs", min=0, help="runs in all")] = None,
               max_active_seconds: Annotated[float | None, typer.Option(
                   "--max-active-seconds", min=0, help="seconds the study may be active in all")] = None,
               max_parallel_runs: Annotated[int | None, typer.Option(
                   "--max-parallel-runs", min=1, help="runs at once")] = None,
               max_run_seconds: Annotated[float | None, typer.Option(
                   "--max-run-seconds", min=0, help="seconds one run may take")] = None,
               host: Host = None, port: Port = None) -> None:
        """Resume a halted study with a raised budget (each option is one of its budgets)."""
        done(lambda: sweeps_cmd.study_resume(client(host, port), study_id, {
            "max_runs": max_runs, "max_active_seconds": max_active_seconds, "max_parallel_runs": max_parallel_runs,
            "max_run_seconds": max_run_seconds}))

    @app.command("cancel")
    def cancel(study_id: StudyId, host: Host = None, port: Port = None) -> None:
        """Cancel a study and its active runs (exit 0 too when it had already finished)."""
        done(lambda: sweeps_cmd.study_cancel(client(host, port), study_id))
