"""pytest plugin (pytest11 entry point `sandbox_conformance`): run the witness suite, or launch live
tasks through your own launcher from your own tests.

Options (each mirrored by an ini key where it makes sense to pin it in a project):
  --sbxc-profile FILE      the profile (default: the embedded reference profile)     ini: sbxc_profile
  --sbxc-launcher PREFIX   external launcher prefix, or entry-point:NAME (default: reference bwrap)
                                                                                     ini: sbxc_launcher
  --sbxc-as-user NAME      (root) launch tasks as this unprivileged user
  --sbxc-launch-timeout S  per launch (--sbxc-timeout still works)     ini: sbxc_launch_timeout
  --sbxc-require           every witness skip is a failure (also SANDBOX_CONFORMANCE_REQUIRE=1)
  --sbxc-expected-skips F  `test id | reason` lines: the run fails unless exactly these witnesses skip
  --sbxc-launcher-env N=V  set N in the launcher's minimal environment (repeatable)
  --sbxc-layout-root DIR   make each task's layout under DIR (default $TMPDIR or /tmp)
  --sbxc-host-cannot-observe WHY  the launcher's tasks are out of this host's sight: kernel-state
                           promises are `not tested: WHY`
  --sbxc-only ID[,ID]      test only these promises (conformance/promises.py ids); repeatable
  --sbxc-skip ID[,ID]      leave these promises out; repeatable
The options carry an `sbxc-` prefix because this plugin is loaded into EVERY pytest session of an
environment it is installed in, and a bare `--profile` collides with other plugins (pytest-profiling).
`sandbox-conformance witness` offers the bare names.

Fixtures: `sbxc_settings`, `sbxc_session` (session: the configured profile and launcher, one layout),
`sbxc_task` (its one live task, launched once), `sbxc_launch` (a factory: launch a live task with
another profile/launcher/perturbation; everything it made is removed after the test).

Gating applies only to items marked `witness` (the suite's tests, or yours): the project's own tests
and any other suite in the session are left alone."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from _pytest._code.code import ExceptionRepr  # the failure report pytest's junitxml reads (7.2 to 9.x)

from sandbox_conformance.conformance import options, promises, remedies, render, verdicts, witnesses
from sandbox_conformance.conformance import profile as profile_mod
from sandbox_conformance.conformance import settings as settings_mod
from sandbox_conformance.conformance.harness import WitnessSession
from sandbox_conformance.conformance.launch import (
    Launcher,
    LauncherKind,
    NoObservation,
    SandboxUnavailable,
    external,
)
from sandbox_conformance.conformance.options import REQUIRE_ENV
from sandbox_conformance.conformance.plan import Task
from sandbox_conformance.conformance.settings import Settings, read_expected_skips, skip_key
from sandbox_conformance.probes.finding import Finding

if TYPE_CHECKING:
    from pluggy import Result  # pluggy >= 1.1; only mypy reads it (annotations are not evaluated)

__all__ = ["REQUIRE_ENV", "Settings", "read_expected_skips", "settings", "skip_key"]
MARKER = "witness"
VERDICTS = "sandbox-conformance-verdicts"  # the promise rows' collector of a plain pytest run

_settings_key = pytest.StashKey[Settings]()
_preconditions_key = pytest.StashKey[dict[str, Finding]]()
_skipped_key = pytest.StashKey[dict[str, str]]()
_tasks_key = pytest.StashKey[list[Task]]()
_session_key = pytest.StashKey[WitnessSession]()
_unselected_key = pytest.StashKey[frozenset[str]]()  # skip keys of witnesses --only/--skip left out


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sandbox-conformance", "sandbox-conformance witness suite")
    options.add_pytest_options(group, parser)  # conformance/options.py: each option declared once


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(family): a witness of one promise family of the sandbox profile "
        "(deselected when the profile makes no such promise; skips gated by --sbxc-require)",
    )
    config.addinivalue_line(
        "markers",
        "cgroup: a witness of the per-task cgroup leaf and its limits (select with `-m cgroup`)",
    )
    config.addinivalue_line(
        "markers",
        "harness_leaf: a witness of what the harness does with a leaf it made (deselected for a "
        "launcher that keeps its own cgroups)",
    )
    config.stash[_skipped_key] = {}
    config.stash[_tasks_key] = []
    try:  # the ids now, a usage error (exit 4) before collection; the profile's part waits for settings()
        promises.select(config.getoption("sbxc_only") or (), config.getoption("sbxc_skip") or ())
    except promises.UnknownPromise as e:
        named = str(e).replace("--only", "--sbxc-only").replace("--skip", "--sbxc-skip")
        raise pytest.UsageError(named) from None
    if _settings_key not in config.stash:
        # A plain pytest run: its terminal summary gets the promise rows the witness command prints
        # (pytest_terminal_summary, below). The witness command follows the reports itself.
        config.pluginmanager.register(verdicts.Collector(), VERDICTS)
    if _settings_key in config.stash:  # handed over by the witness command (Preset)
        preset = config.stash[_settings_key]
        if preset.preconditions is None:
            from sandbox_conformance.conformance.preconditions import needed, prefetch

            prefetch(preset.as_user, needed(preset.launcher.kind is LauncherKind.reference))
    elif _active(config):
        from sandbox_conformance.conformance.preconditions import needed, prefetch

        prefetch(config.getoption("sbxc_as_user"), needed(not _option(config, "sbxc_launcher")))


def _option(config: pytest.Config, name: str) -> Any:
    value = config.getoption(name, default=None)
    return value if value is not None else config.getini(name)


class Preset:
    """Registered by `sandbox-conformance witness` with the Settings it already built and validated
    from its own options, so the plugin does not parse them a second time, and the session it opened
    from them (its main task already launching: WitnessSession.start), which it also closes."""

    def __init__(self, settings: Settings, session: WitnessSession | None = None) -> None:
        self.settings, self.session = settings, session

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        config.stash[_settings_key] = self.settings
        if self.session is not None:
            config.stash[_session_key] = self.session


def settings(config: pytest.Config) -> Settings:
    """Resolved once, on first use: a session that never touches a witness never loads a profile."""
    if _settings_key in config.stash:
        return config.stash[_settings_key]
    try:
        values = options.settings_values(
            lambda o: _option(config, o.pytest_dest) if o.ini else config.getoption(o.pytest_dest),
            options.PLUGIN)
        s = settings_mod.build(
            **{**values, "launcher": values["launcher"] or None,
               "launch_timeout": values["launch_timeout"] or config.getini("sbxc_timeout")},
            # A sandbox's own test suite keeps the interface it was written against: the spec named in
            # the launcher's environment, the program on stdin. The `witness` command is where a
            # launch is made to look like a workload (docs/threat-model.md).
            launcher_spec=True,
            launcher_stdin=True,
        )
    except settings_mod.InvalidSettings as e:
        # The plugin's options carry the sbxc- prefix: name them as the user typed them.
        msg = str(e)
        raise pytest.UsageError("--sbxc-" + msg[2:] if msg.startswith("--") else msg) from None
    config.stash[_settings_key] = s
    return s


def _active(config: pytest.Config) -> bool:
    """A witness run: settings were handed over, an sbxc option was given, or the witness suite (its
    directory, a module of it, a test in one) was named."""
    if _settings_key in config.stash:
        return True
    if any(
        config.getoption(n, default=None)
        for n in ("sbxc_profile", "sbxc_launcher", "sbxc_as_user", "sbxc_expected_skips", "sbxc_perturb",
                  "sbxc_only", "sbxc_skip")
    ):
        return True
    if any(config.getini(n) for n in ("sbxc_profile", "sbxc_launcher")):
        return True  # pinned in the project's ini: a witness run too, and its header says so
    return any(witnesses.names_the_suite(str(a), config.invocation_params.dir) for a in config.args)


def preconditions(config: pytest.Config) -> dict[str, Finding]:
    if _preconditions_key not in config.stash:
        s = settings(config)
        if s.preconditions is not None:
            # Handed down by `run`: probed once per run.
            config.stash[_preconditions_key] = dict(s.preconditions)
        else:
            from sandbox_conformance.conformance.preconditions import findings, needed

            # The ones prefetched for this launcher (pytest_configure): one trial each, none unread.
            reference = s.launcher.kind is LauncherKind.reference
            config.stash[_preconditions_key] = findings(s.as_user, probes=needed(reference))
    return config.stash[_preconditions_key]


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    if not _active(config):
        return None
    s = settings(config)
    lines = [
        f"sandbox-conformance: profile {s.profile.name} ({s.profile.source}); {s.launcher.name}"
        + (f"; as user {s.as_user}" if s.as_user else "")
        + (f"; perturbed: {', '.join(sorted(s.perturbations))}" if s.perturbations else "")
    ]
    if s.selection:
        left_out = ", ".join(sorted(s.profile.unselected))
        lines.append(f"  promises left out (--sbxc-only/--sbxc-skip): {left_out}")
    lines += [f"  probe {f.probe}: {f.verdict}: {f.reason}" for f in preconditions(config).values()]
    return lines


def _family(item: pytest.Item) -> str | None:
    """The promise family a witness belongs to; "" for a bare `@pytest.mark.witness` (a user's own
    witness: always collected, and its skips gated like any other); None for a test that is no witness."""
    m = item.get_closest_marker(MARKER)
    if m is None:
        return None
    return str(m.args[0]) if m.args else ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    witnesses = [i for i in items if _family(i) is not None]
    if not witnesses:
        return
    s = settings(config)
    made = set(s.profile.promises())
    # A promise the profile does not make is not tested: deselected, not skipped, so the require
    # switch and the expected-skips list only ever see skips that mean "could not witness here".
    # Likewise what the harness does with a leaf it made (kill its tree, keep a neighbour out) is no
    # promise of a sandbox that keeps its own cgroups.
    drop = [
        i
        for i in witnesses
        if (_family(i) and _family(i) not in made)
        or (i.get_closest_marker("harness_leaf") and not s.leaves_by_harness)
    ]
    # A listed expected skip of a witness the selection left out is neither a new skip nor a stale entry.
    config.stash[_unselected_key] = frozenset(skip_key(i.nodeid) for i in drop
                                              if _family(i) in s.profile.unselected)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if i not in drop]


def _note(item: pytest.Item, report: pytest.TestReport, name: str, value: str) -> None:
    """A property on this phase's report (the witness command reads it live) and on the item: pytest's
    junitxml writes only the teardown report's user_properties, which it copies from the item
    (_pytest/junitxml.py), so a JUnit reader (the negative controls) sees it too."""
    if (name, value) not in report.user_properties:  # the teardown report starts as the item's copy
        report.user_properties.append((name, value))
    if (name, value) not in item.user_properties:
        item.user_properties.append((name, value))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Result[pytest.TestReport], None]:
    outcome = yield
    report = outcome.get_result()
    family = _family(item)
    if family is None:
        return
    _note(item, report, "sbxc_family", family)
    if call.excinfo is not None and call.excinfo.errisinstance(NoObservation):
        # Left as pytest's "error" (a fixture raised): JUnit <error>, never <failure>.
        _note(item, report, "sbxc_harness_error", str(call.excinfo.value))
        if call.excinfo.errisinstance(SandboxUnavailable):
            # The launcher's "not here" (exit 75): the witness command says it once and exits 75.
            _note(item, report, "sbxc_unavailable", str(call.excinfo.value))
    elif call.excinfo is not None and call.excinfo.errisinstance(AssertionError):
        saw = str(call.excinfo.value)
        _note(item, report, "sbxc_saw", saw.splitlines()[0] if saw else "assertion failed")
        _remedy(item, report, family)
    if report.skipped and not hasattr(report, "wasxfail"):
        s = settings(item.config)
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        item.config.stash[_skipped_key][skip_key(item.nodeid)] = reason
        # Listed means the id AND the reason: a witness that starts skipping for another reason than
        # the one accepted is a new skip (the listed reason must appear in the actual one).
        listed = (
            s.expected_skips is not None
            and skip_key(item.nodeid) in s.expected_skips
            and s.expected_skips[skip_key(item.nodeid)] in reason
        )
        if s.require and not listed:
            report.outcome = "failed"
            report.longrepr = (
                f"witness skipped under --sbxc-require/{REQUIRE_ENV}=1 and not in the "
                f"expected skips: {reason}"
            )
            _note(item, report, "sbxc_required_skip", reason)


def _remedy(item: pytest.Item, report: pytest.TestReport, family: str) -> None:
    """A broken promise's remedy (conformance/remedies.py) for the sandbox at hand, where a JUnit reader
    sees it: a property, the end of the <failure message> (pytest's junitxml takes it from the crash
    line) and a section of the failure's text. The message still starts `AssertionError`."""
    r = remedies.remedy(family, settings(item.config).sandbox_kind)
    if r is None:
        return
    line = r.line()
    _note(item, report, "sbxc_remedy", line)
    longrepr = report.longrepr
    if isinstance(longrepr, ExceptionRepr):  # a call that raised: never a plain string or a skip's tuple
        if longrepr.reprcrash is not None and line not in longrepr.reprcrash.message:
            longrepr.reprcrash.message = f"{longrepr.reprcrash.message}\n{line}"
        longrepr.addsection(f"how to keep `{family}` ({r.sandbox})", line)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if _settings_key not in config.stash:
        return
    s = config.stash[_settings_key]
    if s.expected_skips is None:
        return
    skipped = config.stash[_skipped_key]
    seen = {skip_key(i.nodeid) for i in session.items}
    problems = [
        f"new skip (not listed): {k}: {skipped[k]}" for k in sorted(set(skipped) - set(s.expected_skips))
    ]
    problems += [
        f"skipped for another reason than listed: {k}: {skipped[k]!r} does not contain "
        f"{s.expected_skips[k]!r}"
        for k in sorted(set(skipped) & set(s.expected_skips))
        if s.expected_skips[k] not in skipped[k]
    ]
    left_out: frozenset[str] = config.stash.get(_unselected_key, frozenset[str]())
    for k in sorted(set(s.expected_skips) - set(skipped) - left_out):
        problems.append(f"listed skip ran: {k}" if k in seen else f"listed skip no longer exists: {k}")
    if problems:
        config.stash[_skipped_key]["__problems__"] = " ; ".join(problems)
        tr = config.pluginmanager.get_plugin("terminalreporter")
        for p in problems:
            if tr is not None:
                tr.write_line(f"sandbox-conformance expected skips: {p}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """A plain pytest run's promise rows, one per promise, in the `lines` form the witness command
    prints with `--format lines` (conformance/render.py): what its witnesses' pass, fail and skip
    mean for each promise, which pytest's own summary does not say."""
    collector = config.pluginmanager.get_plugin(VERDICTS)
    if not isinstance(collector, verdicts.Collector) or not collector.results:
        return
    rows = verdicts.promise_lines(list(collector.results.values()))
    terminalreporter.write_sep("=", "sandbox-conformance promises")
    for line in render.lines_text(rows):
        terminalreporter.write_line(line)


def expected_skip_problems(config: pytest.Config) -> str | None:
    return config.stash.get(_skipped_key, {}).get("__problems__")


# ---- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def sbxc_settings(pytestconfig: pytest.Config) -> Settings:
    return settings(pytestconfig)


@pytest.fixture(scope="session")
def sbxc_session(pytestconfig: pytest.Config, sbxc_settings: Settings) -> Iterator[WitnessSession]:
    if _session_key in pytestconfig.stash:  # opened by the witness command, which closes it
        yield pytestconfig.stash[_session_key]
        return
    s = sbxc_settings
    with WitnessSession(
        s.profile,
        s.launcher,
        as_user=s.as_user,
        timeout=s.timeout,
        perturbations=s.perturbations,
        preconditions=preconditions(pytestconfig),
        unobservable=s.host_cannot_observe,
        harness_leaf=s.harness_leaf,
        launcher_env=s.launcher_env,
        layout_root=s.layout_root,
    ) as session:
        yield session


@pytest.fixture(scope="session")
def sbxc_task(pytestconfig: pytest.Config, sbxc_session: WitnessSession) -> Task:
    """The one live task of this session (launched on first use, then cached). A launch that does not
    give a complete observation raises NoObservation here: every witness using it errors, none passes."""
    task = sbxc_session.task()
    if task not in pytestconfig.stash[_tasks_key]:
        pytestconfig.stash[_tasks_key].append(task)
    return task


def tasks(config: pytest.Config) -> list[Task]:
    return list(config.stash.get(_tasks_key, ()))


@pytest.fixture
def sbxc_launch(pytestconfig: pytest.Config) -> Iterator[Callable[..., Task]]:
    """Factory: `sbxc_launch(profile=None, launcher=None, as_user=None, perturbations=())` launches a
    live task (through the configured launcher unless told otherwise) and returns its observations.
    `profile` is a Profile, a path, or None for the configured one; `launcher` a Launcher or a prefix."""
    opened: list[WitnessSession] = []

    def launch(
        profile: profile_mod.Profile | str | Path | None = None,
        launcher: Launcher | str | None = None,
        as_user: str | None = None,
        perturbations: frozenset[str] | tuple[str, ...] = (),
        timeout: float | None = None,
    ) -> Task:
        s = settings(pytestconfig)
        prof = (
            profile
            if isinstance(profile, profile_mod.Profile)
            else (profile_mod.load(profile) if profile is not None else s.profile)
        )
        lau = (
            launcher
            if isinstance(launcher, Launcher)
            else (external(launcher, spec=True, stdin=True) if launcher else s.launcher)
        )
        session = WitnessSession(
            prof,
            lau,
            as_user=as_user if as_user is not None else s.as_user,
            timeout=timeout or s.timeout,
            perturbations=frozenset(perturbations),
            launcher_env=s.launcher_env,
            layout_root=s.layout_root,
        )
        opened.append(session)
        session.__enter__()
        return session.task()

    try:
        yield launch
    finally:
        for session in opened:
            session.__exit__(None, None, None)
