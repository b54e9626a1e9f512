"""`sandbox-conformance mr-check`: pure parts as tables, then the command end to end on temporary
git repositories (real git, the real runner, real refusals: a deployment signature whose config
path exists, and a run nested inside `bwrap --unshare-user --disable-userns`)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from sandbox_conformance.mrcheck import tiers as mr_tiers
from sandbox_conformance.mrcheck.config import InvalidConfig, MissingConfig, Tier, TierKind, load, parse
from sandbox_conformance.mrcheck.git import Change, ChangeStatus, Source, collect
from sandbox_conformance.mrcheck.globs import InvalidGlob, compile_glob, matches
from sandbox_conformance.mrcheck.report import plan
from sandbox_conformance.mrcheck.tiers import Gate, TierOutcome, TierResult, classify_runner, run_tier
from sandbox_conformance.probes.finding import Finding, Verdict
from sandbox_conformance.processes.children import Completed, minimal_env, run
from sandbox_conformance.runners.run_verdict import Leg, RunVerdict

REPO = Path(__file__).resolve().parent.parent
CLI_TIMEOUT = 900.0

# --- globs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("pattern", "path", "expected"), [
    ("src/sandbox/**", "src/sandbox/a.py", True),
    ("src/sandbox/**", "src/sandbox/deep/er/a.py", True),
    ("src/sandbox/**", "src/sandbox", False),          # the directory name alone is not below it
    ("src/sandbox/", "src/sandbox/x", True),           # trailing slash: everything below
    ("src/*.py", "src/a.py", True),
    ("src/*.py", "src/deep/a.py", False),              # `*` never crosses `/` (fnmatch's would)
    ("*.py", "a.py", True),
    ("*.py", "src/a.py", False),                       # anchored at the root
    ("**/*.py", "a.py", True),                         # `**/` matches zero components
    ("**/*.py", "x/y/a.py", True),
    ("deploy/**/launch.sh", "deploy/launch.sh", True),
    ("deploy/**/launch.sh", "deploy/a/b/launch.sh", True),
    ("deploy/**/launch.sh", "deploy/a/b/launch.shx", False),
    ("deploy/bwrap/?.py", "deploy/bwrap/a.py", True),
    ("deploy/bwrap/?.py", "deploy/bwrap/ab.py", False),
    ("seccomp/[ab].json", "seccomp/b.json", True),
    ("seccomp/[!ab].json", "seccomp/b.json", False),
    ("seccomp/[!ab].json", "seccomp/c.json", True),
    ("/profile.toml", "profile.toml", True),           # a leading slash is the root
    ("a+b(c).toml", "a+b(c).toml", True),              # regex metacharacters are literal
    ("a+b(c).toml", "aab(c).toml", False),
    ("**", "anything/at/all", True),
])
def test_a_glob_matches_repository_paths_component_by_component(pattern: str, path: str,
                                                                 expected: bool) -> None:
    assert matches(pattern, path) is expected


@pytest.mark.parametrize("pattern", ["", "  ", "/", "src//x", "src/../x", "./x", "x/[ab"])
def test_a_malformed_glob_is_rejected(pattern: str) -> None:
    with pytest.raises(InvalidGlob):
        compile_glob(pattern)


# --- configuration --------------------------------------------------------------------------------

GOOD = {"tool": {"sandbox-conformance": {"tiers": [
    {"name": "w", "globs": ["src/**"], "run": {"kind": "witness", "profile": "p.toml", "launcher": "./l.sh"}},
    {"name": "c", "globs": ["x"], "run": {"kind": "command", "argv": ["make", "check"], "env": {"A": "1"}},
     "timeout": 60},
]}}}


def test_a_valid_configuration_parses_into_tiers() -> None:
    cfg = parse(GOOD, Path("pyproject.toml"), whole_file=False)
    w, c = cfg.tiers
    assert (w.name, w.kind, w.globs, w.profile, w.launcher) == ("w", TierKind.witness, ("src/**",), "p.toml",
                                                                  "./l.sh")
    assert (c.kind, c.argv, dict(c.env), c.timeout) == (TierKind.command, ("make", "check"), {"A": "1"}, 60.0)


def _with_tier(**tier: object) -> dict[str, object]:
    base: dict[str, object] = {"name": "t", "globs": ["src/**"], "run": {"kind": "witness"}}
    base.update(tier)
    return {"tool": {"sandbox-conformance": {"tiers": [base]}}}


@pytest.mark.parametrize(("doc", "key", "expected"), [
    (_with_tier(globs=[]), "tiers[0].globs", "at least one"),
    (_with_tier(globs="src/**"), "tiers[0].globs", "list of non-empty strings"),
    (_with_tier(globs=["src/[x"]), "tiers[0].globs[0]", "unclosed"),
    (_with_tier(name=""), "tiers[0].name", "non-empty string"),
    (_with_tier(globz=["x"]), "tiers[0].globz", "unknown key"),
    (_with_tier(run={"kind": "vm"}), "tiers[0].run.kind", "witness, cgroup, command"),
    (_with_tier(run={"kind": "witness", "profle": "x"}), "tiers[0].run.profle", "unknown key"),
    (_with_tier(run={"kind": "command"}), "tiers[0].run.argv", "missing"),
    (_with_tier(run={"kind": "command", "argv": []}), "tiers[0].run.argv", "at least one"),
    (_with_tier(run={"kind": "command", "argv": ["x"], "env": {"A": 1}}), "tiers[0].run.env",
     "string values"),
    (_with_tier(run={"kind": "witness", "require": "yes"}), "tiers[0].run.require", "true or false"),
    (_with_tier(timeout=0), "tiers[0].timeout", "positive"),
    (_with_tier(run="witness"), "tiers[0].run", "expected a table"),
    ({"tool": {"sandbox-conformance": {"tiers": []}}}, "tiers", "non-empty array"),
    ({"tool": {"sandbox-conformance": {"tiers": [{"name": "t", "globs": ["a"],
                                                  "run": {"kind": "witness"}}] * 2}}},
     "tiers[1].name", "duplicate"),
])
def test_a_bad_configuration_is_one_line_naming_file_key_and_expectation(doc: dict, key: str,
                                                                          expected: str) -> None:
    with pytest.raises(InvalidConfig) as e:
        parse(doc, Path("/r/pyproject.toml"), whole_file=False)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("/r/pyproject.toml: ")
    assert key in msg
    assert expected in msg


def test_no_table_names_what_to_add(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    with pytest.raises(MissingConfig, match=r"add \[\[tool\.sandbox-conformance\.tiers\]\]"):
        load(tmp_path, None)
    with pytest.raises(MissingConfig, match="no such file"):
        load(tmp_path / "nowhere", None)


def test_a_config_file_may_hold_the_tiers_at_its_top_level(tmp_path: Path) -> None:
    f = tmp_path / "mr.toml"
    f.write_text('[[tiers]]\nname = "t"\nglobs = ["a/**"]\nrun = { kind = "cgroup" }\n')
    assert load(tmp_path, f).tiers[0].kind is TierKind.cgroup
    with pytest.raises(InvalidConfig, match=r"--config .*: no such file"):
        load(tmp_path, tmp_path / "missing.toml")
    f.write_text("tiers = [")
    with pytest.raises(InvalidConfig, match="not valid TOML"):
        load(tmp_path, f)


def test_git_z_output_is_parsed_without_quoting_or_splitting_paths() -> None:
    from sandbox_conformance.mrcheck.git import parse_diff_z, parse_status_z
    diff = "M\0a b.py\0R087\0old\nname\0new name\0D\0gone\0"
    assert parse_diff_z(diff) == [
        Change("a b.py", ChangeStatus.modified, Source.committed),
        Change("new name", ChangeStatus.renamed, Source.committed, "old\nname"),
        Change("gone", ChangeStatus.deleted, Source.committed)]
    status = "RM new\0old\0 D wt-deleted\0UU both\0?? fresh dir/f\0A  staged\0"
    assert parse_status_z(status) == [
        Change("new", ChangeStatus.renamed, Source.uncommitted, "old"),
        Change("wt-deleted", ChangeStatus.deleted, Source.uncommitted),
        Change("both", ChangeStatus.unmerged, Source.uncommitted),
        Change("fresh dir/f", ChangeStatus.untracked, Source.untracked),
        Change("staged", ChangeStatus.added, Source.uncommitted)]


# --- the runner's answer -> a tier result ---------------------------------------------------------

def _done(rc: int | None, stderr: str = "", stdout: str = "", **kw: object) -> Completed:
    return Completed(("x",), rc, stdout, stderr, 1.5, **kw)  # type: ignore[arg-type]


def _doc(verdict: str, code: int, reason: str | None = None, ways_on: tuple[str, ...] = ()) -> RunVerdict:
    """What `run --verdict-json` writes (runners/run_verdict.py)."""
    line = f"sandbox-conformance: {verdict} mode=native exit={code} time=0.4s"
    return RunVerdict(verdict, "native", "auto", code, 0.4, line, reason, (), ways_on)


DEPLOYMENT = _doc("REFUSED", 75, "this is a deployment host (signature matched: config:/etc/agentd.toml)",
                  ("--mode container: run the suite in a privileged container on this host",
                   "--mode native: run it natively here, meaning it"))


@pytest.mark.parametrize(("done", "doc", "outcome"), [
    (_done(0), _doc("PASS", 0), TierOutcome.passed),
    (_done(1), _doc("FAIL", 1), TierOutcome.failed),
    (_done(75), DEPLOYMENT, TierOutcome.refused),
    (_done(2), _doc("ERROR", 2, "--profile p.toml: no such file"), TierOutcome.usage),
    (_done(None, timed_out=True), None, TierOutcome.error),
    (_done(-9), None, TierOutcome.error),
    (_done(127, "python: not found", not_found=True), None, TierOutcome.refused),
    # The exit code decides: a document that disagrees with it (a stale file) never makes a run green.
    (_done(1), _doc("PASS", 0), TierOutcome.failed),
    (_done(143), _doc("KILLED-SIGTERM", 143), TierOutcome.error),
])
def test_only_exit_zero_from_the_runner_is_green(done: Completed, doc: RunVerdict | None,
                                                 outcome: TierOutcome) -> None:
    assert classify_runner(done, doc).outcome is outcome


def test_a_refusal_keeps_the_reason_and_each_way_on_from_the_runners_document_not_its_prose() -> None:
    # stderr says something else entirely: it is for people, and never parsed.
    prose = "sandbox-conformance run: refused: a decoy\n  way on: a decoy way\n"
    res = classify_runner(_done(75, prose), DEPLOYMENT)
    assert (res.outcome, res.reason, res.ways_on) == (TierOutcome.refused, DEPLOYMENT.reason,
                                                      DEPLOYMENT.ways_on)
    assert res.runner_verdict == DEPLOYMENT.line
    assert "signature matched" not in res.plain_why and "deployment host" in res.plain_why
    # No document (the runner died before its end): the exit code still decides, the tail says why.
    bare = classify_runner(_done(75, prose + "last words\n"), None)
    assert (bare.outcome, bare.reason, bare.ways_on, bare.runner_verdict) == (TierOutcome.refused,
                                                                              "last words",
                                                                              (), None)
    usage = classify_runner(_done(2, "sandbox-conformance run: whatever\n"),
                            _doc("ERROR", 2, "--timeout: no"))
    assert usage.outcome is TierOutcome.usage and usage.reason.endswith(": --timeout: no")


def test_the_runner_is_told_where_its_verdict_goes_outside_the_command_it_prints(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandbox_conformance.runners import run_verdict

    tier = Tier("w", ("src/**",), TierKind.witness, launcher="./l.sh", pytest_args=("-k", "x"))
    argv = mr_tiers.runner_argv(tier, "native")
    assert argv[argv.index("run") + 1:] == ["--mode", "native", "--launcher", "./l.sh", "--", "-k", "x"]
    assert mr_tiers.display_command(tier, "native") == "sandbox-conformance run --mode native --launcher " \
                                                       "./l.sh -- -k x"
    monkeypatch.setenv(run_verdict.ENV, "/elsewhere.json")  # the user's own is never the one read back
    assert mr_tiers.runner_env(tmp_path / "v.json")[run_verdict.ENV] == str(tmp_path / "v.json")
    assert run_verdict.ENV not in mr_tiers.runner_env()


# --- a red tier's failures: from the run's verdict document, its output only without one ----------------

BOOM = "harness error: launcher 'x': exited 1; stderr: boom"
OTHER = "harness error: the lifecycle launch: exited 3"
RED_ROWS = (("masked {state}/db", "BROKEN", "nothing is mounted at {state}/db (no mask)"),
            ("read_only /usr", "kept", ""), ("network", "not tested", BOOM), ("pid", "not tested", BOOM))


def _leg(rows: tuple[tuple[str, str, str], ...], problems: tuple[str, ...] = (), label: str = "native",
         head: str = "witness: 1 kept, 1 BROKEN, 2 not tested (profile reference, launcher 'x')") -> Leg:
    return Leg(label, 1, f"{head}: FAIL [4 witnesses: 2 error, 1 failed, 1 passed]", problems, rows)


def _printed(legs: tuple[Leg, ...]) -> list[str]:
    """What each leg's witness printed on stdout (the `lines` form, through a pipe): its table, its
    problems, its summary line, as conformance/output.py writes them."""
    import io

    from sandbox_conformance.conformance import output
    from sandbox_conformance.conformance.render import Format, Style

    stdout = io.StringIO()
    out = output.WitnessOutput(Format.lines, Style(), False, None, False, False, stdout, io.StringIO())
    for leg in legs:
        head, _, rest = leg.summary.partition(": FAIL ")
        out.report(leg.promises, problems=leg.problems, head=head, word="FAIL", tail=rest,
                   remedies={"masked": "usually: no tmpfs over it; keep it with: --tmpfs PATH"})
    return stdout.getvalue().splitlines()


LEG_CASES = {
    "a launch failure said once, below": (_leg(RED_ROWS, (BOOM,)),),
    "another harness error in its own rows, the one said below under a BROKEN row": (
        _leg((("pid", "not tested", OTHER), ("uts", "BROKEN", "saw 2; saw 3"), ("ipc", "BROKEN", "")),
             ("expected skips: cgroup was not skipped", BOOM)),),
    "a container's two legs: one row broken in both is said once, the summary is the last leg's": (
        _leg(RED_ROWS, (BOOM,), "root"),
        _leg(RED_ROWS[:2], (), "sbxc", head="witness: 1 kept, 1 BROKEN, 0 not tested (profile reference, "
                                            "launcher 'x', as sbxc)")),
    "a family's rows in the order the table groups them": (
        _leg((("masked /a", "BROKEN", "a"), ("pid", "BROKEN", "p"), ("masked /b", "BROKEN", "b"))),),
    "more BROKEN rows than are shown": (
        _leg(tuple((f"read_only /p{i}", "BROKEN", f"wrote {i}")
                   for i in range(mr_tiers.FAILURE_LINES + 5))),),
    "a leg with nothing red": (_leg((("pid", "kept", ""), ("uts", "not tested", "skipped: no uts"))),),
}


@pytest.mark.parametrize("legs", LEG_CASES.values(), ids=LEG_CASES.keys())
def test_a_legs_failures_are_the_ones_its_printed_output_gives(legs: tuple[Leg, ...]) -> None:
    """Two readings of one run that must agree: the rows as data, and the lines the witness printed
    for them (render.said_once, the remedy lines and all), read the old way."""
    assert mr_tiers.leg_failures(legs) == mr_tiers.failure_lines(_printed(legs))


def test_a_red_tier_says_why_from_its_verdict_documents_legs_not_from_its_output() -> None:
    legs = LEG_CASES["a launch failure said once, below"]
    doc = _doc("FAIL", 1)._replace(legs=legs)
    decoy = "masked /decoy: BROKEN: printed, never read\nwitness: 0 kept, 1 BROKEN, 0 not tested (p): FAIL\n"
    res = classify_runner(_done(1, "", decoy), doc)
    assert res.failures == (f"{BOOM} (2 promises not tested because of it)",
                            "masked {state}/db: BROKEN: nothing is mounted at {state}/db (no mask)",
                            legs[0].summary)
    assert "masked /decoy: BROKEN: printed, never read" in res.output_tail  # the output is still shown
    # No legs (a witness that wrote no report) or no document (a runner that died first): the output.
    for without in (_doc("FAIL", 1), None):
        assert classify_runner(_done(1, "", decoy), without).failures == mr_tiers.failure_lines(
            decoy.splitlines())


def test_a_runner_tiers_verdict_document_is_a_scratch_file_read_then_removed(tmp_path: Path) -> None:
    from sandbox_conformance.runners import run_verdict

    legs = LEG_CASES["a launch failure said once, below"]
    seen: dict[str, object] = {}

    def runner(argv: list[str], *, timeout: float, env: dict[str, str], cwd: str, **kw: object) -> Completed:
        path = Path(env[run_verdict.ENV])
        seen.update(argv=argv, path=path)
        run_verdict.write(path, _doc("FAIL", 1)._replace(legs=legs))
        return _done(1, "", "nothing parseable\n")

    tier = Tier("w", ("src/**",), TierKind.witness)
    res = mr_tiers.run_runner_tier(tier, tmp_path, "native", runner)
    assert res.outcome is TierOutcome.failed and res.failures == mr_tiers.leg_failures(legs)
    path = seen["path"]
    assert isinstance(path, Path) and path.name == "verdict.json"
    assert path.parent.name.startswith(mr_tiers.SCRATCH_PREFIX)
    assert not path.parent.exists()  # removed once read, the document with it
    assert not any(str(path.parent) in a for a in seen["argv"])  # type: ignore[attr-defined]
    assert mr_tiers.display_command(tier, "native") == "sandbox-conformance run --mode native"


@pytest.mark.parametrize(("outcomes", "expected"), [
    ([], TierOutcome.passed),
    ([TierOutcome.passed, TierOutcome.passed], TierOutcome.passed),
    ([TierOutcome.passed, TierOutcome.refused], TierOutcome.refused),
    ([TierOutcome.refused, TierOutcome.failed], TierOutcome.failed),
    ([TierOutcome.usage, TierOutcome.refused], TierOutcome.usage),
    ([TierOutcome.error, TierOutcome.passed], TierOutcome.error),
])
def test_the_overall_verdict_is_never_green_when_a_touched_tier_did_not_pass(outcomes: list[TierOutcome],
                                                                             expected: TierOutcome) -> None:
    from sandbox_conformance.mrcheck.report import overall
    assert overall([TierResult(o, "r") for o in outcomes]) is expected


def test_a_refused_gate_means_the_command_never_starts(tmp_path: Path) -> None:
    tier = Tier("c", ("x",), TierKind.command, argv=("true",))
    calls: list[object] = []

    def runner(argv: object, **kw: object) -> Completed:
        calls.append(argv)
        return _done(0)

    refused = run_tier(tier, tmp_path, None, runner,
                       gate=lambda m: Gate(None, ("inside a sandbox",), ("leave",)))
    assert (refused.outcome, refused.reason, refused.ways_on, calls) == (TierOutcome.refused,
                                                                         "inside a sandbox",
                                                                         ("leave",), [])
    container = run_tier(tier, tmp_path, None, runner, gate=lambda m: Gate("container", ("no bwrap",)))
    assert container.outcome is TierOutcome.refused and "container" in container.reason and calls == []
    ran = run_tier(tier, tmp_path, None, runner, gate=lambda m: Gate("native", ("ok",)))
    assert ran.outcome is TierOutcome.passed and calls == [("true",)]


def test_the_handover_names_files_tier_command_and_why_in_every_format() -> None:
    from sandbox_conformance.mrcheck.git import Changes
    from sandbox_conformance.mrcheck.report import CheckReport, Invocation, ReportFormat, render
    tier = Tier("cmd|pipe", ("src/**",), TierKind.command, argv=("sh", "-c", "a | b"))
    moved = Change("src/new.py", ChangeStatus.renamed, Source.committed, "lib/old.py")
    changes = Changes(Path("/r"), "main", "b" * 40, "m" * 40, "h" * 40, (moved,), "hhhhhhh")
    report = CheckReport(changes, Path("/r/pyproject.toml"), Invocation("main"), plan([tier], [moved]),
                         (TierResult(TierOutcome.refused, "inside a sandbox", ("run it on the host",)),))
    text = render(report, ReportFormat.text)
    assert "  - src/new.py (renamed from lib/old.py)" in text
    assert "Tier cmd|pipe (a command of the project's) covers:" in text and "    sh -c 'a | b'" in text
    assert "Why not here: inside a sandbox." in text and "way on: run it on the host" in text
    assert "sandbox-conformance mr-check --base main" in text
    md = render(report, ReportFormat.markdown)
    assert "- `src/new.py` (renamed from `lib/old.py`)" in md
    assert "```sh\nsh -c 'a | b'\n```" in md                       # not escaped inside the code block
    doc = json.loads(render(report, ReportFormat.json))
    assert doc["tiers"][0]["files"][0]["old_path"] == "lib/old.py" and doc["exit"] == 75
    # A tier that ran sits in the table, where a `|` would end the cell.
    ran = CheckReport(changes, Path("/r/pyproject.toml"), Invocation("main"), plan([tier], [moved]),
                      (TierResult(TierOutcome.failed, "the command exited 1", output_tail=("boom",)),))
    assert "| FAIL | `cmd\\|pipe` | `sh -c 'a \\| b'` |" in render(ran, ReportFormat.markdown)


# --- temporary git repositories ---------------------------------------------------------------------

def git(repo: Path, *args: str) -> str:
    env = minimal_env({"LC_ALL": "C", "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(repo)})
    done = run(["git", *args], timeout=60, env=env, cwd=str(repo))
    assert done.ok, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def pyproject(tiers: str) -> str:
    return "[project]\nname = \"demo\"\nversion = \"0\"\n\n" + textwrap.dedent(tiers)


CHECK_TIER = """\
[[tool.sandbox-conformance.tiers]]
name = "sandbox-check"
globs = ["src/sandbox/**", "deploy/bwrap/*.py"]
run = { kind = "command", argv = ["sh", "tools/check.sh"], env = { MARK = "%s" } }
"""


def make_repo(root: Path, tiers: str, *, check_exit: int = 0) -> Path:
    """main with a sandbox tree and unrelated files; HEAD on a feature branch at the same commit."""
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "t@example.invalid")
    git(root, "config", "user.name", "t")
    write(root / "pyproject.toml", pyproject(tiers))
    write(root / "src/sandbox/launch.py", "print('launch')\n" * 5)
    write(root / "src/sandbox/seccomp.json", '{"default": "kill"}\n' * 5)
    write(root / "deploy/bwrap/args.py", "ARGS = ['--unshare-all']\n" * 5)
    write(root / "docs/guide.md", "# guide\n")
    write(root / "docs/manual.md", "a long manual line that rename detection can follow\n" * 20)
    # The command tier: prints, leaves a mark proving it ran, exits as told.
    write(root / "tools/check.sh", f'echo "checked from $(pwd)"; touch "$MARK"; exit {check_exit}\n')
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "init")
    git(root, "checkout", "-q", "-b", "feature")
    return root


def mr_check(repo: Path, *args: str, env: dict[str, str] | None = None,
             prefix: tuple[str, ...] = ()) -> Completed:
    # The user's environment, as a person typing the command would have it; our checkout importable.
    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    for key in ("SANDBOX_CONFORMANCE_MODE", "SANDBOX_CONFORMANCE_DEPLOYMENT_CONFIG"):
        if env is None or key not in env:
            full.pop(key, None)
    return run([*prefix, sys.executable, "-P", "-m", "sandbox_conformance", "mr-check", *args],
               timeout=CLI_TIMEOUT, env=full, cwd=str(repo))


@pytest.fixture
def mark(tmp_path: Path) -> Path:
    return tmp_path / "check-ran"


def test_an_untouched_change_exits_zero_with_one_line(tmp_path: Path, mark: Path) -> None:
    repo = make_repo(tmp_path / "r", CHECK_TIER % mark)
    write(repo / "docs/guide.md", "# guide\nmore\n")
    git(repo, "commit", "-qam", "docs")
    write(repo / "docs/new.md", "untracked\n")
    done = mr_check(repo)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    assert "not sandbox-touching" in lines[0] and "2 changed paths since main" in lines[0]
    assert not mark.exists()
    doc = json.loads(mr_check(repo, "--format", "json").stdout)
    assert (doc["touched"], doc["verdict"], doc["exit"], doc["tiers"]) == (False, "NOT_TOUCHING", 0, [])
    md = mr_check(repo, "--format", "markdown")
    assert md.returncode == 0 and len(md.stdout.splitlines()) == 1 and "not sandbox-touching" in md.stdout
    # From a subdirectory, or with -C, the same repository and the same answer.
    assert mr_check(repo / "docs").stdout == done.stdout
    assert mr_check(tmp_path, "-C", str(repo / "src")).stdout == done.stdout


def test_renames_deletions_uncommitted_and_untracked_paths_all_count(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", CHECK_TIER % "/dev/null")
    git(repo, "mv", "src/sandbox/launch.py", "src/launcher.py")          # renamed OUT of the sandbox tree
    git(repo, "rm", "-q", "deploy/bwrap/args.py")                        # deleted
    git(repo, "commit", "-q", "-m", "move")
    write(repo / "src/sandbox/seccomp.json", '{"default": "allow"}\n')   # uncommitted edit
    write(repo / "src/sandbox/new/profile.toml", "x = 1\n")              # untracked, in a new directory
    write(repo / "docs/guide.md", "# unrelated\n")
    changes = collect(repo, None)
    assert changes.base == "main"
    by_path = {c.path: c for c in changes.changes}
    assert by_path["src/launcher.py"] == Change("src/launcher.py", ChangeStatus.renamed, Source.committed,
                                                "src/sandbox/launch.py")
    assert by_path["deploy/bwrap/args.py"].status is ChangeStatus.deleted
    assert (by_path["src/sandbox/seccomp.json"].status, by_path["src/sandbox/seccomp.json"].source) == (
        ChangeStatus.modified, Source.uncommitted)
    assert by_path["src/sandbox/new/profile.toml"].source is Source.untracked
    [p] = plan(load(repo, None).tiers, changes.changes)
    assert sorted(h.change.path for h in p.hits) == [
        "deploy/bwrap/args.py", "src/launcher.py", "src/sandbox/new/profile.toml", "src/sandbox/seccomp.json"]
    # A rename INTO the tree counts by its new path, through the CLI too (JSON lists both sides).
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "rest")
    git(repo, "mv", "docs/manual.md", "src/sandbox/manual.md")
    git(repo, "commit", "-q", "-m", "into")
    assert any(h.change.path == "src/sandbox/manual.md" and h.change.old_path == "docs/manual.md"
               for h in plan(load(repo, None).tiers, collect(repo, None).changes)[0].hits)


def test_the_default_base_is_origin_head_in_a_clone(tmp_path: Path) -> None:
    upstream = make_repo(tmp_path / "up", CHECK_TIER % "/dev/null")
    git(upstream, "checkout", "-q", "main")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(upstream), str(clone))
    git(clone, "config", "user.email", "t@example.invalid")
    git(clone, "config", "user.name", "t")
    git(clone, "checkout", "-q", "-b", "topic")
    write(clone / "docs/x.md", "x\n")
    git(clone, "add", "-A")
    git(clone, "commit", "-q", "-m", "x")
    changes = collect(clone, None)
    assert changes.base == "origin/main"
    assert [c.path for c in changes.changes] == ["docs/x.md"]


def _one_line_exit_2(done: Completed) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


def test_a_bad_base_is_exit_2_with_one_line(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", CHECK_TIER % "/dev/null")
    line = _one_line_exit_2(mr_check(repo, "--base", "no-such-branch"))
    assert "unknown base 'no-such-branch'" in line
    # Unrelated history: a base with no merge-base with HEAD.
    git(repo, "checkout", "-q", "--orphan", "island")
    git(repo, "commit", "-q", "-m", "island")
    line = _one_line_exit_2(mr_check(repo, "--base", "main"))
    assert "no merge-base" in line


def test_not_a_git_repository_is_exit_2_with_one_line(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    write(plain / "pyproject.toml", pyproject(CHECK_TIER % "/dev/null"))
    assert "not a git repository" in _one_line_exit_2(mr_check(plain))


def test_a_repository_with_no_default_branch_asks_for_a_base(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", CHECK_TIER % "/dev/null")
    git(repo, "branch", "-q", "-m", "main", "trunk")
    assert "pass --base REV" in _one_line_exit_2(mr_check(repo))
    assert mr_check(repo, "--base", "trunk").returncode == 0


def test_a_missing_configuration_is_exit_2_naming_what_to_add(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", "")
    line = _one_line_exit_2(mr_check(repo))
    assert "[[tool.sandbox-conformance.tiers]]" in line and "pyproject.toml" in line
    assert "--config" in _one_line_exit_2(mr_check(repo, "--config", str(tmp_path / "nope.toml")))
    write(repo / "pyproject.toml", pyproject(CHECK_TIER.replace("globs", "globz") % "/dev/null"))
    assert "globz: unknown key" in _one_line_exit_2(mr_check(repo))
    write(repo / "pyproject.toml",
          pyproject(WITNESS_TIER.replace('"witness"', '"witness", profile = "no.toml"')))
    assert "run.profile: no.toml: no such file" in _one_line_exit_2(mr_check(repo))


# --- runs: the command tier and the witness tier, through the runner's decision -------------------------

def _gate_or_skip() -> Gate:
    """Skip (with the runner's reason) where this host may not run a sandbox at all."""
    gate = mr_tiers.runner_gate(None)
    if gate.mode != "native":
        pytest.skip(f"the runner would not run natively here: {'; '.join(gate.reasons)}")
    return gate


def test_a_touched_change_runs_its_command_tier_and_reports_pass_with_the_files(tmp_path: Path,
                                                                               mark: Path) -> None:
    _gate_or_skip()
    repo = make_repo(tmp_path / "r", CHECK_TIER % mark)
    git(repo, "mv", "src/sandbox/launch.py", "src/sandbox/run.py")
    git(repo, "commit", "-q", "-m", "rename")
    done = mr_check(repo)
    assert done.returncode == 0, done.stdout + done.stderr
    assert mark.exists()  # it really ran
    assert f"PASS     sandbox-check: MARK={mark} sh tools/check.sh" in done.stdout
    assert "src/sandbox/run.py (renamed from src/sandbox/launch.py)" in done.stdout
    assert done.stdout.rstrip().endswith("sandbox-conformance mr-check: PASS (0)")
    assert "Handover" not in done.stdout


def test_a_red_command_tier_is_exit_1_with_its_output(tmp_path: Path, mark: Path) -> None:
    _gate_or_skip()
    repo = make_repo(tmp_path / "r", CHECK_TIER % mark, check_exit=1)
    write(repo / "deploy/bwrap/args.py", "ARGS = []\n")
    done = mr_check(repo, "--format", "json")
    assert done.returncode == 1, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    [tier] = doc["tiers"]
    assert (doc["verdict"], tier["outcome"], tier["exit_code"]) == ("FAIL", "FAIL", 1)
    [f] = tier["files"]
    assert (f["path"], f["globs"]) == ("deploy/bwrap/args.py", ["deploy/bwrap/*.py"])
    assert f"checked from {repo}" in tier["output_tail"]
    assert doc["handover"] is None


WITNESS_TIER = """\
[[tool.sandbox-conformance.tiers]]
name = "witness-reference"
globs = ["src/sandbox/**"]
run = { kind = "witness" }
"""


def _witness_suite_or_skip() -> None:
    try:
        import sandbox_conformance.commands.witness  # noqa: F401
    except ModuleNotFoundError as e:
        pytest.skip(f"the witness suite is not in this checkout: {e}")


def _cgroup_skips_tier(tiers: str) -> tuple[str, str | None]:
    """Where this host has no delegated cgroup root, the reference profile's cgroup witnesses can only
    skip (CI sets the require switch): the tier lists exactly them, with the probe's reason, as a user
    on such a host would. Returns (tiers, the expected-skips file's text or None)."""
    from sandbox_conformance.conformance.controls import HARNESS_ENFORCED

    f = mr_tiers.cgroup_delegation()
    if f.ok and f.facts.get("root"):
        return tiers, None
    # The probe's own words: the harness's prefix to them is its wording, not the promise.
    text = "".join(f"{n} | cgroup.delegation: {f.verdict}: {f.reason}\n" for n in sorted(HARNESS_ENFORCED))
    listed = '{ kind = "witness", expected_skips = "cgroup-skips.txt" }'
    return tiers.replace('{ kind = "witness" }', listed), text


def test_a_touched_change_runs_the_witness_tier_through_the_runner(tmp_path: Path) -> None:
    _witness_suite_or_skip()
    _gate_or_skip()
    tiers, skips = _cgroup_skips_tier(WITNESS_TIER)
    repo = make_repo(tmp_path / "r", tiers)
    if skips is not None:
        write(repo / "cgroup-skips.txt", skips)
    write(repo / "src/sandbox/launch.py", "changed\n")
    done = mr_check(repo)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS     witness-reference: sandbox-conformance run" in done.stdout
    assert "runner: sandbox-conformance: PASS mode=native exit=0" in done.stdout


def test_a_witness_tier_whose_sandbox_breaks_its_promises_is_exit_1(tmp_path: Path) -> None:
    _witness_suite_or_skip()
    _gate_or_skip()
    # A "launcher" that sandboxes nothing: `env python3 -I -S -` runs the witness program on the host,
    # so the reference promises (masks, read-only control dir, no network) are visibly broken.
    repo = make_repo(tmp_path / "r", WITNESS_TIER.replace('{ kind = "witness" }',
                                                          '{ kind = "witness", launcher = "env" }'))
    write(repo / "src/sandbox/launch.py", "changed\n")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = mr_check(repo, "--format", "json", env={"TMPDIR": str(scratch)})
    assert done.returncode == 1, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    [tier] = doc["tiers"]
    assert (doc["verdict"], tier["outcome"], tier["exit_code"]) == ("FAIL", "FAIL", 1)
    assert tier["runner_verdict"].startswith("sandbox-conformance: FAIL mode=native exit=1")
    assert tier["command"] == "sandbox-conformance run --launcher env"
    assert doc["handover"] is None
    # Why, first: the BROKEN promises, then the summary line (from the run's verdict document).
    assert tier["failures"][0].startswith("masked ") and ": BROKEN: " in tier["failures"][0]
    assert tier["failures"][-1].startswith("witness: ") and " BROKEN, " in tier["failures"][-1]
    # Neither mr-check's verdict document nor the run's witness report is left behind.
    left = [p.name for p in scratch.iterdir()]
    assert not [n for n in left if n.startswith((mr_tiers.SCRATCH_PREFIX, "sbxc-run-report."))], left


# --- refusals: the tier cannot run here -> 75 and a handover ----------------------------------------------

@pytest.fixture
def deployment_signature(tmp_path: Path) -> dict[str, str]:
    """A deployment signature whose config path exists: the runner's auto mode must refuse here."""
    present = write(tmp_path / "etc/agentd/config.toml", "x = 1\n")
    sig = write(tmp_path / "deployment.toml", f'[deployment]\nconfig_paths = ["{present}"]\n')
    return {"SANDBOX_CONFORMANCE_DEPLOYMENT_CONFIG": str(sig)}


def _assert_handover(text: str, *, files: list[str], tier: str, command: str, why: str) -> None:
    for f in files:
        assert f in text, (f, text)
    assert tier in text and command in text and why in text, text


def test_a_refused_witness_tier_is_75_with_a_handover(tmp_path: Path,
                                                      deployment_signature: dict[str, str]) -> None:
    repo = make_repo(tmp_path / "r", WITNESS_TIER)
    write(repo / "src/sandbox/seccomp.json", "{}\n")
    write(repo / "src/sandbox/extra.py", "x\n")
    done = mr_check(repo, env=deployment_signature)
    assert done.returncode == 75, done.stdout + done.stderr
    out = done.stdout
    assert "REFUSED  witness-reference" in out
    hand = out.split("Handover (paste into the merge request):", 1)[1]
    # Uncommitted work is counted, not listed: the reviewer can only test what was committed.
    _assert_handover(hand, files=["only 2 uncommitted files: commit them"],
                     tier="Tier witness-reference", command="    sandbox-conformance run\n",
                     why="Why not here: this is a deployment host")
    assert "--mode container" in out and "--mode native" in out  # the runner's ways on, kept
    assert "sandbox-conformance mr-check --base main" in hand
    assert out.rstrip().endswith("sandbox-conformance mr-check: REFUSED (75)")

    md = mr_check(repo, "--format", "markdown", env=deployment_signature)
    assert md.returncode == 75
    _assert_handover(md.stdout, files=["Only 2 uncommitted files"],
                     tier="**`witness-reference`**", command="```sh\nsandbox-conformance run\n```",
                     why="deployment host")
    doc = json.loads(mr_check(repo, "--format", "json", env=deployment_signature).stdout)
    assert (doc["verdict"], doc["exit"], doc["tiers"][0]["outcome"]) == ("REFUSED", 75, "REFUSED")
    assert "deployment host" in doc["tiers"][0]["reason"] and "deployment host" in doc["handover"]
    # Meaning it: the same change under an explicit --mode native is not refused by the deployment guard.
    assert "--mode native" in doc["tiers"][0]["ways_on"][1]


def test_a_refused_command_tier_never_runs_the_command(tmp_path: Path, mark: Path,
                                                       deployment_signature: dict[str, str]) -> None:
    repo = make_repo(tmp_path / "r", CHECK_TIER % mark)
    write(repo / "src/sandbox/launch.py", "changed\n")
    done = mr_check(repo, env=deployment_signature)
    assert done.returncode == 75, done.stdout + done.stderr
    assert not mark.exists()
    hand = done.stdout.split("Handover (paste into the merge request):", 1)[1]
    _assert_handover(hand, files=["only 1 uncommitted file"],
                     tier="Tier sandbox-check", command="MARK=", why="deployment host")
    assert "sh tools/check.sh" in hand
    # The same modes as the runner: an explicit --mode native means it, and the command runs.
    meant = mr_check(repo, "--mode", "native", env=deployment_signature)
    assert meant.returncode == 0, meant.stdout + meant.stderr
    assert mark.exists()


def test_nested_in_a_sandbox_every_tier_is_handed_over(tmp_path: Path, mark: Path, root_only: None,
                                                       bwrap_path: str) -> None:
    repo = make_repo(tmp_path / "r", (CHECK_TIER % mark) + "\n" + WITNESS_TIER)
    write(repo / "src/sandbox/launch.py", "changed\n")
    # The whole host read-only, nested user namespaces disabled: what an agent's task sees.
    prefix = (bwrap_path, "--unshare-user", "--disable-userns", "--ro-bind", "/", "/", "--dev", "/dev",
              "--proc", "/proc", "--chdir", str(repo))
    done = mr_check(repo, prefix=prefix)
    assert done.returncode == 75, done.stdout + done.stderr
    assert not mark.exists()
    assert "REFUSED  sandbox-check" in done.stdout and "REFUSED  witness-reference" in done.stdout
    hand = done.stdout.split("Handover (paste into the merge request):", 1)[1]
    assert hand.count("running inside a sandbox") == 2, hand


def _delegation(ok: bool) -> Finding:
    if ok:
        return Finding("cgroup.delegation", Verdict.supported, "delegated root /sys/fs/cgroup/t: proved",
                       facts={"root": "/sys/fs/cgroup/t", "promised": False})
    return Finding("cgroup.delegation", Verdict.unsupported, "no usable delegated root (hybrid layout)",
                   facts={"root": None, "promised": False})


@pytest.mark.parametrize(("mode", "root", "refused"), [
    (None, False, True), ("auto", False, True), ("native", False, True),
    (None, True, False), ("native", True, False),
    ("container", False, False),  # the container's set-up proves its own root; --require guards it
    ("vm", False, False),  # so does the VM's, on a kernel with a pure cgroup v2 hierarchy
])
def test_a_cgroup_tier_is_refused_where_its_witnesses_could_only_skip(mode, root, refused) -> None:
    r = mr_tiers.cgroup_refusal(Tier("cg", ("a/**",), TierKind.cgroup), mode, _delegation(root))
    assert (r is not None) is refused
    if r is not None:
        assert r.outcome is TierOutcome.refused and "hybrid layout" in r.reason
        assert any("--mode vm" in w for w in r.ways_on), r.ways_on


def test_a_cgroup_tier_runs_only_the_cgroup_witnesses_under_the_require_switch() -> None:
    tier = Tier(name="cg", globs=("a/**",), kind=TierKind.cgroup)
    args = mr_tiers.runner_args(tier, "container")
    assert "--require" in args
    assert args[args.index("--") + 1:] == list(mr_tiers.CGROUP_SELECTION)


def test_a_cgroup_tier_on_this_host_follows_the_cgroup_probe_never_green_untested(tmp_path: Path) -> None:
    finding = mr_tiers.cgroup_delegation()
    repo = make_repo(tmp_path / "r", """\
        [[tool.sandbox-conformance.tiers]]
        name = "cgroup-limits"
        globs = ["deploy/**"]
        run = { kind = "cgroup" }
        """)
    git(repo, "rm", "-q", "deploy/bwrap/args.py")
    done = mr_check(repo)
    assert "deploy/bwrap/args.py (deleted, uncommitted)" in done.stdout
    if finding.ok and finding.facts.get("root"):
        assert "no usable cgroup root" not in done.stdout, done.stdout
    else:
        # This host (hybrid: memory on v1) has no delegated root: handed over with the probe's reason.
        assert done.returncode == 75, done.stdout + done.stderr
        assert "REFUSED  cgroup-limits" in done.stdout, done.stdout
        assert "no usable cgroup root" in done.stdout and finding.reason in done.stdout, done.stdout
        assert "--mode vm" in done.stdout, done.stdout



@pytest.mark.integration
@pytest.mark.timeout(900)
def test_a_cgroup_tier_runs_for_real_with_mode_vm_where_the_host_cannot_delegate(tmp_path: Path) -> None:
    """The way on this host names (`--mode vm`) really runs the cgroup witnesses and reports PASS."""
    from sandbox_conformance.runners.vm import image as vm_image
    from sandbox_conformance.runners.vm import qemu as vm
    from sandbox_conformance.runners.vm.image import ImageNotBuilt

    if os.geteuid() != 0:
        pytest.skip("the VM tier runs as root")
    if shutil.which(vm.QEMU) is None:
        pytest.skip(f"{vm.QEMU} not installed: run scripts/vm-deps")
    try:
        vm_image.ensure_image()
    except ImageNotBuilt as e:
        pytest.skip(f"no VM image: {e}")
    repo = make_repo(tmp_path / "r", """\
        [[tool.sandbox-conformance.tiers]]
        name = "cgroup-limits"
        globs = ["deploy/**"]
        run = { kind = "cgroup" }
        """)
    write(repo / "deploy/cgroup/limits.toml", "memory_max = '512M'\n")
    done = mr_check(repo, "--mode", "vm", "--format", "json")
    doc = json.loads(done.stdout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [tier] = doc["tiers"]
    assert tier["outcome"] == "PASS" and "deploy/cgroup/limits.toml" in json.dumps(tier["files"]), tier
