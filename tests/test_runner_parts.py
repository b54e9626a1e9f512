"""The runner's pure pieces: witness argv, native environment, container flags and verdict combination."""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import pytest

from sandbox_conformance.processes.children import run
from sandbox_conformance.runners import container, native, witness_args
from sandbox_conformance.runners.container import Engine, Leg, combine, inside_options, security_flags
from sandbox_conformance.runners.witness_args import WitnessOptions


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    witness_args.add_arguments(p)
    return p.parse_args(argv)


def test_witness_options_round_trip_into_the_witness_command() -> None:
    ns = parse("--profile", "p.toml", "--launcher", "my-sbx --task {task_id}", "--require",
               "--junitxml", "j.xml", "--", "-k", "control", "--maxfail=1")
    argv = WitnessOptions.from_args(ns).argv()
    assert argv == ["--profile", "p.toml", "--launcher", "my-sbx --task {task_id}", "--junitxml", "j.xml",
                    "--require", "--", "-k", "control", "--maxfail=1"]
    assert native.witness_argv(WitnessOptions(), python="/py") == ["/py", "-m", "sandbox_conformance",
                                                                   "witness"]


def test_native_mode_drops_an_inherited_cgroup_root_and_keeps_the_rest() -> None:
    env = native.native_env({"SANDBOX_CONFORMANCE_CGROUP_ROOT": "/sys/fs/cgroup/x", "PATH": "/bin",
                             "SANDBOX_CONFORMANCE_REQUIRE": "1"})
    assert env == {"PATH": "/bin", "SANDBOX_CONFORMANCE_REQUIRE": "1"}


def test_the_child_of_a_native_run_does_not_see_the_cgroup_root(capfd: pytest.CaptureFixture[str]) -> None:
    env = native.native_env({"SANDBOX_CONFORMANCE_CGROUP_ROOT": "/x", "PATH": "/usr/bin:/bin"})
    code = "import os; print('root=' + os.environ.get('SANDBOX_CONFORMANCE_CGROUP_ROOT', 'unset'))"
    assert run([sys.executable, "-c", code], timeout=30, env=env, capture=False).returncode == 0
    assert "root=unset" in capfd.readouterr().out


def test_an_uncaptured_run_kills_the_whole_group_on_timeout(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    done = run(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], timeout=1, capture=False)
    assert done.returncode is None and done.timed_out
    pid = int(pidfile.read_text())
    # SIGKILL is delivered asynchronously; the orphan is then reaped by whoever adopted it.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    assert not _alive(pid), f"the group's background sleep {pid} survived the timeout"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_the_delegated_rerun_goes_through_systemd_run_with_delegation() -> None:
    argv = native.delegate_argv(["--mode", "native"], systemd_run="/usr/bin/systemd-run", python="/py")
    assert argv[:2] == ["/usr/bin/systemd-run", "--user"]
    assert "Delegate=yes" in argv and "--pipe" in argv and "--wait" in argv
    assert f"--setenv={native.DELEGATED_ENV}=1" in argv
    assert argv[argv.index("--") + 1:] == ["/bin/sh", "-c", native.ENTER_SUPERVISOR.replace("$", "$$"), "sh",
                                           "/py", "-m", "sandbox_conformance", "run", "--mode", "native"]


@pytest.mark.parametrize("kind", ["docker", "podman"])
def test_container_flags_are_what_bwrap_needs_and_not_privileged(kind: str) -> None:
    flags = security_flags(kind)
    pairs = list(itertools.pairwise(flags))
    assert ("--cap-add", "SYS_ADMIN") in pairs and ("--cap-add", "NET_ADMIN") in pairs
    assert ("--security-opt", "seccomp=unconfined") in pairs
    unmask = "systempaths=unconfined" if kind == "docker" else "unmask=ALL"
    assert ("--security-opt", unmask) in pairs
    assert "--cgroupns=private" in flags  # the set-up step runs in the container's own cgroup namespace
    assert not any("/sys/fs/cgroup" in f for f in flags)  # never the host's tree
    assert "--privileged" not in flags


