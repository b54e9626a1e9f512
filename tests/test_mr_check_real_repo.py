"""mr-check on a real repository (issue 17): no silent gate, commands that run as printed, a failure
that says why, and a handover a reviewer pastes as is.

Each test builds a git repository with real commits (a rename, a deletion, a merge, uncommitted
edits) and runs the command end to end, or checks a pure part against a table."""

from __future__ import annotations

import json
import os
import shlex
import sys
import textwrap
from pathlib import Path

import pytest
from test_mr_check import (
    CHECK_TIER,
    REPO,
    WITNESS_TIER,
    _delegation,
    _done,
    _gate_or_skip,
    _one_line_exit_2,
    _witness_suite_or_skip,
    git,
    make_repo,
    mr_check,
    pyproject,
    write,
)

from sandbox_conformance.mrcheck import tiers as mr_tiers
from sandbox_conformance.mrcheck.config import InvalidConfig, Tier, TierKind, parse, resolve_launcher
from sandbox_conformance.mrcheck.git import Change, Changes, ChangeStatus, Source
from sandbox_conformance.mrcheck.report import CheckReport, Invocation, ReportFormat, plan, render
from sandbox_conformance.mrcheck.tiers import TierOutcome, TierResult, classify_runner
from sandbox_conformance.processes.children import Completed, run
from sandbox_conformance.runners.run_verdict import RunVerdict

CLI_TIMEOUT = 900.0

# A profile whose only promise an unsandboxed launcher can be asked about; no [limits].
NO_LIMITS_PROFILE = '[profile]\nname = "no-limits"\n\n[filesystem]\nwritable = ["{workdir}"]\n'


def cli(cwd: Path, *args: str, env: dict[str, str] | None = None) -> Completed:
    """`sandbox-conformance ARGS` from `cwd`, as a person typing it there would run it."""
    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    for key in ("SANDBOX_CONFORMANCE_MODE", "SANDBOX_CONFORMANCE_DEPLOYMENT_CONFIG"):
        if env is None or key not in env:
            full.pop(key, None)
    return run([sys.executable, "-P", "-m", "sandbox_conformance", *args], timeout=CLI_TIMEOUT, env=full,
               cwd=str(cwd))


def as_printed(cwd: Path, command: str, env: dict[str, str] | None = None) -> Completed:
    """A printed `sandbox-conformance ...` command, run word for word (our checkout for the program)."""
    words = shlex.split(command)
    assert words[0] == "sandbox-conformance", command
    return cli(cwd, *words[1:], env=env)


def sh(cwd: Path, command: str) -> Completed:
    """A printed shell command, from `cwd`, with our checkout's `sandbox-conformance` first on PATH."""
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    env.pop("SANDBOX_CONFORMANCE_MODE", None)
    return run(["sh", "-c", command], timeout=CLI_TIMEOUT, env=env, cwd=str(cwd))


@pytest.fixture
def mark(tmp_path: Path) -> Path:
    return tmp_path / "check-ran"


@pytest.fixture
def deployment_signature(tmp_path: Path) -> dict[str, str]:
    """A deployment signature whose config path exists: the runner's auto mode refuses here."""
    present = write(tmp_path / "etc/agentd/config.toml", "x = 1\n")
    sig = write(tmp_path / "deployment.toml", f'[deployment]\nconfig_paths = ["{present}"]\n')
    return {"SANDBOX_CONFORMANCE_DEPLOYMENT_CONFIG": str(sig)}


def short_head(repo: Path) -> str:
    return git(repo, "rev-parse", "--short", "HEAD").strip()


def merged_history(repo: Path) -> None:
    """A rename and a deletion on a side branch merged into the feature branch, then more work."""
    git(repo, "checkout", "-q", "-b", "side")
    git(repo, "mv", "src/sandbox/launch.py", "src/sandbox/run.py")
    git(repo, "rm", "-q", "deploy/bwrap/args.py")
    git(repo, "commit", "-q", "-m", "side: rename and delete")
    git(repo, "checkout", "-q", "feature")
    write(repo / "docs/guide.md", "# guide\nfeature\n")
    git(repo, "commit", "-qam", "feature: docs")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge side", "side")


# --- 1. a typo cannot switch a gate off -------------------------------------------------------------

