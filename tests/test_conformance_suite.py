"""The witness suite end to end on this host: the reference profile and launcher pass as root and as
an unprivileged user; each witness family goes red under a deliberately broken sandbox (an external
launcher script, or one perturbation of the reference sandbox), by assertion, not harness error; and
a launcher that hangs, fails or prints garbage is a harness error naming it, leaving nothing behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest
from witness_cli import junit, witness

from sandbox_conformance.conformance import profile
from sandbox_conformance.conformance.launch import (
    Launcher,
    LauncherKind,
    NoObservation,
    external,
    launch,
    parse_document,
)
from sandbox_conformance.processes.children import Completed

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.integration


@pytest.fixture
def reference_ready(root_only: None, bwrap_path: str) -> None:
    from sandbox_conformance.conformance.preconditions import findings

    f = findings(None)["disable_userns"]
    if not f.ok:
        pytest.skip(f"disable_userns probe: {f.verdict}: {f.reason}")


def expected_skip_file(tmp_path: Path, as_user: str | None = None) -> tuple[Path, int]:
    """The skips justified on this host, and how many promise families they leave untested: none where
    the probes pass, except the cgroup witnesses where the cgroup.delegation probe finds no usable
    root (they run for real in the VM tier, tests/test_vm.py)."""
    from sandbox_conformance.conformance.controls import HARNESS_ENFORCED
    from sandbox_conformance.conformance.preconditions import findings

    lines = ["# no witness skip is justified on a host where the probes pass"]
    untested = 0
    cg = findings(as_user)["cgroup.delegation"]
    if not (cg.ok and cg.facts.get("root")):
        lines += [
            f"{name} | cgroup.delegation: {cg.verdict}: {cg.reason}" for name in sorted(HARNESS_ENFORCED)
        ]
        untested = 3  # the families cgroup, memory_max, pids_max
    f = tmp_path / "skips.txt"
    f.write_text("\n".join(lines) + "\n")
    return f, untested


@pytest.mark.parametrize("as_user", [None, "sbxc-test"], ids=["root", "unprivileged"])
def test_the_reference_sandbox_keeps_every_promise(
    reference_ready: None, request: pytest.FixtureRequest, tmp_path: Path, as_user: str | None
) -> None:
    if as_user:
        as_user = request.getfixturevalue("test_user")
    skips, untested = expected_skip_file(tmp_path, as_user)
    args = [
        "--junitxml",
        str(tmp_path / "j.xml"),
        "--json",
        str(tmp_path / "r.json"),
        "--require",
        "--expected-skips",
        str(skips),
    ]
    if as_user:
        args += ["--as-user", as_user]
    done = witness(*args)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    # One row per promise: every family the profile makes, the path families once per path.
    prof = profile.load(None)
    fs = prof.filesystem
    rows = len(prof.promises()) - 4 + len(fs.masked) + len(fs.read_only) + len(fs.writable) + len(fs.absent)
    kept = rows - untested
    assert lines[-1].startswith(f"witness: {kept} kept, 0 BROKEN, {untested} not tested"), done.stdout
    assert sum(ln.endswith(": kept") for ln in lines[:-1]) == kept, done.stdout
    cases = junit(tmp_path / "j.xml")
    skipped = {n for n, v in cases.items() if v == "skipped"}
    assert skipped == ({n for n in skips.read_text().split() if n.startswith("test_")} if untested else set())
    assert len(cases) >= 32 and set(cases.values()) - {"skipped"} == {"passed"}, cases
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["exit"] == 0 and len(report["tasks"]) == 1, "one launch serves every witness"
    obs = report["tasks"][0]["observations"]
    assert obs["complete"] is True and obs["interfaces"] == ["lo"]
    if as_user:
        assert obs["ids"]["uid"] != 0 and "setpriv" in report["tasks"][0]["argv"][0]


# ---- every witness family goes red under one broken thing ---------------------------------------------

LAUNCHER = textwrap.dedent("""\
    #!/bin/sh
    # A user's sandbox as an external launcher: MODE STATE CONTROL USER_TMP WORKDIR -- then the witness.
    mode=$1 state=$2 control=$3 user_tmp=$4 workdir=$5
    shift 5
    net=--unshare-net; ctl=--ro-bind; mask="--tmpfs $state/db --remount-ro $state/db"; env=--clearenv
    envi="env -i"  # bwrap itself must not hold the launcher's environment: it is the sandbox's PID 1
    case $mode in
      control_rw) ctl=--bind ;;
      net_shared) net= ;;
      no_mask) mask= ;;
      keep_env) env= envi= ;;
    esac
    exec $envi bwrap --unshare-user --unshare-pid --unshare-ipc --unshare-uts --hostname sbxc-task $net \\
      --disable-userns --cap-drop ALL --die-with-parent --new-session $env \\
      --setenv PATH /usr/bin:/bin --setenv HOME "$workdir" --setenv LANG C.UTF-8 \\
      --setenv TASK_ID "$(basename "$(dirname "$control")")" \\
      --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib --symlink usr/lib64 /lib64 \\
      --proc /proc --ro-bind /proc/sys /proc/sys --dev /dev --tmpfs /tmp \\
      --ro-bind "$state" "$state" $mask --tmpfs "$state/users" \\
      --bind "$user_tmp" "$user_tmp" $ctl "$control" "$control" --bind "$workdir" "$workdir" \\
      --remount-ro "$state/users" --chdir "$workdir" "$@"
    """)


@pytest.fixture
def launcher_script(tmp_path: Path) -> Path:
    f = tmp_path / "launcher.sh"
    f.write_text(LAUNCHER)
    f.chmod(0o755)
    return f


@pytest.fixture
def no_limits_profile(tmp_path: Path) -> Path:
    """The reference profile without [limits]: the test launcher below applies no cgroup limits, and a
    launcher that promises limits it does not apply goes red on them (conformance/witnesses/limits.py)."""
    from importlib import resources

    text = (resources.files("sandbox_conformance.conformance") / "profiles" / "reference.toml").read_text()
    f = tmp_path / "no-limits.toml"
    f.write_text(text[: text.index("[limits]")])
    return f


def _external(script: Path, mode: str) -> str:
    return f"{script} {mode} {{state}} {{control}} {{user_tmp}} {{workdir}}"


def test_a_users_external_launcher_that_keeps_every_promise_passes(
    reference_ready: None, launcher_script: Path, tmp_path: Path, no_limits_profile: Path
) -> None:
    done = witness(
        "--launcher",
        _external(launcher_script, "good"),
        "--profile",
        str(no_limits_profile),
        "--junitxml",
        str(tmp_path / "j.xml"),
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "0 BROKEN, 0 not tested" in done.stdout


def test_an_external_launcher_that_promises_limits_it_does_not_apply_is_red_on_them(
    reference_ready: None, launcher_script: Path, tmp_path: Path
) -> None:
    # The harness makes no leaf for a launcher that is not its own: the task runs in the cgroup the
    # launcher left it in (the harness's), and the host says so.
    done = witness("--launcher", _external(launcher_script, "good"), "--junitxml", str(tmp_path / "j.xml"))
    assert done.returncode == 1, done.stdout
    cases = junit(tmp_path / "j.xml")
    red = {c for c, k in cases.items() if k == "failure"}
    assert red == {
        "test_the_task_runs_in_its_own_cgroup_leaf",
        "test_an_allocation_past_memory_max_is_oom_killed",
        "test_forking_past_pids_max_fails_with_eagain",
    }, cases
    # What the harness does with a leaf it made is no promise of this launcher: not collected.
    assert "test_a_task_tree_is_reaped_whole_by_cgroup_kill" not in cases
    assert "cgroup: BROKEN: the task runs in the harness's own cgroup" in done.stdout


@pytest.mark.parametrize(
    ("mode", "red"),
    [
        (
            "control_rw",
            [
                "test_an_append_to_the_control_directorys_file_is_refused_with_erofs",
                "test_a_file_cannot_be_planted_in_the_control_directory",
                "test_the_control_directorys_files_cannot_be_removed",
                # The host's reading of the task's mount table: a read-write bind of host storage
                # beneath the read-only {state}, which the profile never declared writable.
                "test_every_mount_beneath_a_read_only_path_is_read_only[{state}]",
                "test_every_writable_host_mount_is_a_declared_writable_path",
            ],
        ),
        (
            "net_shared",
            [
                "test_the_task_sees_only_the_loopback_interface",
                "test_the_task_cannot_reach_the_hosts_tcp_listener",
                "test_the_task_cannot_reach_the_hosts_abstract_unix_socket",
                "test_the_task_has_a_network_namespace_of_its_own",
            ],
        ),
        (
            "no_mask",
            [
                "test_a_masked_directory_is_an_empty_read_only_tmpfs[{state}/db]",
                "test_a_masked_directorys_host_canary_is_invisible[{state}/db]",
                "test_no_mount_shows_a_protected_host_path_under_any_name",
            ],
        ),
        (
            "keep_env",
            [
                "test_only_allowlisted_environment_keys_arrive",
                "test_the_launchers_secret_does_not_reach_the_task",
                # bwrap, the sandbox's PID 1, holds it too (no env -i before it).
                "test_the_launchers_secret_is_readable_nowhere_in_the_task",
            ],
        ),
    ],
)
def test_a_broken_external_launcher_turns_its_witnesses_red(
    reference_ready: None,
    launcher_script: Path,
    tmp_path: Path,
    mode: str,
    red: list[str],
    no_limits_profile: Path,
) -> None:
    done = witness(
        "--launcher",
        _external(launcher_script, mode),
        "--profile",
        str(no_limits_profile),
        "--junitxml",
        str(tmp_path / "j.xml"),
    )
    assert done.returncode == 1, done.stdout
    cases = junit(tmp_path / "j.xml")
    assert {c for c, k in cases.items() if k == "failure"} == set(red), cases
    assert "error" not in cases.values(), "a broken promise is an assertion failure, not a harness error"
    assert "BROKEN" in done.stdout


@pytest.mark.parametrize(
    ("perturbation", "red"),
    [
        (
            "mask_writable",
            {
                "test_a_masked_directory_is_an_empty_read_only_tmpfs[{state}/db]",
                "test_nothing_can_be_created_in_a_masked_directory[{state}/db]",
                "test_every_mount_beneath_a_read_only_path_is_read_only[{state}]",
            },
        ),
        (
            "control_scoped_per_user",
            {
                "test_an_absent_path_does_not_exist_inside[{neighbour_control}]",
                "test_no_mount_shows_a_protected_host_path_under_any_name",
            },
        ),
        (
            "other_user_bound",
            {
                "test_an_absent_path_does_not_exist_inside[{other_user}]",
                "test_no_mount_shows_a_protected_host_path_under_any_name",
            },
        ),
        ("nested_userns_enabled", {"test_a_nested_user_namespace_is_refused_by_every_door"}),
        ("pid_shared", {"test_host_pids_are_invisible_to_the_task", "test_pid_1_is_the_sandboxs_init"}),
        ("ipc_shared", {"test_the_ipc_namespace_is_private"}),
        ("uts_shared", {"test_the_uts_namespace_is_private"}),
        ("caps_kept", {"test_the_task_has_no_capabilities"}),
    ],
)
def test_one_perturbation_of_the_reference_sandbox_turns_exactly_its_witnesses_red(
    reference_ready: None, test_user: str, tmp_path: Path, perturbation: str, red: set[str]
) -> None:
    done = witness("--as-user", test_user, "--perturb", perturbation, "--junitxml", str(tmp_path / "j.xml"))
    assert done.returncode == 1, done.stdout
    cases = junit(tmp_path / "j.xml")
    assert {c for c, k in cases.items() if k == "failure"} == red, cases
    assert "error" not in cases.values()
    # What the task saw travels with each red witness in the JUnit file (negative controls read it).
    saw = {
        case.get("name"): {p.get("value") for p in case.iter("property") if p.get("name") == "sbxc_saw"}
        for case in ET.parse(tmp_path / "j.xml").getroot().iter("testcase")
    }
    assert all(saw[name] for name in red), saw


# ---- harness errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("sleep 6131", "timed out"),
        ("echo oops >&2; exit 3", "exited 3"),
        ("cat >/dev/null; echo garbage; echo '{not json'", "printed no witness document"),
        ('cat >/dev/null; echo \'{"version": 2, "complete": false}\'', "partial"),
        # (A launcher that does not exist or is not executable is a usage error, exit 2, up front:
        # tests/test_bad_input.py.)
    ],
    ids=["hangs", "exits-non-zero", "prints-garbage", "prints-a-partial-document"],
)
def test_a_launcher_that_does_not_deliver_is_a_harness_error_naming_it_and_leaves_nothing(
    tmp_path: Path, body: str, says: str
) -> None:
    script = tmp_path / "sandbox-run"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    prefix = str(script)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    done = witness(
        "--launcher",
        prefix,
        "--launch-timeout",
        "2",
        "--junitxml",
        str(tmp_path / "j.xml"),
        env={"TMPDIR": str(tmp)},
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert f"harness error: launcher {prefix!r}: " in done.stdout and says in done.stdout, done.stdout
    promises = [ln for ln in done.stdout.splitlines() if not ln.startswith(("harness error", "witness:"))]
    assert promises and all(": not tested: harness error: " in ln for ln in promises), done.stdout
    assert "0 kept, 0 BROKEN" in done.stdout
    cases = junit(tmp_path / "j.xml")
    assert set(cases.values()) == {"error"}, cases
    assert list(tmp.iterdir()) == [], "the layout was not removed"
    left = [
        p.info["pid"] for p in psutil.process_iter(["pid", "cmdline"]) if "6131" in (p.info["cmdline"] or [])
    ]
    assert left == [], f"processes left behind: {left}"


def test_parse_document_never_passes_an_incomplete_launch() -> None:
    ok = Completed(("x",), 0, '{"version": 2, "complete": true}\n', "", 0.1)
    assert parse_document("L", ok)["complete"] is True
    with pytest.raises(NoObservation, match=r"^L: exited 1"):
        parse_document("L", Completed(("x",), 1, '{"version": 2, "complete": true}\n', "", 0.1))
    with pytest.raises(NoObservation, match="version 1, expected 2"):
        parse_document("L", Completed(("x",), 0, '{"version": 1, "complete": true}\n', "", 0.1))
    with pytest.raises(NoObservation, match="timed out"):
        parse_document("L", Completed(("x",), None, "", "", 5.0, timed_out=True))


def test_an_external_launcher_prefix_expands_placeholders_inside_words() -> None:
    lau = external("run --dir={control} --id {task_id}")
    argv = lau.argv({}, {"control": "/a b/c", "task_id": "t1"})
    assert argv == ("run", "--dir=/a b/c", "--id", "t1", "python3", "-I", "-S", "-")


def test_an_entry_point_launcher_builds_its_argv_from_the_spec() -> None:
    ep = LauncherKind.entry_point
    lau = Launcher(name="launcher entry point 'x'", kind=ep, factory=lambda spec: ["env", "-i"])
    assert lau.argv({"task_id": "t"}, {}) == ("env", "-i", "python3", "-I", "-S", "-")
    bad = Launcher(name="launcher entry point 'y'", kind=ep, factory=lambda spec: "env -i")
    with pytest.raises(NoObservation, match="entry point 'y'"):
        bad.argv({}, {})


def test_launch_kills_the_whole_process_group_on_timeout(tmp_path: Path) -> None:
    with pytest.raises(NoObservation, match="timed out"):
        launch(
            "L",
            ["/bin/sh", "-c", "sleep 6132 & sleep 6132; wait"],
            "",
            env={"PATH": "/usr/bin:/bin"},
            timeout=0.5,
        )
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if "6132" in (p.info["cmdline"] or [])]
    assert left == []


# ---- skip gating ---------------------------------------------------------------------------------------

GATED = textwrap.dedent("""\
    [profile]
    name = "gated"
    [filesystem]
    absent = ["/nonexistent-sbxc-witness-path"]
    [process]
    no_new_privs = true
    [promises]
    not_claimed = { secrets = "no environment allowlist: bwrap passes the launcher's environment on" }
    """)


@pytest.fixture
def gated_profile(tmp_path: Path) -> Path:
    f = tmp_path / "gated.toml"
    f.write_text(GATED)
    return f


SKIPPED = "test_an_absent_path_does_not_exist_inside[/nonexistent-sbxc-witness-path]"


def test_a_vacuous_witness_skips_and_a_promise_not_made_is_not_collected(
    reference_ready: None, gated_profile: Path, tmp_path: Path
) -> None:
    done = witness("--profile", str(gated_profile), "--junitxml", str(tmp_path / "j.xml"))
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    cases = junit(tmp_path / "j.xml")
    # Only the promised families exist at all: network, caps... are deselected, not skipped. Every
    # profile also gets the host-side ones (write surface, kernel view, leftovers, the looks, the
    # lifecycle, what the task holds and reaches; not the secret, which it disclaims) and, with an
    # absent path, the alias witness.
    assert cases == {
        "test_the_sandbox_is_the_same_at_every_look": "passed",
        "test_the_task_dies_with_its_launcher": "passed",
        "test_the_task_cannot_type_into_the_terminal_it_was_started_from": "passed",
        "test_every_other_syscall_door_answers_as_the_profile_says": "passed",
        "test_the_task_holds_no_descriptor_that_leads_out": "passed",
        "test_the_hosts_kernel_settings_cannot_be_opened_for_writing": "passed",
        "test_only_allowlisted_device_nodes_can_be_opened": "passed",
        "test_no_host_unix_socket_can_be_connected_to": "passed",
        SKIPPED: "skipped",
        "test_no_new_privs_is_set": "passed",
        "test_every_writable_host_mount_is_a_declared_writable_path": "passed",
        "test_no_mount_shows_a_protected_host_path_under_any_name": "passed",
        "test_nothing_the_launch_started_outlives_the_task": "passed",
        "test_the_tasks_proc_shows_the_kernels_state": "passed",
    }
    assert "absent /nonexistent-sbxc-witness-path: not tested: " in done.stdout and "vacuous" in done.stdout


@pytest.mark.parametrize("how", ["flag", "env"])
def test_the_require_switch_turns_a_skip_into_a_failure(
    reference_ready: None, gated_profile: Path, tmp_path: Path, how: str
) -> None:
    args = ["--profile", str(gated_profile), "--junitxml", str(tmp_path / "j.xml")]
    env = {"SANDBOX_CONFORMANCE_REQUIRE": "1"} if how == "env" else {}
    done = witness(*args, *(["--require"] if how == "flag" else []), env=env)
    assert done.returncode == 1, done.stdout
    assert junit(tmp_path / "j.xml")[SKIPPED] == "failure"


@pytest.mark.parametrize(
    ("listed", "rc"),
    [
        ([SKIPPED], 0),  # exactly the skipped set
        ([], 1),  # a new skip
        ([SKIPPED, "test_no_new_privs_is_set"], 1),  # a listed test that ran
        ([SKIPPED, "test_a_witness_that_no_longer_exists"], 1),  # a listed test that is gone
    ],
)
def test_the_expected_skips_file_must_equal_the_skipped_set(
    reference_ready: None, gated_profile: Path, tmp_path: Path, listed: list[str], rc: int
) -> None:
    f = tmp_path / "skips.txt"
    f.write_text(
        "".join(f"witnesses/paths.py::{t} | the witness would be vacuous\n" for t in listed)
    )
    done = witness("--profile", str(gated_profile), "--require", "--expected-skips", str(f))
    assert done.returncode == rc, done.stdout + done.stderr[-2000:]
    if rc:
        assert "expected skips:" in done.stdout


def test_no_bwrap_and_no_launcher_did_not_run_75(tmp_path: Path) -> None:
    done = witness(env={"PATH": str(tmp_path)})
    assert done.returncode == 75, done.stderr
    assert "no bwrap" in done.stderr


# ---- the fixtures users call from their own suites ---------------------------------------------------

USER_SUITE = textwrap.dedent("""\
    def test_my_sandbox_hides_the_db(sbxc_launch):
        task = sbxc_launch()
        db = task.values["state"] + "/db"
        assert task.mount_at(db)["fstype"] == "tmpfs"
        assert task.observed("read", db + "/canary.sqlite") == "ENOENT"

    def test_my_broken_sandbox_shows_the_db(sbxc_launch):
        task = sbxc_launch(perturbations=("mask_dropped",))
        assert task.observed("read", task.values["state"] + "/db/canary.sqlite") == "ok"
    """)


def test_a_users_suite_can_launch_live_tasks_through_the_factory_fixture(
    reference_ready: None, tmp_path: Path
) -> None:
    (tmp_path / "test_mine.py").write_text(USER_SUITE)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            str(tmp_path / "test_mine.py"),
        ],
        cwd=tmp_path,
        text=True,
        capture_output=True,
        timeout=120,
        env={"PATH": os.environ.get("PATH", ""), "TMPDIR": str(tmp)},
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert "2 passed" in done.stdout
    assert list(tmp.iterdir()) == []


def test_bwrap_missing_is_not_a_skip_here(bwrap_path: str) -> None:
    assert shutil.which("bwrap") == bwrap_path


def test_witnesses_that_never_ran_are_not_tested_and_the_run_fails(reference_ready: None) -> None:
    """`--collect-only` runs no witness: no promise may be called kept, and the run is not green."""
    done = witness("--", "--collect-only")
    assert done.returncode == 1, done.stdout + done.stderr[-1500:]
    lines = [ln for ln in done.stdout.splitlines() if ln and not ln.startswith("witness:")]
    assert lines and all(": not tested" in ln for ln in lines), done.stdout
    assert done.stdout.splitlines()[-1].startswith("witness: 0 kept, 0 BROKEN,"), done.stdout


def test_an_expected_skip_listed_with_another_reason_fails_the_run(
    reference_ready: None, gated_profile: Path, tmp_path: Path
) -> None:
    f = tmp_path / "skips.txt"
    f.write_text(f"witnesses/paths.py::{SKIPPED} | no cgroup root here\n")
    done = witness("--profile", str(gated_profile), "--require", "--expected-skips", str(f))
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert "skipped for another reason than listed" in done.stdout


def test_a_task_started_early_is_the_one_the_witnesses_get(reference_ready: None) -> None:
    """WitnessSession.start() (the witness command launches the main task while pytest imports):
    task() then waits for that launch instead of making a second one, and it is a live task the host
    saw (its observations and the host's view of its process)."""
    from sandbox_conformance.conformance import profile
    from sandbox_conformance.conformance.harness import WitnessSession

    with WitnessSession(profile.load()) as session:
        session.start()
        session.start()  # a second start is no second launch
        first = session.task()
        assert session.task() is first
        assert first.seen is not None and first.doc, first
        assert first.seen.pid > 0


def test_a_session_closed_with_its_launch_unasked_waits_for_it_and_leaves_nothing(
        reference_ready: None) -> None:
    """A witness run that never reached its tests (cancelled, or every witness deselected) still
    waits for the launch it started before its layout goes, and nothing of it is left."""
    from sandbox_conformance.conformance import profile
    from sandbox_conformance.conformance.harness import WitnessSession

    with WitnessSession(profile.load()) as session:
        session.start()
        assert session.layout is not None
        root = Path(session.layout.root)
        started = list(session._started.values())
    assert all(f.done() for f in started)
    assert not root.exists()
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(root) in " ".join(p.info["cmdline"] or ())]


