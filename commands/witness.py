"""`sandbox-conformance witness`: run the witness suite on this host (no mode logic).

stdout: the promise table (`kept`, `BROKEN: what the task saw` with the remedy for this sandbox kind under
it, `not tested: why`, `not selected` for what --only/--skip left out; conformance/render.py), then a
summary. pytest's own report goes to a log, or to stderr under -v (conformance/output.py).
Exit 0 every witness passed (skips only as gated), 1 a witness went red or a harness error, 2 bad
input, 75 nothing could run (no bwrap and no --launcher, or the launcher exited 75: its sandbox cannot
run on this host or as this user, said once with the launcher's reason)."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox_conformance.conformance import handover, options, output, preconditions, remedies, witnesses
from sandbox_conformance.conformance import settings as settings_mod
from sandbox_conformance.conformance.launch import LauncherKind
from sandbox_conformance.conformance.render import Row, family_of
from sandbox_conformance.conformance.settings import Settings
from sandbox_conformance.conformance.verdicts import Collector, Result, promise_lines

if TYPE_CHECKING:
    from sandbox_conformance.conformance.harness import WitnessSession
    from sandbox_conformance.conformance.plan import Task
from sandbox_conformance.probes.host import Host
from sandbox_conformance.processes import cancel, outputs, owner
from sandbox_conformance.processes.exits import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    Refusal,
    UsageError,
    check_as_user,
)

# The witness suite ships inside the conformance package, one module per group of promise families
# (conformance/witnesses/); pytest collects them by path, in the order they are named.
WITNESS_MODULES = witnesses.PATHS
AUTOLOAD_ENV = "PYTEST_DISABLE_PLUGIN_AUTOLOAD"
MANY_PATHS = 500  # a profile with this many paths gets a line saying the run will take a while
PERTURB_ENV = "SANDBOX_CONFORMANCE_PERTURB"  # comma-separated, for the negative controls (issue 6)

# pytest's own plugins that the witness suite does not use, blocked (`-p no:NAME`): each costs its
# import, its hooks on every test's set-up, call and tear-down, or both (bench/witness_bench.py). The
# suite uses pytest's collection, fixtures, marks, skips, assertion rewriting, output capture and
# terminal report. Among them: `cacheprovider` (the suite keeps no state between runs: `--lf` would
# make a verdict depend on the last one); `unraisableexception`, whose end-of-session gc.collect()
# passes were a fifth of a witness run's CPU (py-spy; a witness judges what the task and the kernel
# did, never a Python finaliser's exception); `logging` and `warnings`, which wrap every test phase;
# `debugging`, which imports pdb. A name a pytest version lacks (bookworm's 7.2 has no `subtests`)
# blocks nothing. `-- PYTEST ARGS` that need a blocked plugin (`--pdb`, `--lf`) are usage errors.
UNNEEDED_PLUGINS = ("cacheprovider", "unraisableexception", "threadexception", "logging", "warnings",
                    "debugging", "faulthandler", "doctest", "unittest", "legacypath", "tmpdir",
                    "monkeypatch", "recwarn", "pastebin", "setuponly", "setupplan", "stepwise", "subtests")


def add_arguments(p: argparse.ArgumentParser) -> None:
    options.add_arguments(p, options.WITNESS)  # conformance/options.py: each option declared once
    # `run` starts this process before it probes and says on this pipe whether to go (runners/native.py
    # Standby). Hidden: it is `run`'s, not a person's.
    p.add_argument(handover.STANDBY_FLAG, type=int, metavar="FD", dest="standby_fd", help=argparse.SUPPRESS)
    p.add_argument(
        "pytest_args", nargs=argparse.REMAINDER, metavar="-- PYTEST ARGS", help="after `--`: passed to pytest"
    )


def not_selected(settings: Settings) -> list[Row]:
    """A row per promise the profile makes that --only/--skip left out: `not selected`, never kept, in
    the profile's order."""
    prof = settings.profile
    made = prof._replace(unselected=frozenset()).promises()
    return [(pid, "not selected", settings.selection.why(pid)) for pid in made if pid in prof.unselected]