@pytest.mark.parametrize(("table", "named"), [
    ({"tier": [{"name": "t", "globs": ["a"], "run": {"kind": "witness"}}]}, "tier"),
    ({"base": "main"}, "base"),
    ({"require": True}, "require"),
])
def test_an_unknown_key_under_the_tool_table_is_an_error_not_ignored(table: dict, named: str) -> None:
    tiers = [{"name": "ok", "globs": ["src/**"], "run": {"kind": "witness"}}]
    with pytest.raises(InvalidConfig) as e:
        parse({"tool": {"sandbox-conformance": {"tiers": tiers, **table}}}, Path("/r/pyproject.toml"),
              whole_file=False)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("/r/pyproject.toml: unknown key") and named in msg, msg
    with pytest.raises(InvalidConfig, match=named):  # a --config file with the tiers at its top level too
        parse({"tiers": tiers, **table}, Path("/r/mr.toml"), whole_file=True)


TYPO_TIER = """\
[[tool.sandbox-conformance.tier]]
name = "docs-gate"
globs = ["docs/**"]
run = { kind = "command", argv = ["false"] }
"""


def test_a_singular_tier_table_is_exit_2_naming_it_not_a_silent_pass(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", (CHECK_TIER % "/dev/null") + "\n" + TYPO_TIER)
    write(repo / "docs/guide.md", "# guide\nchanged\n")
    git(repo, "commit", "-qam", "docs")
    line = _one_line_exit_2(mr_check(repo))  # before: exit 0, "not sandbox-touching"
    assert "unknown key in [tool.sandbox-conformance]: tier (did you mean tiers?)" in line, line
    write(repo / "pyproject.toml", pyproject('[tool.sandbox-conformance]\nbase = "main"\n\n' + CHECK_TIER
                                             % "/dev/null"))
    assert "unknown key in [tool.sandbox-conformance]: base" in _one_line_exit_2(mr_check(repo))


def test_a_glob_that_matches_no_file_at_head_is_warned_on_every_run(tmp_path: Path) -> None:
    tiers = CHECK_TIER.replace('globs = ["src/sandbox/**", "deploy/bwrap/*.py"]',
                               'globs = ["src/sandbox", "seccomp/**", "deploy/bwrap/*.py"]')
    repo = make_repo(tmp_path / "r", tiers % "/dev/null")
    write(repo / "docs/guide.md", "# guide\nchanged\n")
    done = mr_check(repo)
    assert done.returncode == 0 and "not sandbox-touching" in done.stdout, done.stdout + done.stderr
    warnings = [ln for ln in done.stderr.splitlines() if "warning:" in ln]
    assert len(warnings) == 2, done.stderr
    assert "glob 'src/sandbox' matches no file at HEAD: it names a directory, write 'src/sandbox/**'" \
        in warnings[0]
    assert "glob 'seccomp/**' matches no file at HEAD" in warnings[1]
    # Every run, not only the first, and whatever the verdict.
    assert mr_check(repo, "--format", "json").stderr.count("warning:") == 2


# --- 2. every printed command reproduces the run ---------------------------------------------------------

def test_the_recheck_line_keeps_config_and_repository_and_runs_as_printed(
        tmp_path: Path, deployment_signature: dict[str, str]) -> None:
    repo = make_repo(tmp_path / "r", "")
    write(tmp_path / "ci/mr.toml", WITNESS_TIER.replace("tool.sandbox-conformance.", ""))
    write(repo / "src/sandbox/launch.py", "changed\n")
    git(repo, "commit", "-qam", "change")
    here = tmp_path / "ci"
    done = cli(here, "mr-check", "-C", str(repo), "--config", "mr.toml", "--format", "json",
               env=deployment_signature)
    assert done.returncode == 75, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["recheck"] == shlex.join(["sandbox-conformance", "mr-check", "-C", str(repo), "--config",
                                         str(here / "mr.toml"), "--base", "main"])
    assert doc["recheck"] in doc["handover"]
    # Run as printed, from anywhere on this host: the same check, not "pyproject.toml: no such file".
    again = as_printed(tmp_path, doc["recheck"] + " --format json", env=deployment_signature)
    assert again.returncode == 75, again.stdout + again.stderr
    def same(d: dict) -> list[tuple[str, str, str, str]]:
        return [(t["name"], t["command"], t["outcome"], json.dumps(t["files"])) for t in d["tiers"]]

    assert same(json.loads(again.stdout)) == same(doc)


def test_the_cgroup_way_on_keeps_the_tiers_profile_and_launcher() -> None:
    tier = Tier("cg", ("deploy/**",), TierKind.cgroup, profile="sandbox/limits.toml",
                launcher="/opt/launch --strict", as_user="sbxc")
    r = mr_tiers.cgroup_refusal(tier, None, _delegation(False))
    assert r is not None
    vm = r.ways_on[0].split("  #", 1)[0]
    assert vm == ("sandbox-conformance run --mode vm --profile sandbox/limits.toml --launcher "
                  "'/opt/launch --strict' --as-user sbxc --require -- -m cgroup")
    assert vm == mr_tiers.display_command(tier, "vm")


# --- 3. --mode vm is for witness and cgroup tiers; command tiers run on this host ---------------------------

@pytest.mark.parametrize(("mode", "environ", "expected"), [
    (None, {}, None), ("auto", {}, "auto"), ("native", {}, "native"),
    ("vm", {}, "auto"), ("container", {}, "auto"),
    (None, {"SANDBOX_CONFORMANCE_MODE": "vm"}, "auto"),
    (None, {"SANDBOX_CONFORMANCE_MODE": "native"}, "native"),
])
def test_a_command_tier_is_gated_as_this_host_whatever_the_mode(mode, environ, expected) -> None:
    assert mr_tiers.host_mode(mode, environ) == expected


def test_mode_vm_runs_a_command_tier_on_this_host_and_prints_runnable_commands(tmp_path: Path,
                                                                               mark: Path) -> None:
    _gate_or_skip()
    repo = make_repo(tmp_path / "r", (CHECK_TIER % mark) + "\n" + WITNESS_TIER)
    write(repo / "deploy/bwrap/args.py", "ARGS = []\n")  # touches the command tier only
    git(repo, "commit", "-qam", "args")
    done = mr_check(repo, "--mode", "vm", "--format", "json")
    assert done.returncode == 0, done.stdout + done.stderr  # before: refused because of --mode vm
    [tier] = json.loads(done.stdout)["tiers"]
    assert mark.exists() and tier["outcome"] == "PASS"
    assert tier["command"] == f"MARK={mark} sh tools/check.sh"  # no --mode: it runs here
    mark.unlink()
    assert sh(repo, tier["command"]).returncode == 0 and mark.exists()
    witness = Tier("w", ("src/**",), TierKind.witness)
    assert mr_tiers.display_command(witness, "vm") == "sandbox-conformance run --mode vm"


# --- 4. a cgroup tier must have limits to test -------------------------------------------------------------

def test_a_cgroup_tier_whose_profile_has_no_limits_is_exit_2_before_anything_runs(tmp_path: Path,
                                                                                   mark: Path) -> None:
    repo = make_repo(tmp_path / "r", (CHECK_TIER % mark) + textwrap.dedent("""
        [[tool.sandbox-conformance.tiers]]
        name = "cgroup-limits"
        globs = ["src/sandbox/**"]
        run = { kind = "cgroup", profile = "sandbox/profile.toml" }
        """))
    write(repo / "sandbox/profile.toml", NO_LIMITS_PROFILE)
    write(repo / "src/sandbox/launch.py", "changed\n")
    line = _one_line_exit_2(mr_check(repo))
    assert "tier 'cgroup-limits'" in line and "sandbox/profile.toml has no [limits]" in line, line
    assert not mark.exists()  # checked before the command tier ran


# --- 5. a failure leads with its reason ------------------------------------------------------------------

RED_STDOUT = textwrap.dedent("""\
    masked {state}/db: BROKEN: nothing is mounted at {state}/db inside the task (no mask)
    read_only /usr: kept
    network: not tested: harness error: launcher 'x': exited 1; stderr: boom
    pid: not tested: harness error: launcher 'x': exited 1; stderr: boom
    harness error: launcher 'x': exited 1; stderr: boom
    witness: 1 kept, 1 BROKEN, 2 not tested (profile reference, launcher 'x'): FAIL
""")
RED_STDERR = textwrap.dedent("""\
    =============================== warnings summary ===============================
    .venv/lib/python3.11/site-packages/_pytest/config/__init__.py:1507
      PytestAssertRewriteWarning: Module already imported so cannot be rewritten; conformance

    -- Docs: https://docs.pytest.org/en/stable/how-to/capture-warnings.html
    =========================== short test summary info ============================
    ERROR witnesses/network.py::test_the_task_sees_only_the_loopback_interface
    FAILED witnesses/paths.py::test_a_masked_directory_is_an_empty_read_only_tmpfs[{state}/db]
    ======================== 1 failed, 2 errors in 1.24s ========================
    sandbox-conformance: FAIL mode=native exit=1 time=1.9s
""")


def test_a_red_run_leads_with_the_harness_error_and_the_broken_promises_in_every_format() -> None:
    line = "sandbox-conformance: FAIL mode=native exit=1 time=1.9s"  # the runner's --verdict-json
    doc = RunVerdict("FAIL", "native", "auto", 1, 1.9, line)
    res = classify_runner(_done(1, RED_STDERR, RED_STDOUT), doc)
    assert res.failures == (
        "harness error: launcher 'x': exited 1; stderr: boom (2 promises not tested because of it)",
        "masked {state}/db: BROKEN: nothing is mounted at {state}/db inside the task (no mask)",
        "witness: 1 kept, 1 BROKEN, 2 not tested (profile reference, launcher 'x'): FAIL")
    tail = "\n".join(res.output_tail)
    assert "warnings summary" not in tail and "PytestAssertRewriteWarning" not in tail
    assert "::test_" not in tail and "1 failed, 2 errors" in tail
    tier = Tier("w", ("src/**",), TierKind.witness)
    change = Change("src/a.py", ChangeStatus.modified, Source.committed)
    changes = Changes(Path("/r"), "main", "b" * 40, "m" * 40, "h" * 40, (change,), "hhhhhhh")
    report = CheckReport(changes, Path("/r/pyproject.toml"), Invocation("main"), plan([tier], [change]),
                         (res,))
    text = render(report, ReportFormat.text)
    assert text.index("! harness error: launcher 'x'") < text.index("! masked {state}/db: BROKEN") \
        < text.index("output (tail):")
    md = render(report, ReportFormat.markdown)
    assert "```text\n  harness error: launcher 'x'" in md and "masked {state}/db: BROKEN" in md
    doc = json.loads(render(report, ReportFormat.json))
    assert doc["tiers"][0]["failures"] == list(res.failures)


def test_a_witness_tier_whose_launcher_cannot_start_says_so_first(tmp_path: Path) -> None:
    _witness_suite_or_skip()
    _gate_or_skip()
    repo = make_repo(tmp_path / "r", WITNESS_TIER.replace('{ kind = "witness" }',
                                                          '{ kind = "witness", launcher = "false" }'))
    write(repo / "src/sandbox/launch.py", "changed\n")
    text = mr_check(repo)
    assert text.returncode == 1, text.stdout + text.stderr
    first = text.stdout.split("failed:\n", 1)[1].splitlines()[0]
    assert first.strip().startswith("! harness error: launcher 'false': exited 1"), text.stdout
    md = mr_check(repo, "--format", "markdown").stdout
    assert "harness error: launcher 'false'" in md, md
    doc = json.loads(mr_check(repo, "--format", "json").stdout)
    assert doc["tiers"][0]["failures"][0].startswith("harness error: launcher 'false'")


# --- 6. a relative launcher is the repository's ----------------------------------------------------------

@pytest.mark.parametrize(("launcher", "run_", "shown"), [
    ("./launch.sh", "{root}/launch.sh", '"$PWD/launch.sh"'),
    ("./launch.sh --x '{{workdir}}' 'a$b'", "{root}/launch.sh --x '{{workdir}}' 'a$b'",
     '"$PWD/launch.sh --x \'{workdir}\' \'a\\$b\'"'),
    ("node dist/cli.js", "node {root}/dist/cli.js", '"node $PWD/dist/cli.js"'),
    ("node missing/cli.js", "node missing/cli.js", None),   # not the repository's: left to the launcher
    ("bwrap --ro-bind / /", "bwrap --ro-bind / /", None),
    ("entry-point:mine", "entry-point:mine", None),
])
def test_a_relative_launcher_is_resolved_against_the_repository_root(tmp_path: Path, launcher: str,
                                                                     run_: str, shown: str | None) -> None:
    root = tmp_path / "r"
    write(root / "launch.sh", "#!/bin/sh\n")
    write(root / "dist/cli.js", "")
    paths = resolve_launcher(launcher.format(), root, "w")
    assert (paths.run, paths.shown) == (run_.format(root=root), shown)
    if shown is not None:  # the shell word printed, expanded from the root, is the prefix that ran
        assert sh(root, f"printf %s {shown}").stdout == paths.run


def test_a_missing_relative_launcher_is_exit_2(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfig, match=r"\./nope\.sh: no such file under"):
        resolve_launcher("./nope.sh", tmp_path, "tier 'w' run.launcher")
    repo = make_repo(tmp_path / "r", WITNESS_TIER.replace('{ kind = "witness" }',
                                                          '{ kind = "witness", launcher = "./nope.sh" }'))
    assert "run.launcher: ./nope.sh: no such file" in _one_line_exit_2(mr_check(repo))


def test_a_tier_with_a_relative_launcher_launches_it_and_prints_it_runnable(tmp_path: Path) -> None:
    _witness_suite_or_skip()
    _gate_or_skip()
    launched = tmp_path / "launched"
    tiers = "".join(textwrap.dedent(f"""
        [[tool.sandbox-conformance.tiers]]
        name = "{name}"
        globs = ["src/sandbox/**"]
        run = {{ kind = "witness", profile = "sandbox/profile.toml", launcher = "{launcher}" }}
        """) for name, launcher in (("dot-slash", "./launch.sh"), ("interpreter", "sh tools/launch.sh")))
    repo = make_repo(tmp_path / "r", tiers)
    # Not a sandbox: it records that it ran and runs the task as given, so nothing here is a harness error.
    script = f'#!/bin/sh\necho "$0" >> "{launched}"\nexec "$@"\n'
    write(repo / "launch.sh", script).chmod(0o755)
    write(repo / "tools/launch.sh", script)
    write(repo / "sandbox/profile.toml", NO_LIMITS_PROFILE)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "launchers")
    write(repo / "src/sandbox/launch.py", "changed\n")
    doc = json.loads(mr_check(repo, "--format", "json").stdout)
    # Both launchers ran (before: "harness error: launcher './launch.sh': could not be executed").
    assert launched.exists(), doc
    assert set(launched.read_text().split()) == {str(repo / "launch.sh"), str(repo / "tools/launch.sh")}
    for tier in doc["tiers"]:
        assert not any("harness error" in f for f in tier["failures"]), tier
    dot, interpreter = (t["command"] for t in doc["tiers"])
    assert dot.endswith('--profile sandbox/profile.toml --launcher "$PWD/launch.sh"'), dot
    assert interpreter.endswith('--launcher "sh $PWD/tools/launch.sh"'), interpreter
    assert "launcher ./launch.sh" in doc["tiers"][0]["description"]
    # As printed, from the repository root: the same launcher runs.
    launched.unlink()
    again = sh(repo, dot)
    assert again.returncode == doc["tiers"][0]["exit_code"], again.stdout + again.stderr
    # Once per launch: the task, the lifecycle promise's and the terminal promise's.
    assert set(launched.read_text().split()) == {str(repo / "launch.sh")}


