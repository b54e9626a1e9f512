"""The adapters end to end on this host: each real tool (unshare, runc, crun) runs the witness suite
through `sandbox-conformance witness --profile <adapter profile> --launcher <adapter prefix>` and
every promise its profile makes is kept; an external launcher shell script with ONE defect (the
control directory bound read-write) is reported red naming that promise, and the same script with
the defect fixed is green; an OCI bundle that masks a path missing from its rootfs is red in our
suite where OCI runtime-tools' masked-path check passes; and nothing is left behind."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import time
from pathlib import Path

import pytest
from witness_cli import junit, witness

from sandbox_conformance.conformance import adapters
from sandbox_conformance.conformance.adapters import oci, systemd_run

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
DEFECTIVE = FIXTURES / "defective-launcher.sh"
pytestmark = pytest.mark.integration


def verdicts(report: dict) -> dict[str, str]:
    return {p["promise"]: p["verdict"] for p in report["promises"]}


def run_adapter(
    tmp_path: Path, profile: Path | str, launcher: str, *extra: str
) -> tuple[int, dict, dict, str]:
    j, x = tmp_path / "r.json", tmp_path / "j.xml"
    done = witness(
        "--profile", str(profile), "--launcher", launcher, "--launcher-spec", "--launcher-stdin",
        "--json", str(j), "--junitxml", str(x), *extra
    )
    assert j.exists(), f"no JSON report (exit {done.returncode}): {done.stdout}{done.stderr[-2000:]}"
    return done.returncode, json.loads(j.read_text()), junit(x), done.stdout


def residue() -> dict[str, list[str]]:
    """What an OCI adapter run could leave: its temp dirs (bundle, runtime state), mounts under them,
    runtime processes. (The witness layout is the harness's to remove, and other suites may be
    creating theirs concurrently: not counted here.)"""
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    dirs = sorted(p.name for p in tmp.glob("sbxc-oci-*"))
    mounts = [
        ln.split()[4]
        for ln in Path("/proc/self/mountinfo").read_text().splitlines()
        if "/sbxc-oci-" in ln.split()[4]
    ]
    procs = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes()
            except OSError:
                continue
            if b"sbxc-oci-" in cmd:
                procs.append(p.name)
    return {"dirs": dirs, "mounts": mounts, "processes": procs}


GUARDIAN_BOUND = 30.0


def hung(token: str) -> list[str]:
    out = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and token.encode() in (p / "cmdline").read_bytes():
                out.append(p.name)
        except OSError:
            continue
    return out


@pytest.fixture
def no_residue():
    before = residue()
    yield
    # The lifecycle launch SIGKILLs its launcher at the handshake: the adapter's guardian (a session
    # of its own) then deletes the container and removes the workspace, after the witness has ended.
    # It must do so within a bound, not before we look: on a loaded machine it took seconds.
    deadline = time.monotonic() + GUARDIAN_BOUND
    while True:
        after = residue()
        new = {k: sorted(set(after[k]) - set(before[k])) for k in after}
        if not any(new.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not any(new.values()), f"left behind {GUARDIAN_BOUND:g} s after the run: {new}"


def every_promise_kept(code: int, report: dict, cases: dict, stdout: str) -> None:
    broken = {k: v for k, v in verdicts(report).items() if v != "kept"}
    assert not broken, f"{broken}\n{stdout}"
    assert code == 0, stdout
    assert cases and set(cases.values()) == {"passed"}, cases


# ---- unshare -------------------------------------------------------------------------------------


@pytest.mark.parametrize("as_user", [None, "sbxc-test"], ids=["root", "unprivileged"])
def test_unshare_keeps_the_namespaces_its_flags_promise(
    root_only: None, request: pytest.FixtureRequest, tmp_path: Path, no_residue: None, as_user: str | None
) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("unshare not installed (apt-get install util-linux)")
    r = adapters.resolve("unshare")
    extra = ["--as-user", request.getfixturevalue("test_user")] if as_user else []
    code, report, cases, stdout = run_adapter(tmp_path, r.profile, r.launcher, *extra)
    every_promise_kept(code, report, cases, stdout)
    # Exactly the promises those flags make, each witnessed by a live task.
    # (kernel_view, leftovers and descriptors: every profile's, judged by the host-side observer; the
    # other default promises unshare.toml disclaims, with what was measured.)
    made = {
        "network", "pid", "ipc", "uts", "kernel_view", "leftovers", "descriptors", "unchanged", "lifecycle",
        "syscalls",
    }
    assert set(verdicts(report)) == made
    assert "test_the_task_sees_only_the_loopback_interface" in cases


# ---- OCI: runc (rootless) and crun (root) --------------------------------------------------------


def oci_ready(runtime: str, as_user: str | None) -> adapters.Resolved:
    try:
        return adapters.resolve(runtime, as_user=as_user)
    except adapters.Unavailable as e:
        pytest.skip(f"{runtime} adapter: {e}")


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_an_oci_runtime_keeps_every_promise_of_the_bundle(
    root_only: None, request: pytest.FixtureRequest, tmp_path: Path, no_residue: None, runtime: str
) -> None:
    # runc only rootless (as root it would create host cgroups); crun as root (see oci.py).
    as_user = request.getfixturevalue("test_user") if runtime == "runc" else None
    r = oci_ready(runtime, as_user)
    extra = ["--as-user", as_user] if as_user else []
    code, report, cases, stdout = run_adapter(tmp_path, r.profile, r.launcher, *extra)
    every_promise_kept(code, report, cases, stdout)
    assert set(verdicts(report)) >= {
        "masked {state}/db",
        "control",
        "absent {other_user}",
        "nested_userns",
        "capabilities",
        "environment",
        "network",
    }
    # The observations came from inside the container: the bundle's hostname and seccomp took effect.
    [task] = report["tasks"]
    assert task["observations"]["hostname"] == oci.HOSTNAME
    # Every door to a nested user namespace meets the bundle's seccomp rule. clone3(2) passes its
    # flags in memory a filter cannot read, so runtimes refuse it whole with ENOSYS (glibc then
    # falls back to clone(2), which the rule reads).
    doors = {name: d["errno"] for name, d in task["observations"]["nested_userns"].items()}
    assert doors["clone"] == doors["unshare"] == "EPERM" and doors["clone3"] in ("EPERM", "ENOSYS"), doors


def test_the_shipped_oci_profile_is_the_one_derived_from_the_bundle() -> None:
    assert (REPO / "conformance" / "adapters" / "oci.toml").read_text() == oci.shipped_profile_text()


def test_a_masked_path_missing_from_the_rootfs_is_broken_here_but_passes_runtime_tools(
    root_only: None, tmp_path: Path, no_residue: None
) -> None:
    """The bundle's config masks {state}/db, but the state tree is not in the rootfs, so the runtime
    has nothing to mask and skips it silently (runc and crun ignore ENOENT in maskPaths). OCI
    runtime-tools' validateMaskedPaths passes that (an IsNotExist error is not an error, the path is
    "not readable"); a masked promise is about a mask, and our witness sees none there."""
    r = oci_ready("crun", None)
    profile = tmp_path / "oci-mask-missing.toml"
    profile.write_text(
        oci.profile_toml(oci.derive_profile(oci.template(bind_state=False), name="oci-mask-missing"))
    )
    launcher = r.launcher.replace("--runtime crun", "--runtime crun --mask-missing")
    assert launcher != r.launcher
    code, report, cases, stdout = run_adapter(tmp_path, profile, launcher)
    assert code == 1, stdout
    assert verdicts(report)["masked {state}/db"] == "BROKEN", stdout
    assert cases["test_a_masked_directory_is_an_empty_read_only_tmpfs[{state}/db]"] == "failure"
    not_kept = {p["promise"]: p["detail"] for p in report["promises"] if p["verdict"] != "kept"}
    assert set(not_kept) == {"masked {state}/db"}, stdout
    # The same observation through runtime-tools' eyes: its TAP line would be "ok".
    [task] = report["tasks"]
    db = next(
        o["path"] for o in task["observations"]["ops"] if o["op"] == "stat" and o["path"].endswith("/db")
    )
    by_op = {o["op"]: o["result"] for o in task["observations"]["ops"] if o["path"] == db}
    assert by_op["stat"] == {"ok": False, "errno": "ENOENT"}
    assert oci.runtime_tools_masked_check(by_op["stat"], by_op["list"]) is True


# ---- systemd-run ---------------------------------------------------------------------------------


def test_systemd_run_keeps_every_promise_of_its_properties(
    root_only: None, tmp_path: Path, no_residue: None
) -> None:
    try:
        r = adapters.resolve("systemd-run")
    except adapters.Unavailable as e:
        pytest.skip(f"not tested: {e}")
    code, report, cases, stdout = run_adapter(tmp_path, r.profile, r.launcher)
    every_promise_kept(code, report, cases, stdout)


def test_the_systemd_run_adapter_refuses_where_systemd_is_not_pid_1(tmp_path: Path) -> None:
    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc" / "1" / "comm").write_text("tini\n")
    assert systemd_run.booted(tmp_path) == "systemd is not PID 1 (no /run/systemd/system, sd_booted(3))"
    (tmp_path / "run" / "systemd" / "system").mkdir(parents=True)
    assert systemd_run.booted(tmp_path) == "systemd is not PID 1 (PID 1 is 'tini')"
    (tmp_path / "proc" / "1" / "comm").write_text("systemd\n")
    assert systemd_run.booted(tmp_path) is None


# ---- an external launcher with one defect --------------------------------------------------------


def defective_prefix(script: Path) -> str:
    return shlex.join(["sh", str(script)]) + " {state} {control} {workdir} {user_tmp} --"


@pytest.fixture
def bwrap_ready(root_only: None, bwrap_path: str) -> str:
    return bwrap_path


def test_a_launcher_that_binds_the_control_directory_read_write_is_reported_red_naming_it(
    bwrap_ready: str, tmp_path: Path, no_residue: None
) -> None:
    code, report, cases, stdout = run_adapter(
        tmp_path, FIXTURES / "defective-launcher.toml", defective_prefix(DEFECTIVE)
    )
    assert code == 1, stdout
    not_kept = {k: v for k, v in verdicts(report).items() if v != "kept"}
    # The one defect, seen three ways: the writes the task made, and (from the host's reading of the
    # task's mount table) a read-write bind of host storage beneath the read-only {state}.
    assert not_kept == {"control": "BROKEN", "read_only {state}": "BROKEN", "write_surface": "BROKEN"}, stdout
    # Named in JUnit, as assertion failures (not harness errors) of the control-dir witnesses.
    for name in (
        "test_an_append_to_the_control_directorys_file_is_refused_with_erofs",
        "test_a_file_cannot_be_planted_in_the_control_directory",
        "test_the_control_directorys_files_cannot_be_removed",
    ):
        assert cases[name] == "failure", cases
    assert cases["test_the_control_directorys_files_are_readable"] == "passed"
    # ...and what the task saw is in the line the user reads.
    [line] = [ln for ln in stdout.splitlines() if ln.startswith("control: ")]
    assert "BROKEN" in line and "'system_prompt.txt': 'ok'" in line


def test_the_same_launcher_with_the_defect_fixed_keeps_every_promise(
    bwrap_ready: str, tmp_path: Path, no_residue: None
) -> None:
    fixed = tmp_path / "fixed-launcher.sh"
    text = DEFECTIVE.read_text()
    assert text.count("CONTROL_BIND=--bind ") == 1
    fixed.write_text(text.replace("CONTROL_BIND=--bind ", "CONTROL_BIND=--ro-bind "))
    code, report, cases, stdout = run_adapter(
        tmp_path, FIXTURES / "defective-launcher.toml", defective_prefix(fixed)
    )
    every_promise_kept(code, report, cases, stdout)


def test_an_oci_launch_killed_on_timeout_leaves_no_container_behind(
    root_only: None, tmp_path: Path, no_residue: None
) -> None:
    """What the harness does to a launch that hangs: SIGKILL the launcher's process group. The
    container is not in that group (the runtime gives it a session of its own); the adapter's
    guardian must still delete it, so the harness's read of stdout ends and nothing is left."""
    import time

    from sandbox_conformance.conformance import layout
    from sandbox_conformance.processes.children import run

    r = oci_ready("crun", None)
    lay = layout.create()
    try:
        spec = layout.write_spec(lay, {"version": 1, **lay.values()})
        token = f"sbxc-hang-{os.getpid()}"
        hang = ["python3", "-c", "import time; print('started', flush=True); time.sleep(120)", token]
        started = time.monotonic()
        done = run(
            [*shlex.split(r.launcher), *hang],
            timeout=3,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SANDBOX_CONFORMANCE_TASK_SPEC": str(spec)},
        )
        assert done.timed_out and "started" in done.stdout, done
        assert time.monotonic() - started < 30, "the harness's read of stdout outlived the group kill"
        deadline = time.monotonic() + 10
        while (residue()["dirs"] or hung(token)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not hung(token), "the container outlived its launcher"
    finally:
        layout.remove(lay)


def test_witness_adapter_option_runs_the_named_adapter(tmp_path: Path) -> None:
    """`witness --adapter NAME` is the user's spelling of --profile + --launcher for a shipped adapter."""
    j = tmp_path / "r.json"
    done = witness("--adapter", "unshare", "--json", str(j))
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    report = json.loads(j.read_text())
    assert set(verdicts(report).values()) == {"kept"}, verdicts(report)
    assert {"network", "pid"} <= set(verdicts(report)), verdicts(report)


def test_witness_adapter_option_rejects_an_unknown_name_and_a_clash_in_one_line() -> None:
    unknown = witness("--adapter", "no-such-tool")
    assert unknown.returncode == 2 and len(unknown.stderr.strip().splitlines()) == 1, unknown.stderr
    assert "no-such-tool" in unknown.stderr
    clash = witness("--adapter", "unshare", "--launcher", "env")
    assert clash.returncode == 2 and "--adapter" in clash.stderr, clash.stderr


def test_witness_adapter_that_cannot_run_here_exits_75_with_the_reason() -> None:
    if shutil.which("systemctl") and Path("/run/systemd/system").is_dir():
        pytest.skip("systemd is PID 1 here: the systemd-run adapter can run")
    done = witness("--adapter", "systemd-run")
    assert done.returncode == 75, done.stderr
    assert "systemd" in done.stderr and "PID 1" in done.stderr, done.stderr