def remedies_for(lines: list[Row], sandbox: str) -> dict[str, remedies.Remedy]:
    """The remedy of each promise with a BROKEN row, by promise id (conformance/remedies.py)."""
    out: dict[str, remedies.Remedy] = {}
    for label, verdict, _ in lines:
        pid = family_of(label)
        if verdict == "BROKEN" and pid not in out:
            r = remedies.remedy(pid, sandbox)
            if r is not None:
                out[pid] = r
    return out


def _validate(args: argparse.Namespace) -> Settings:
    """Every option checked before any work starts; the one Settings the plugin then uses."""
    profile, launcher = args.profile, args.launcher
    if getattr(args, "adapter", None):
        if profile or launcher:
            raise UsageError("--adapter sets --profile and --launcher: give either --adapter or those")
        from sandbox_conformance.conformance import adapters

        try:
            resolved = adapters.resolve(args.adapter, as_user=args.as_user)
        except KeyError as e:
            raise UsageError(f"--adapter: {e.args[0]}") from None
        except adapters.Unavailable as e:
            raise Refusal(f"adapter {args.adapter}: not tested: {e}") from None
        profile, launcher = str(resolved.profile), resolved.launcher
        # Our adapters build the tool's configuration from the spec and hand stdin to the tool.
        args.launcher_spec = args.launcher_stdin = True
        # A user-space kernel's adapter says why the host cannot see its tasks (unless the caller did).
        if resolved.host_cannot_observe and not getattr(args, "host_cannot_observe", None):
            args.host_cannot_observe = resolved.host_cannot_observe
    outputs.check_reports(
        [("--junitxml", args.junitxml, False), ("--json", args.json, True),
         ("--log", getattr(args, "log", None), False)],
        [("--profile", profile), ("--expected-skips", args.expected_skips),
         ("--launcher", outputs.launcher_file(launcher))],
    )
    check_as_user(args.as_user, group_by_name=False)
    layout_root = getattr(args, "layout_root", None)
    if layout_root:
        outputs.check_space("--layout-root", layout_root)
    else:
        outputs.check_temp_space()  # where the layouts are made
    try:
        values = options.settings_values(lambda o: getattr(args, o.dest), options.WITNESS)
        return settings_mod.build(**{
            **values,
            # What --adapter resolved (above) stands for the options it sets.
            "profile": profile, "launcher": launcher, "adapter": args.adapter or None,
            "perturb": [*args.perturb, *(p for p in os.environ.get(PERTURB_ENV, "").split(",") if p)],
        })
    except settings_mod.InvalidSettings as e:
        raise UsageError(str(e)) from None