# --- 7. prepare, and the commit tested ------------------------------------------------------------------

PREPARED_TIER = """\
[[tool.sandbox-conformance.tiers]]
name = "sandbox-check"
globs = ["src/sandbox/**"]
prepare = %s
run = { kind = "command", argv = ["sh", "-c", 'test -f built.txt && touch "$MARK"'], env = { MARK = "%s" } }
"""


def test_prepare_runs_from_the_root_before_its_tier_and_is_printed_with_it(tmp_path: Path,
                                                                          mark: Path) -> None:
    _gate_or_skip()
    repo = make_repo(tmp_path / "r", PREPARED_TIER % ('["sh", "-c", "echo built > built.txt"]', mark))
    write(repo / "src/sandbox/launch.py", "changed\n")
    done = mr_check(repo, "--format", "json")
    assert done.returncode == 0, done.stdout + done.stderr  # before: exit 2, prepare an unknown key
    [tier] = json.loads(done.stdout)["tiers"]
    assert mark.exists() and (repo / "built.txt").read_text() == "built\n"
    assert tier["command"].startswith("sh -c 'echo built > built.txt' && MARK=")
    (repo / "built.txt").unlink()
    mark.unlink()
    assert sh(repo, tier["command"]).returncode == 0 and mark.exists()


def test_a_failing_prepare_fails_its_tier_with_its_output(tmp_path: Path, mark: Path) -> None:
    _gate_or_skip()
    repo = make_repo(tmp_path / "r", PREPARED_TIER % ('"echo the-build-broke >&2; exit 3"', mark))
    write(repo / "src/sandbox/launch.py", "changed\n")
    done = mr_check(repo)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "result: prepare `sh -c 'echo the-build-broke >&2; exit 3'` exited 3" in done.stdout
    assert "| the-build-broke" in done.stdout and not mark.exists()