def test_the_checkout_is_bound_read_only_at_src() -> None:
    engine = Engine("docker", "/usr/bin/docker", {})
    argv = container.start_argv(engine, name="n", image="img", repo=Path("/co"), inputs=Path("/i"),
                                outputs=Path("/o"))
    assert "/co:/src:ro" in argv
    assert argv[-3:] == ["img", "sleep", "infinity"]


def test_the_build_passes_the_base_image_as_a_build_argument() -> None:
    engine = Engine("docker", "/usr/bin/docker", {})
    argv = container.build_argv(engine, tag="t", base="bookworm-local", repo=Path("/co"))
    at = argv.index("--build-arg")
    assert argv[at:at + 2] == ["--build-arg", "BASE=bookworm-local"]
    assert argv[-1] == "/co" and "--build-arg" not in container.build_argv(engine, tag="t", base=None)


def test_inside_options_move_files_into_the_binds_and_name_reports_per_user(tmp_path: Path) -> None:
    profile = tmp_path / "p.toml"
    profile.write_text("x")
    inputs = tmp_path / "in"
    inputs.mkdir()
    opts, reports = inside_options(WitnessOptions(profile=str(profile), junitxml=str(tmp_path / "r.xml"),
                                                  pytest_args=("-x",)), label="sbxc", inputs=inputs)
    assert opts.profile == f"{container.INPUTS}/profile-p.toml"
    assert (inputs / "profile-p.toml").read_text() == "x"
    assert opts.junitxml == f"{container.OUTPUTS}/junit-sbxc.xml"
    assert reports == {f"{container.OUTPUTS}/junit-sbxc.xml": str(tmp_path / "r-sbxc.xml")}
    assert opts.pytest_args == ("-x",)


@pytest.mark.parametrize(("codes", "expect"), [
    ((0, 0), 0),
    ((0, 1), 1),
    ((1, 0), 1),
    ((0, 75), 75),
    ((75, 1), 1),
    ((0, None), 1),  # a timeout is red, never a pass
    ((2, 0), 2),
    ((0, 3), 1),
    ((), 1),
])
def test_both_container_verdicts_count(codes: tuple[int | None, ...], expect: int) -> None:
    assert combine([Leg(str(i), c) for i, c in enumerate(codes)]) == expect


def test_a_run_verdicts_legs_round_trip_and_an_older_document_has_none(tmp_path: Path) -> None:
    from sandbox_conformance.runners import run_verdict
    from sandbox_conformance.runners.run_verdict import Leg, RunVerdict

    summary = ("witness: 0 kept, 1 BROKEN, 0 not tested (profile p, launcher 'x'): FAIL "
               "[1 witnesses: 1 failed]")
    leg = Leg("root", 1, summary, ("harness error: x",), (("pid", "BROKEN", "saw 1"), ("uts", "kept", "")))
    line = "sandbox-conformance: FAIL mode=container exit=1 time=2.0s"
    doc = RunVerdict("FAIL", "container", "container", 1, 2.0, line, legs=(leg,))
    run_verdict.write(tmp_path / "v.json", doc)
    assert run_verdict.read(tmp_path / "v.json") == doc
    older = doc.to_json()
    del older["legs"]  # a key added within version 1: a document without it is still one
    assert RunVerdict.from_json(older) == doc._replace(legs=())
    # A witness report from before summary.line is no leg; a report that is one is.
    report = {"exit": 1, "summary": {"line": leg.summary}, "problems": list(leg.problems),
              "promises": [{"promise": p, "verdict": v, "detail": d, "id": p} for p, v, d in leg.promises]}
    assert Leg.from_report("root", report) == leg
    del report["summary"]["line"]
    with pytest.raises(ValueError, match="line"):
        Leg.from_report("root", report)