def _count(outcomes: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for o in outcomes:
        out[o] = out.get(o, 0) + 1
    return out


@contextlib.contextmanager
def _no_autoload() -> Iterator[None]:
    """PYTEST_DISABLE_PLUGIN_AUTOLOAD for this process's pytest session only: the variable, not
    pytest 8.4's `--disable-plugin-autoload`, because container mode runs Debian bookworm's pytest
    7.2. The tasks never see it (their launchers get a minimal environment, processes/children.py); it is
    restored after the session."""
    saved = os.environ.get(AUTOLOAD_ENV)
    os.environ[AUTOLOAD_ENV] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(AUTOLOAD_ENV, None)
        else:
            os.environ[AUTOLOAD_ENV] = saved


def _stand_by(fd: int) -> str | None:
    """Wait for `run`'s word (handover.await_go): its findings' record ("" for none) to go, None not
    to. The rest of the suite's own imports come first, so they overlap the run's probes too."""
    try:
        os.fstat(fd)
    except OSError:
        raise UsageError(f"{handover.STANDBY_FLAG} {fd}: not an open descriptor") from None
    import sandbox_conformance.conformance.harness  # noqa: F401  # what _main imports next, imported now
    from sandbox_conformance.conformance import plan

    plan.prepare()  # the witness program's body, packed while the wait is idle (~5 ms of the first launch)
    return handover.await_go(fd)


def _checked_early(args: argparse.Namespace) -> Settings | Exception:
    """A standing-by witness checks its options while `run` probes (~5 ms, the profile parsed), and
    keeps what it found to say it only once told to go: a run that goes another way says nothing. The
    findings `run` hands down come with its word, so they are added then (handover.handed_down)."""
    try:
        return _validate(args)
    except Exception as e:  # raised after the word to go, where _validate would have raised it
        return e


def main(args: argparse.Namespace) -> int:
    early: Settings | Exception | None = None
    if getattr(args, "standby_fd", None) is not None:
        early = _checked_early(args)
        record = _stand_by(args.standby_fd)
        if record is None:
            return EXIT_OK  # the run went another way: nothing was made here, and nothing to say
        if isinstance(early, Settings):
            early = early._replace(preconditions=handover.handed_down(record, early.as_user, os.environ))
    out = output.WitnessOutput.from_args(args)  # its usage errors before any work (conformance/output.py)
    try:
        code = _main(args, out, early)
    except Refusal as e:
        out.refused(e.reason, e.ways_on)
        out.finish(None)  # nothing was tested: pytest's report (if it ran) has nothing to keep
        raise
    except cancel.Cancelled:
        out.finish(None)  # a cancelled run: its log goes with it
        raise
    except BaseException:
        out.finish(EXIT_FAIL)  # a crash: keep pytest's report, and name it
        raise
    out.finish(code)
    return code


def _main(args: argparse.Namespace, out: output.WitnessOutput,
          early: Settings | Exception | None = None) -> int:
    if isinstance(early, Exception):
        raise early
    settings = _validate(args) if early is None else early
    launcher = settings.launcher if settings.launcher.kind is not LauncherKind.reference else None
    if launcher is None and Host().which("bwrap") is None:
        raise Refusal(
            "no bwrap on PATH and no --launcher: there is no sandbox to launch tasks in",
            ways_on=["apt-get install bubblewrap", "or test your own sandbox: --launcher 'PREFIX'"],
        )
    fs = settings.profile.filesystem
    paths = sum(len(x) for x in (fs.read_only, fs.masked, fs.writable, fs.absent, fs.hidden, fs.scratch))
    if paths >= MANY_PATHS:
        # Said before the long part, which prints nothing until the table (issue 28: 2,000 read-only
        # paths, 158 s of silence). Measured here: the judging is linear now (tests/test_many_paths.py),
        # and a sandbox's own setup of thousands of mounts is not (bwrap took 12 s for 2,000 binds).
        print(f"sandbox-conformance witness: {paths} paths in profile {settings.profile.name}: the launch "
              f"and ~{3 * paths} witnesses take a while (if the launch times out, raise "
              f"--launch-timeout, now {settings.timeout:g} s)", file=sys.stderr, flush=True)
    if launcher is None and settings.preconditions is None:
        # The precondition probes' trial runs while the rest is imported and the host swept: the first
        # task's launch waits for it (conformance/preconditions.py).
        preconditions.prefetch(args.as_user)
    # What a SIGKILLed run left (processes/owner.py), said here on our stderr: once pytest starts, its
    # output (and the layout's own sweep with it) goes to the log.
    owner.sweep_once()
    from sandbox_conformance.conformance.harness import WitnessSession

    session = WitnessSession(
        settings.profile,
        settings.launcher,
        as_user=settings.as_user,
        timeout=settings.timeout,
        perturbations=settings.perturbations,
        preconditions=settings.preconditions,
        unobservable=settings.host_cannot_observe,
        harness_leaf=settings.harness_leaf,
        launcher_env=settings.launcher_env,
        layout_root=settings.layout_root,
    )
    with session:
        session.start()  # the main task launches while pytest is imported (WitnessSession.start)
        return _session(args, out, settings, session)


def _pytest_argv(args: argparse.Namespace, junit: Path | None = None) -> list[str]:
    """pytest's arguments for the witness session: the witness modules, the plugins it needs and no
    others, no ini file of the caller's, per-test timeouts above the per-launch one, then the user's
    own arguments after `--`. `junit`: where pytest writes the JUnit XML (a temporary file beside
    --junitxml's, renamed into place once the run is over: outputs.commit)."""
    extra = list(args.pytest_args or [])
    if extra[:1] == ["--"]:
        extra = extra[1:]
    # Only the plugins the suite needs, named (`-p`), with entry-point autoload off (_no_autoload): a
    # pytest plugin someone installed beside us (a reorderer, a rerunner, one that skips) cannot
    # change a verdict, and pytest does not read every installed distribution's metadata to find
    # plugins (bench/witness_bench.py measures the difference).
    argv = [
        *map(str, WITNESS_MODULES),
        "-p",
        "pytest_timeout",
        "-p",
        "sandbox_conformance.conformance.plugin",
        *(a for name in UNNEEDED_PLUGINS for a in ("-p", f"no:{name}")),
        *(() if args.junitxml else ("-p", "no:junitxml")),
        "-c",
        os.devnull,
        # conformance/ as the rootdir: node ids read `witnesses/reach.py::test_...`
        # (conformance/controls.py names them so).
        "--rootdir",
        str(witnesses.DIR.parent),
        "-o",
        "python_files=" + " ".join(witnesses.MODULES),
        "-o",
        # pytest's own per-test bound, above the per-launch one (a TCG guest's default is longer).
        f"timeout={int(args.launch_timeout or settings_mod.default_timeout()) + 60}",
        # Plain asserts: every witness's assert carries its own message, naming what the task saw
        # (tests/test_records.py checks), and that first line is the verdict's detail either way;
        # rewriting added a hook to every import and a wrapper to every test: ~15 ms of a witness
        # run (bench/). `-- --assert=rewrite` brings pytest's introspection back to the log.
        "--assert=plain",
        # Python's own tracebacks in the log: pytest's long form shows each frame's arguments (the
        # repr of a whole task document, rebuilt for every failure) and its short form still parses
        # the test module's source for each one; with 2,000 read-only paths, minutes (issue 28).
        # `-- --tb=long` brings pytest's back.
        "--tb=native",
        "-rfEs",
    ]
    if args.junitxml:
        argv += ["--junitxml", str(junit or Path(args.junitxml).resolve())]
    argv += extra

    return argv


def _document(args: argparse.Namespace, settings: Settings, code: int, rc: int,
              lines: list[Row], results: list[Result], skip_problem: str | None,
              tasks: list[Task], launcher_name: str, remedy: dict[str, remedies.Remedy],
              launches: int = 0, summary: str = "", problems: Sequence[str] = ()) -> dict[str, Any]:
    """The witness report (`--json`; docs/json-documents.md): every promise with its id, tests and (when
    BROKEN) remedy, and every task with what it saw and what the host saw of it; the summary line and
    the problems printed after the table, as printed, so `run`'s verdict document (and mr-check through
    it) carries them without reading stdout."""
    perturbed = sorted(settings.perturbations)
    counts = _count(v for _, v, _ in lines)
    prof = settings.profile
    return {
        "version": 1,
        "exit": code,
        "profile": prof.name,
        "profile_source": prof.source,
        "launcher": launcher_name,
        "sandbox": settings.sandbox_kind,
        "as_user": args.as_user,
        "perturbations": perturbed,
        "selection": settings.selection.to_json(),
        "summary": {"kept": counts.get("kept", 0), "broken": counts.get("BROKEN", 0),
                    "not_tested": counts.get("not tested", 0), "not_selected": counts.get("not selected", 0),
                    "pytest_exit": rc, "line": summary},
        "problems": list(problems),
        "promises": [
            {
                "id": family_of(label),
                "promise": label,
                "verdict": v,
                "detail": d,
                "remedy": remedy[family_of(label)].to_json()
                if v == "BROKEN" and family_of(label) in remedy else None,
                "tests": [r._asdict() for r in results if r.label == label],
            }
            for label, v, d in lines
        ],
        "expected_skips_problem": skip_problem,
        # Every launch of a task the run made: the main one per session, and the lifecycle and terminal
        # promises' own (bench/run_bench.py's floor is one bare launch per launch made).
        "launches": launches,
        "tasks": [
            {
                "launcher": t.launcher,
                "argv": list(t.argv),
                "observations": dict(t.doc),
                # the task's cgroup leaf as the host saw it (None: no leaf)
                "cgroup": dict(t.cgroup) if t.cgroup is not None else None,
                # the task's process as the host's kernel showed it (conformance/observer.py)
                "host_view": t.seen.to_json() if t.seen is not None else None,
                "host_view_missing": t.unobserved or t.unseen,
                "left_running": list(t.survivors),
                # what the sandbox's other processes in the task's pid namespace, and any that entered
                # it, came to hold after the handshake
                "held_late": list(t.held_late),
                # where the launcher's secret showed up after the handshake (a process that entered since)
                "secret_late": list(t.secret_late),
            }
            for t in tasks
        ],
    }


def _session(args: argparse.Namespace, out: output.WitnessOutput, settings: Settings,
             session: WitnessSession) -> int:
    # pytest writes the JUnit XML to a file beside --junitxml's, renamed over it once the run is over:
    # a reader never sees half of one, and a run that fails to write it keeps the previous one.
    junit = outputs.temp_beside(args.junitxml) if args.junitxml else None
    try:
        return _pytest_session(args, out, settings, session, junit)
    finally:
        if junit is not None:
            junit.unlink(missing_ok=True)


def _pytest_session(args: argparse.Namespace, out: output.WitnessOutput, settings: Settings,
                    session: WitnessSession, junit: Path | None) -> int:
    prof = settings.profile
    launcher = settings.launcher if settings.launcher.kind is not LauncherKind.reference else None
    import pytest

    from sandbox_conformance.conformance import plugin

    argv = _pytest_argv(args, junit)

    collector = Collector()
    # The settings were built and checked above: the plugin takes them as they are (plugin.Preset)
    # instead of parsing `--sbxc-*` options a second time.
    preset = plugin.Preset(settings, session)
    # pytest's report goes to the log, or to stderr under -v: stdout is the promise table.
    # Everything imported so far lives as long as the process: out of the collector's way, so the
    # collections pytest's allocations trigger walk only what the session made.
    gc.freeze()
    with out.pytest_report(), _no_autoload():
        rc = int(pytest.main(argv, plugins=[collector, preset]))
    # pytest turns a SIGTERM/SIGINT/SIGHUP (a KeyboardInterrupt) into an interrupted session with its
    # fixtures torn down: the run ends cancelled, not as a red suite (processes/cancel.py).
    cancel.check()
    if collector.unavailable is not None:
        # The launcher said its sandbox cannot run here (exit 75): nothing was tested, so no table of
        # harness errors, one per witness; the reason once, and 75 (commands/cli.py).
        raise Refusal(collector.unavailable)
    results = list(collector.results.values())
    lines = promise_lines(results) + not_selected(settings)
    remedy = remedies_for(lines, settings.sandbox_kind)
    config = collector.config

    skip_problem = plugin.expected_skip_problems(config) if config is not None else None
    harness = [r.detail for r in results if r.outcome == "error"]
    ran = [r for r in results if r.outcome != "not_run"]
    if rc == 0 and ran:
        code = EXIT_OK
    elif rc in (0, 5) and not ran:
        print(
            "sandbox-conformance witness: no witness ran (all deselected or none collected)", file=sys.stderr
        )
        code = EXIT_FAIL
    elif rc == 4:
        return EXIT_USAGE  # pytest refused the `-- PYTEST ARGS`: one line, no table (output.finish)
    else:
        code = EXIT_FAIL
    perturbed = sorted(settings.perturbations)
    counts = _count(v for _, v, _ in lines)
    launcher_name = launcher.name if launcher else "reference launcher (bwrap)"
    # The summary line, `witness: N kept, N BROKEN, N not tested (...): PASS|FAIL [...]`, is parsed
    # (scripts, tests, and mrcheck/tiers.py when a run left no verdict document with it; the JSON
    # report carries it as `summary.line`): its shape stays; only the verdict word is coloured on a
    # terminal. A selection (--only/--skip) adds `, N not selected` after `not tested`.
    unselected = counts.get("not selected", 0)
    head = (
        f"witness: {counts.get('kept', 0)} kept, {counts.get('BROKEN', 0)} BROKEN, "
        f"{counts.get('not tested', 0)} not tested{f', {unselected} not selected' if unselected else ''} "
        f"(profile {prof.name}, {launcher_name}{', as ' + args.as_user if args.as_user else ''}"
        f"{', perturbed ' + ','.join(perturbed) if perturbed else ''})"
    )
    # Promises are families of witnesses (pytest counts the witnesses): say both, so "3 not
    # tested" beside pytest's "5 skipped" needs no explaining.
    tail = (
        f"[{len(results)} witnesses: "
        + ", ".join(f"{n} {o}" for o, n in sorted(_count(r.outcome for r in results).items()))
        + "]"
    )
    problems = [f"expected skips: {skip_problem}"] if skip_problem else []
    problems += harness[:1]  # "harness error: <launcher>: what went wrong"
    # The reports go to their files before the verdict is printed: one that cannot be written (a full
    # disk, EIO) is a failure the summary says, never a traceback after a PASS. The JUnit XML first,
    # so the JSON report says the code, the problems and the summary line that are printed.
    written = ""
    if junit is not None:
        written = _commit_junit(junit, args.junitxml, rc)
    if written:
        problems.append(written)
        code = EXIT_FAIL
    text = None
    if args.json:
        tasks = plugin.tasks(config) if config is not None else []
        doc = _document(args, settings, code, rc, lines, results, skip_problem, tasks, launcher_name, remedy,
                        session.launches, summary=f"{head}: {_word(code)} {tail}", problems=problems)
        text = json.dumps(doc, indent=2, default=str)
        if args.json != "-" and not written:
            try:
                outputs.write_text(args.json, text + "\n")
            except OSError as e:
                # No report, so nothing disagrees with the summary printed below.
                problems.append(f"--json {args.json}: not written: {e.strerror or e}")
                code = EXIT_FAIL
    out.report(lines, problems=problems, head=head, word=_word(code), tail=tail,
               remedies={pid: r.line() for pid, r in remedy.items()})
    if text is not None and args.json == "-":
        print(text)
    return code


def _word(code: int) -> str:
    return "PASS" if code == EXIT_OK else "FAIL"


def _commit_junit(junit: Path, target: str, rc: int) -> str:
    """pytest's JUnit XML renamed into place; what went wrong instead, or "". pytest says nothing when
    it cannot write it: an empty file, or its internal error (exit 3), is a report not written."""
    try:
        if rc == 3 or junit.stat().st_size == 0:
            return f"--junitxml {target}: not written (pytest could not write it: its report says why)"
        outputs.commit(junit, target)
    except OSError as e:
        return f"--junitxml {target}: not written: {e.strerror or e}"
    return ""