def test_a_prepare_step_never_runs_where_the_runner_refuses(tmp_path: Path, mark: Path,
                                                           deployment_signature: dict[str, str]) -> None:
    prepared = WITNESS_TIER.replace("run = {", f'prepare = ["touch", "{mark}"]\nrun = {{')
    repo = make_repo(tmp_path / "r", prepared)
    write(repo / "src/sandbox/launch.py", "changed\n")
    done = mr_check(repo, "--format", "json", env=deployment_signature)
    assert done.returncode == 75, done.stdout + done.stderr
    assert not mark.exists()
    assert f"touch {mark} && sandbox-conformance run" in json.loads(done.stdout)["handover"]


def test_the_environments_mode_is_printed_explicitly(tmp_path: Path) -> None:
    _gate_or_skip()
    repo = make_repo(tmp_path / "r", WITNESS_TIER.replace('run = {', 'prepare = "exit 3"\nrun = {'))
    write(repo / "src/sandbox/launch.py", "changed\n")
    done = mr_check(repo, "--format", "json", env={"SANDBOX_CONFORMANCE_MODE": "native"})
    assert done.returncode == 1, done.stdout + done.stderr  # the prepare step failed
    doc = json.loads(done.stdout)
    assert doc["tiers"][0]["command"] == "sh -c 'exit 3' && sandbox-conformance run --mode native"
    assert doc["recheck"] == "sandbox-conformance mr-check --base main --mode native"