PLAIN_SUITE = textwrap.dedent("""\
    import pytest

    @pytest.mark.witness
    def test_kept_by_me():
        pass

    @pytest.mark.witness
    def test_broken_by_me():
        assert False, "the task read the canary"

    @pytest.mark.witness
    def test_untested_by_me():
        pytest.skip("the host could not see the task")

    def test_not_a_witness():
        pass
    """)


def test_a_plain_pytest_run_ends_with_one_row_per_promise(tmp_path: Path) -> None:
    """What `witness --format lines` prints, at the end of a plain pytest run with witnesses; none in a
    run without one."""
    (tmp_path / "test_mine.py").write_text(PLAIN_SUITE)
    (tmp_path / "test_other.py").write_text("def test_plain():\n    pass\n")
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider"]
    env = {"PATH": os.environ.get("PATH", ""), "TMPDIR": str(tmp_path)}
    done = subprocess.run([*argv, "test_mine.py"], cwd=tmp_path, text=True, capture_output=True,
                          timeout=120, env=env)
    assert done.returncode == 1, done.stdout[-3000:]
    section = done.stdout.split("sandbox-conformance promises", 1)[1].splitlines()[1:4]
    assert section == [
        "test_kept_by_me: kept",
        "test_broken_by_me: BROKEN: the task read the canary",
        "test_untested_by_me: not tested: the host could not see the task",
    ], done.stdout[-3000:]
    alone = subprocess.run([*argv, "test_other.py"], cwd=tmp_path, text=True, capture_output=True,
                           timeout=120, env=env)
    assert alone.returncode == 0 and "sandbox-conformance promises" not in alone.stdout, alone.stdout
