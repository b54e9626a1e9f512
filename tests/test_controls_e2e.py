"""`sandbox-conformance controls` end to end on this host: the real command, the real witness suite,
the real reference sandbox; as root and as the unprivileged test user. Every control must behave,
and the coverage table must list no witness as neither controlled nor justified. Then the judge is
shown to catch, in REAL runs, a control that names the wrong witness and one whose sandbox does not
start (a harness error is never a red witness)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_conformance.commands import controls as controls_cmd
from sandbox_conformance.conformance import controls
from sandbox_conformance.conformance.controls import Control
from sandbox_conformance.conformance.controls_judge import ControlStatus

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.integration


@pytest.fixture
def reference_ready(root_only: None, bwrap_path: str) -> None:
    """The controls perturb the reference sandbox; where it cannot run they cannot either."""


@pytest.fixture
def private_tmpdir() -> Iterator[Path]:
    """A TMPDIR of this test's own, so what the command leaves is told apart from what other runs on
    the machine are doing in /tmp at the same time. 0755 and outside pytest's 0700 base: with
    --as-user the layout under it must be traversable by the task user."""
    path = Path(tempfile.mkdtemp(prefix="sbxc-e2e-tmp-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_controls(
    *args: str, tmpdir: Path | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    done = subprocess.run(
        [sys.executable, "-m", "sandbox_conformance", "controls", "--json", *args],
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=300,
        # No SANDBOX_CONFORMANCE_REQUIRE from CI: the command must judge skips as skips itself.
        env=env,
    )
    try:
        doc = json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(
            f"controls printed no JSON (exit {done.returncode}): {done.stdout[-500:]} {done.stderr[-1500:]}"
        )
    return done, doc


@pytest.mark.parametrize("as_user", [None, "sbxc-test"], ids=["root", "unprivileged"])
@pytest.mark.timeout(300)  # run_controls' own bound: ~60 witness runs, 2 at a time, on a loaded 2-core host
def test_every_control_reddens_exactly_its_witnesses_and_every_witness_is_covered(
    reference_ready: None, request: pytest.FixtureRequest, as_user: str | None, private_tmpdir: Path
) -> None:
    if as_user:
        as_user = request.getfixturevalue("test_user")
    done, doc = run_controls(*(["--as-user", as_user] if as_user else []), tmpdir=private_tmpdir)
    failed = {c["name"]: c["problems"] for c in doc["controls"] if c["status"] == "failed"}
    assert not failed, f"controls that misbehaved: {failed}"
    assert doc["unsandboxed"]["status"] == "ok", doc["unsandboxed"]["problems"]
    neither = [c["test"] for c in doc["coverage"] if c["status"] == "NEITHER"]
    assert not neither, f"witnesses neither controlled nor justified: {neither}"
    assert doc["baseline"]["problems"] == []
    assert done.returncode == 0, done.stderr[-1500:]
    # Every control ran unless the probe says it cannot mean anything here, and then it says why.
    for c in doc["controls"]:
        if c["status"] == "not_applicable":
            # Only the controls whose boundary this host cannot give at all: --disable-userns, or a
            # cgroup root (the cgroup controls run in the VM tier, tests/test_vm.py); as a user, those
            # that only root's tasks could show (the host's sysctls and devices are root's).
            needs = controls.by_name()[c["name"]].needs
            cgroup = (controls.Needs.cgroup_root, controls.Needs.cgroup_root_as_root)
            elsewhere = (controls.Needs.disable_userns, controls.Needs.x86_64, controls.Needs.legacy_tiocsti)
            cgroupfs, binfmt = controls.Needs.host_cgroupfs_as_root, controls.Needs.binfmt_misc_as_root
            no_cgroupfs = needs is cgroupfs and "no cgroup hierarchy" in c["reason"]
            no_binfmt = needs is binfmt and "has no binfmt_misc" in c["reason"]
            unprivileged = c["reason"].startswith("tasks run as an unprivileged")
            root_only = (controls.Needs.as_root, controls.Needs.one_userns, cgroupfs, binfmt)
            as_user = needs in root_only and unprivileged
            missing = no_cgroupfs or no_binfmt
            assert (needs in elsewhere or needs in cgroup or as_user or missing) and c["reason"], c
            if needs in cgroup:
                assert not doc["cgroup_root"]["usable"] and doc["cgroup_root"]["reason"] in c["reason"], c
        else:
            assert sorted(c["reddened"]) == sorted(c["must_redden"]), c
    # The unsandboxed run turned every isolation witness red (each one passed in the baseline); as a
    # user, not those file modes keep with no sandbox at all (the host's sysctls and devices).
    by_modes = controls.mode_kept() if as_user else frozenset()
    isolation = [
        t
        for t, r in doc["baseline"]["witnesses"].items()
        if r["outcome"] == "passed" and t not in controls.AVAILABILITY | controls.HARNESS_ENFORCED | by_modes
    ]
    assert isolation and sorted(doc["unsandboxed"]["reddened"]) == sorted(isolation)
    assert list(private_tmpdir.iterdir()) == [], "the controls run left files in its TMPDIR"


def _judge_real(chosen: list[Control]) -> controls_cmd.ControlsReport:
    from sandbox_conformance.conformance.preconditions import findings

    f = findings(None)["disable_userns"]
    with tempfile.TemporaryDirectory(prefix="sbxc-controls-") as tmp:
        witness = controls_cmd.witness_runner(as_user=None, timeout=120, workdir=Path(tmp))
        return controls_cmd.execute(
            witness,
            chosen,
            with_unsandboxed=False,
            disable_userns=(f.ok, f.reason),
            jobs=2,
            partial=True,
        )


def test_a_control_that_names_the_wrong_witness_fails_in_a_real_run(reference_ready: None) -> None:
    # ipc_shared really reddens the ipc witness; this control claims the uts one instead.
    wrong = Control(
        "wrong", "the host ipc namespace, claimed as uts", reddens=(controls.UTS,), perturb="ipc_shared"
    )
    report = _judge_real([wrong])
    [v] = report.verdicts
    assert v.status is ControlStatus.failed
    assert len(v.problems) == 2
    assert v.problems[0] == f"{controls.key(controls.UTS)}: left green"
    assert v.problems[1].startswith(
        f"{controls.key(controls.IPC)}: undeclared collateral: passed in the baseline, assertion"
    )
    assert report.exit_code == 1


def test_a_control_whose_sandbox_does_not_start_is_red_for_the_wrong_reason(reference_ready: None) -> None:
    # bwrap rejects the unknown option before it runs anything: every witness is a harness error.
    broken = Control(
        "broken",
        "bwrap is given an option it does not know",
        reddens=(controls.IPC,),
        launcher_args=("--append=--no-such-option",),
    )
    report = _judge_real([broken])
    [v] = report.verdicts
    assert v.status is ControlStatus.failed and v.reddened == ()
    assert v.problems[0].startswith(f"{controls.key(controls.IPC)}: red for the wrong reason: error (")
    assert "harness error" in v.problems[0].lower() and "--no-such-option" in v.problems[0]


def test_where_the_reference_sandbox_cannot_run_the_command_refuses_with_75(
    reference_ready: None, bwrap_path: str
) -> None:
    # Inside `bwrap --unshare-user --disable-userns` no user namespace can be created, so the baseline's
    # reference sandbox cannot start: nothing can be controlled, and that is not a red run.
    from sandbox_conformance.conformance.preconditions import findings

    f = findings(None)["disable_userns"]
    if not f.ok:
        pytest.skip(f"disable_userns probe: {f.verdict}: {f.reason}")
    done = subprocess.run(
        [
            *(bwrap_path, "--unshare-user", "--disable-userns", "--dev-bind", "/", "/", "--proc", "/proc"),
            *("--", sys.executable, "-m", "sandbox_conformance", "controls"),
        ],
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=120,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    assert done.returncode == 75, (done.stdout[-500:], done.stderr[-1000:])
    [line, *_] = done.stderr.splitlines()
    assert line.startswith("sandbox-conformance controls: refused: the baseline (reference sandbox")
    assert "no witness passed in the baseline" in line
    assert done.stdout == ""