def test_every_report_names_the_commit_tested_and_whether_the_tree_was_dirty(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", CHECK_TIER % "/dev/null")
    merged_history(repo)
    head = short_head(repo)
    clean = mr_check(repo, "--base", "main", "--format", "json")
    doc = json.loads(clean.stdout)
    assert (doc["commit"], doc["dirty"], doc["uncommitted_files"]) == (head, False, [])
    write(repo / "docs/guide.md", "# edited, not committed\n")
    write(repo / "docs/new.md", "untracked\n")
    for fmt in ("text", "markdown"):
        out = mr_check(repo, "--format", fmt).stdout
        assert f"tested {head} (work tree dirty: 2 uncommitted files)" in out, out
    doc = json.loads(mr_check(repo, "--format", "json").stdout)
    assert (doc["dirty"], doc["uncommitted_files"]) == (True, ["docs/guide.md", "docs/new.md"])
    # The untouched one-liner says it too.
    git(repo, "checkout", "-q", "--", "docs/guide.md")
    (repo / "docs/new.md").unlink()
    git(repo, "checkout", "-q", "-b", "docs-only", "main")
    write(repo / "docs/guide.md", "# docs\n")
    git(repo, "commit", "-qam", "docs")
    line = mr_check(repo).stdout
    assert f"tested {short_head(repo)} (work tree clean)" in line and "not sandbox-touching" in line


# --- 8. the handover ------------------------------------------------------------------------------------

def test_the_handover_is_what_a_reviewer_pastes(tmp_path: Path, deployment_signature: dict[str, str]) -> None:
    repo = make_repo(tmp_path / "r", WITNESS_TIER)
    merged_history(repo)                                   # committed: a rename, via a merge
    write(repo / "src/sandbox/seccomp.json", "{}\n")       # uncommitted
    write(repo / "src/sandbox/extra.py", "x\n")            # untracked
    done = mr_check(repo, "--format", "markdown", env=deployment_signature)
    assert done.returncode == 75, done.stdout + done.stderr
    md = done.stdout
    lines = md.splitlines()
    assert lines[0] == ("### Sandbox conformance: not verified here: needs `witness-reference` run on a "
                        "host that can")
    assert not [ln for ln in lines if ln.startswith("#") and "REFUSED" in ln]
    assert "- `src/sandbox/run.py` (renamed from `src/sandbox/launch.py`)" in md
    assert "seccomp.json" not in md and "extra.py" not in md and "Plus 2 uncommitted files." in md
    assert "```sh\nsandbox-conformance run\n```" in md
    assert "```sh\nsandbox-conformance mr-check --base main\n```" in md
    [why] = [ln for ln in lines if ln.startswith("Why not here:")]
    assert why == "Why not here: this is a deployment host; auto will not pick a mode here.", why
    assert "`sandbox-conformance probe`" in md


def test_the_handover_says_why_in_plain_words_without_probe_internals() -> None:
    finding = _delegation(False)
    internal = type(finding)(finding.probe, finding.verdict,
                             "no usable delegated root (hybrid layout): /sys/fs/cgroup/unified is the "
                             "machine's root cgroup (it has no cgroup.type), which nobody delegates",
                             facts=finding.facts)
    tier = Tier("cgroup-limits", ("deploy/**",), TierKind.cgroup)
    res = mr_tiers.cgroup_refusal(tier, None, internal)
    assert res is not None and "/sys/fs/cgroup/unified" in res.reason  # kept for the text report
    change = Change("deploy/cgroup.toml", ChangeStatus.added, Source.committed)
    changes = Changes(Path("/r"), "main", "b" * 40, "m" * 40, "h" * 40, (change,), "hhhhhhh")
    report = CheckReport(changes, Path("/r/pyproject.toml"), Invocation("main", repo=Path("/r")),
                         plan([tier], [change]), (res,))
    for fmt in (ReportFormat.markdown, ReportFormat.text):
        hand = render(report, fmt)
        if fmt is ReportFormat.text:
            hand = hand.split("Handover (paste into the merge request):", 1)[1]
        [why] = [ln for ln in hand.splitlines() if ln.startswith("Why not here:")]
        assert "/sys/fs" not in why and "cgroup.delegation" not in why and "skip" in why, why
        assert "sandbox-conformance run --mode vm --require -- -m cgroup" in hand
        assert "sandbox-conformance mr-check -C /r --base main" in hand


@pytest.mark.parametrize(("reason", "plain"), [
    ("this is a deployment host (signature matched: path /etc/agentd.toml); auto will not pick a mode here",
     "this is a deployment host; auto will not pick a mode here"),
    ("running inside a sandbox (signals: seccomp (filter 2)): nested user namespaces are refused",
     "running inside a sandbox: nested user namespaces are refused"),
    ("no bwrap: bwrap: unsupported: not on PATH", "no bwrap"),
    ("something plain", "something plain"),
])
def test_a_refusal_reason_in_plain_words(reason: str, plain: str) -> None:
    assert mr_tiers.plain_words(reason) == plain
    assert TierResult(TierOutcome.refused, reason).plain_why == plain


# --- 9. a shallow clone ----------------------------------------------------------------------------------

def test_a_shallow_clone_is_named_with_how_to_deepen_it(tmp_path: Path) -> None:
    upstream = make_repo(tmp_path / "up", CHECK_TIER % "/dev/null")
    write(upstream / "src/sandbox/launch.py", "feature\n")
    git(upstream, "commit", "-qam", "feature work")
    git(upstream, "checkout", "-q", "main")
    write(upstream / "docs/guide.md", "# main moved on\n")
    git(upstream, "commit", "-qam", "main work")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", "--depth", "1", "--no-single-branch", f"file://{upstream}", str(clone))
    git(clone, "checkout", "-q", "feature")
    line = _one_line_exit_2(mr_check(clone, "--base", "origin/main"))
    assert "shallow clone" in line and "git fetch --deepen=" in line and "git fetch --unshallow" in line, line
    # The advice works.
    git(clone, "fetch", "-q", "--unshallow")
    done = mr_check(clone, "--base", "origin/main")
    assert done.returncode != 2, done.stdout + done.stderr
    assert "src/sandbox/launch.py" in done.stdout
