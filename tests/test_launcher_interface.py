"""What an external launcher is given (issue 13, item 3): the task spec with the whole resolved
profile, a setting of its own through --launcher-env, a layout root of the user's choosing, the
placeholders named the same everywhere; and what `run` hands the witness process it starts."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from witness_cli import REPO, junit, witness

from sandbox_conformance.conformance import handover as handover_mod
from sandbox_conformance.conformance import plan
from sandbox_conformance.conformance.profile import PLACEHOLDERS, Filesystem, Profile
from sandbox_conformance.probes.finding import Finding, Verdict

WORKDIR_START = "test_the_task_starts_in_its_working_directory"


def _recording_launcher(tmp_path: Path, body: str) -> Path:
    launcher = tmp_path / "launcher"
    launcher.write_text(f'#!/bin/sh\n{body}\nexec "$@"\n')
    launcher.chmod(0o755)
    return launcher


def test_the_task_spec_carries_the_profile_resolved_against_the_layout(tmp_path: Path) -> None:
    copy = tmp_path / "spec.json"
    launcher = _recording_launcher(tmp_path, f'cp "$SANDBOX_CONFORMANCE_TASK_SPEC" {copy}')
    witness("--launcher", str(launcher), "--launcher-spec", "--junitxml", str(tmp_path / "j.xml"))
    spec = json.loads(copy.read_text())
    fs = spec["filesystem"]
    # The reference profile's templates, expanded: no placeholder is left for the launcher to guess.
    assert f"{spec['state']}/db" in fs["masked"]
    assert spec["workdir"] in fs["writable"]
    assert spec["neighbour_control"] in fs["absent"] and spec["other_user"] in fs["absent"]
    assert "/usr" in fs["read_only"] and spec["state"] in fs["read_only"]
    assert not any("{" in p for paths in fs.values() for p in paths)
    assert spec["task"]["workdir"] == spec["workdir"] and spec["task"]["control"] == spec["control"]
    assert spec["namespaces"]["pid"] == "private" and spec["network"] == "none"
    assert spec["process"] == {"capabilities": "none", "no_new_privs": True}


def test_launcher_env_reaches_the_launcher_and_layout_root_holds_the_layout(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    root = tmp_path / "layouts"
    root.mkdir()
    launcher = _recording_launcher(
        tmp_path, f'printf "%s\\n%s\\n" "$MY_SETTING" "$SANDBOX_CONFORMANCE_TASK_SPEC" > {seen}'
    )
    done = witness(
        "--launcher", str(launcher), "--launcher-env", "MY_SETTING=a=b c", "--layout-root", str(root),
        "--launcher-spec", "--junitxml", str(tmp_path / "j.xml"),
    )
    assert "harness error" not in done.stdout, done.stdout
    value, spec_path = seen.read_text().splitlines()
    assert value == "a=b c"  # split at the first '=' only, spaces kept
    assert Path(spec_path).is_relative_to(root)
    assert list(root.iterdir()) == []  # removed after the run


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--launcher-env", "NOEQUALS"], "--launcher-env 'NOEQUALS': expected NAME=VALUE"),
        (["--launcher-env", "1X=y"], "expected NAME=VALUE"),
        (["--layout-root", "/nonexistent/sbxc"], "--layout-root /nonexistent/sbxc: no such directory"),
    ],
)
def test_bad_launcher_interface_options_exit_2_with_one_line(args: list[str], says: str) -> None:
    done = witness("--launcher", "env", *args)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr


def test_the_placeholders_are_listed_identically_in_readme_help_and_code() -> None:
    readme = (REPO / "README.md").read_text()
    listed = re.search(r"<!-- placeholders -->(.*?)<!-- /placeholders -->", readme)
    assert listed is not None, "README.md lost its placeholder list"
    assert re.findall(r"`\{(\w+)\}`", listed.group(1)) == list(PLACEHOLDERS)
    helptext = subprocess.run(
        [sys.executable, "-m", "sandbox_conformance", "witness", "--help"], capture_output=True, text=True,
        timeout=60, cwd=REPO, env={"PATH": os.environ["PATH"], "COLUMNS": "400"},
    ).stdout
    assert all("{" + p + "}" in helptext for p in PLACEHOLDERS), helptext
    from sandbox_conformance.conformance.layout import create, remove

    lay = create()
    try:
        assert tuple(lay.values()) == PLACEHOLDERS  # every placeholder has a value, in that order
    finally:
        remove(lay)


def test_the_read_only_witness_reads_only_a_file_anyone_may_read(tmp_path: Path) -> None:
    ro = tmp_path / "etc"
    ro.mkdir()
    (ro / ".lock").write_text("secret")  # sorts first, as /etc/.pwd.lock does
    (ro / ".lock").chmod(0o600)
    (ro / "motd").write_text("hello")
    (ro / "motd").chmod(0o644)
    prof = Profile(name="t", source="t", filesystem=Filesystem(read_only=(str(ro),)))
    host = plan.HostView(
        namespaces={}, harness_pid=1, harness_cmdline=(), pid1_cmdline=(), hostname="h",
        tcp_targets=(), abstract_name="x", secret_key="K", secret_value="V", cgroup="/",
    )
    built = plan.build(prof, {p: "/nonexistent" for p in PLACEHOLDERS}, "n", host, task_uid=12345)
    reads = [o["path"] for o in built.ops if o["op"] == "read"]
    appends = [o for o in built.ops if o["op"] == "append"]
    assert reads == [str(ro / "motd")]
    # The write is still tried on the first file, unowned by the task user: EACCES is accepted there.
    assert appends and appends[0]["path"] == str(ro / ".lock") and appends[0]["owned"] is False


def test_a_task_that_starts_elsewhere_or_in_a_copy_breaks_the_workdir_promise(tmp_path: Path) -> None:
    """Two broken sandboxes: one starts the task in /, one in an empty tmpfs at the workdir's path
    (the path inside is right; only the host's look at /proc/PID/cwd tells them apart)."""
    base = "bwrap --unshare-all --die-with-parent --dev-bind / / --proc /proc"
    for extra in ("--chdir /", "--tmpfs {workdir} --chdir {workdir}"):
        out = tmp_path / f"j{len(extra)}.xml"
        # On stdin: a copy at the workdir's path would hide a script there too (no task at all).
        done = witness("--launcher", f"{base} {extra}", "--launcher-stdin", "--junitxml", str(out))
        assert junit(out)[WORKDIR_START] == "failure", (extra, done.stdout)
    good = tmp_path / "good.xml"
    witness("--launcher", f"{base} --chdir {{workdir}}", "--junitxml", str(good))
    assert junit(good)[WORKDIR_START] == "passed"


def _finding(probe: str, reason: str) -> Finding:
    return Finding(probe=probe, verdict=Verdict.unsupported, reason=reason)


def test_findings_are_handed_down_only_for_the_same_user_and_environment() -> None:
    f = [_finding("disable_userns", "handed down")]
    env = {"SANDBOX_CONFORMANCE_CGROUP_ROOT": "/sys/fs/cgroup/x"}
    raw = handover_mod.handover(f, as_user=None, environ=env)
    got = handover_mod.handed_down(raw, None, env)
    assert got is not None and got["disable_userns"].reason == "handed down"
    assert handover_mod.handed_down(raw, "sbxc-test", env) is None
    # The promised cgroup root changed since (native mode drops it): re-probe.
    assert handover_mod.handed_down(raw, None, {}) is None
    assert handover_mod.handed_down("{not json", None, env) is None
    assert handover_mod.handed_down("", None, env) is None


def test_the_witness_process_uses_the_findings_run_handed_down(tmp_path: Path) -> None:
    """The witness command takes the precondition findings from run's word on its standby pipe instead of
    probing again: a handed-down `disable_userns` verdict is the one its nested-userns witness skips
    with. Nothing else carries them (no environment variable a launcher could set)."""
    raw = handover_mod.handover(
        [_finding("disable_userns", "sbxc-handed-down-marker"), _finding("cgroup.delegation", "none here")],
        as_user=None,
        environ={},
    )
    r, w = os.pipe()
    try:
        child = subprocess.Popen([sys.executable, "-m", "sandbox_conformance", "witness",
                                  handover_mod.STANDBY_FLAG, str(r), "--junitxml", str(tmp_path / "j.xml")],
                                 pass_fds=(r,), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 cwd=REPO)
    finally:
        os.close(r)
    with os.fdopen(w, "wb") as pipe:
        pipe.write(handover_mod.GO + raw.encode())
    out, err = child.communicate(timeout=300)
    assert "sbxc-handed-down-marker" in out, out + err


def test_a_launcher_exiting_75_is_one_did_not_run_with_its_reason_and_exit_75(tmp_path: Path) -> None:
    # systemd-nspawn as a user: the sandbox cannot run here, which is no failure of it (issue 29).
    launcher = tmp_path / "not-here"
    launcher.write_text("#!/bin/sh\necho 'systemd-nspawn: Need to be root.' >&2\nexit 75\n")
    launcher.chmod(0o755)
    done = witness("--launcher", str(launcher), "--junitxml", str(tmp_path / "j.xml"))
    assert done.returncode == 75, done.stdout + done.stderr
    assert done.stderr.count("Need to be root.") == 1, done.stderr
    assert "did not run" in done.stderr, done.stderr
    assert "harness error" not in done.stdout + done.stderr and "BROKEN" not in done.stdout, done.stdout
    assert not re.search(r"^\S.*: (kept|not tested)", done.stdout, re.M), done.stdout


def test_exit_75_is_sandbox_unavailable_and_any_other_exit_a_harness_error() -> None:
    from sandbox_conformance.conformance.launch import NoObservation, SandboxUnavailable, parse_document
    from sandbox_conformance.processes.children import Completed

    def done(code: int) -> Completed:
        return Completed(argv=("x",), returncode=code, stdout="", stderr="needs a VM\n", seconds=0.1)

    with pytest.raises(SandboxUnavailable) as unavailable:
        parse_document("launcher 'x'", done(75))
    assert unavailable.value.reason == "needs a VM"
    with pytest.raises(NoObservation) as other:
        parse_document("launcher 'x'", done(1))
    assert not isinstance(other.value, SandboxUnavailable) and "exited 1" in str(other.value)


def test_no_live_task_seen_names_host_cannot_observe_as_the_way_on(tmp_path: Path) -> None:
    # The task renamed on its way in: the host finds no process with the launch's tag, as it finds
    # none for gVisor's or a VM's tasks. The verdict must say how such a sandbox is tested.
    launcher = tmp_path / "renaming"
    launcher.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        "from sandbox_conformance.conformance.plan import plan_of, with_plan\n"
        "program = sys.stdin.read()\n"
        "plan = plan_of(program)\n"
        "plan['tag'] = 'hide' + plan['tag'][4:]\n"
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    os.close(r); os.write(w, with_plan(program, plan).encode()); os._exit(0)\n"
        "os.close(w); os.dup2(r, 0)\n"
        "os.execvp(sys.argv[1], sys.argv[1:])\n"
    )
    launcher.chmod(0o755)
    profile = tmp_path / "p.toml"
    profile.write_text('[profile]\nname = "pid-only"\n[namespaces]\npid = "private"\n')
    report = tmp_path / "r.json"
    witness(
        "--profile", str(profile), "--launcher", str(launcher), "--launcher-stdin", "--launch-timeout", "6",
        "--json", str(report),
    )
    [pid] = [p for p in json.loads(report.read_text())["promises"] if p["promise"] == "pid"]
    assert pid["verdict"] == "BROKEN", pid
    assert "no live task seen from the host" in pid["detail"], pid
    assert "--host-cannot-observe 'WHY'" in pid["detail"], pid


def test_a_launcher_gets_a_fixed_path_never_the_callers_unless_given_one(tmp_path: Path) -> None:
    # The caller's PATH starts with a shim directory (pyenv's): it must not become the launcher's.
    shims = tmp_path / "shims"
    shims.mkdir()
    seen = tmp_path / "path.txt"
    launcher = _recording_launcher(tmp_path, f'printf %s "$PATH" > {seen}')
    caller = {"PATH": f"{shims}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    witness("--launcher", str(launcher), "--junitxml", str(tmp_path / "j.xml"), env=caller)
    assert seen.read_text() == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    given = "/opt/mine/bin:/usr/bin:/bin"
    witness("--launcher", str(launcher), "--launcher-env", f"PATH={given}", "--junitxml",
            str(tmp_path / "j.xml"), env=caller)
    assert seen.read_text() == given


def test_a_launcher_that_asks_for_nothing_gets_a_command_and_nothing_of_ours(tmp_path: Path) -> None:
    # What a platform hands a sandbox: a command. No task spec, no SANDBOX_CONFORMANCE_* variable, the
    # program as a script in the task's working directory run as `python3 PATH`, stdin empty, and the
    # plan in it not a list of paths to grep. A defeat device keyed on any of those has nothing to see.
    seen = tmp_path / "seen"
    launcher = _recording_launcher(
        tmp_path, f'{{ env; printf "ARGV %s\\n" "$*"; printf "STDIN %s\\n" "$(head -c 64)"; }} > {seen}'
    )
    done = witness("--launcher", str(launcher), "--junitxml", str(tmp_path / "j.xml"))
    assert "harness error" not in done.stdout, done.stdout
    text = seen.read_text()
    assert "SANDBOX_CONFORMANCE" not in text, text
    argv = next(line for line in text.splitlines() if line.startswith("ARGV "))
    words = argv.split()[1:]
    assert words[0] == "python3" and len(words) == 2 and words[1].endswith(".py"), argv
    assert "/work/" in words[1], "the script is in the task's working directory"
    assert next(line for line in text.splitlines() if line.startswith("STDIN")) == "STDIN ", text
    assert "sbxc" not in Path(words[1]).name


def test_asking_for_the_spec_and_stdin_gives_the_old_interface(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    launcher = _recording_launcher(
        tmp_path,
        f'{{ printf "SPEC %s\\n" "$SANDBOX_CONFORMANCE_TASK_SPEC"; printf "ARGV %s\\n" "$*"; }} > {seen}',
    )
    witness(
        "--launcher", str(launcher), "--launcher-spec", "--launcher-stdin",
        "--junitxml", str(tmp_path / "j.xml"),
    )
    lines = seen.read_text().splitlines()
    assert lines[0].startswith("SPEC /") and lines[0].endswith("spec.json"), lines
    assert lines[1] == "ARGV python3 -I -S -", lines


NAMED = '\n[layout]\nroot = "agentd-"\nuser = "maria"\nother_user = "sam"\ntask_prefix = "job-"\n'


def test_a_command_only_launcher_with_a_named_layout_gets_the_reference_launchers_verdicts(
    tmp_path: Path,
) -> None:
    # Issue 27: a launcher that takes only a command, the way a platform takes a task, runs the whole
    # suite with a profile that names the layout like the platform's own, and the verdicts are the
    # reference launcher's. Ours finds its paths where it runs and from the task id in its argv (as a
    # platform's sandbox knows its own); it is the reference sandbox built by another process.
    from sandbox_conformance.conformance.preconditions import findings

    # Without [limits] (its last section): the cgroup leaf an external launcher must give is another
    # promise, which the reference launcher skips where there is no cgroup root.
    reference = (REPO / "conformance" / "profiles" / "reference.toml").read_text().split("\n[limits]")[0]
    prof = tmp_path / "named.toml"
    prof.write_text(reference + NAMED)
    seen = tmp_path / "seen"
    disable = ["--disable-userns"] if findings(None)["disable_userns"].ok else []
    inner = [sys.executable, "-m", "sandbox_conformance.conformance.control_launchers.reference",
             "--task={task_id}",
             "--user=maria", *disable, "--"]
    record = f'{{ env; printf "CWD %s\\nARGV %s\\n" "$PWD" "$*"; }} >> {seen}'
    recorder = _recording_launcher(tmp_path, record)
    ours = witness("--profile", str(prof), "--json", str(tmp_path / "ref.json"))
    launcher = " ".join([str(recorder), *inner])
    theirs = witness("--profile", str(prof), "--launcher", launcher, "--json", str(tmp_path / "cmd.json"))
    assert ours.returncode == theirs.returncode == 0, ours.stdout + theirs.stdout

    def verdicts(name: str) -> dict[str, str]:
        return {p["promise"]: p["verdict"] for p in json.loads((tmp_path / name).read_text())["promises"]}

    assert verdicts("cmd.json") == verdicts("ref.json")
    text = seen.read_text()
    assert "SANDBOX_CONFORMANCE" not in text, text
    cwds = [line[4:] for line in text.splitlines() if line.startswith("CWD ")]
    assert cwds and all(Path(c).name.startswith("agentd-") for c in cwds), cwds
    task = next(line for line in text.splitlines() if line.startswith("ARGV "))
    assert "/users/maria/tasks/job-" in task and "sbxc" not in task.replace("sbxc-test", ""), task
    assert "sbxc" not in " ".join(cwds), cwds


def test_a_sandbox_the_host_cannot_observe_is_judged_on_what_its_task_shows(tmp_path: Path) -> None:
    # Issue 29 (gVisor, a VM): where the host was declared unable to see the task, the promises the task
    # shows by its own behaviour (the secret, host processes, shared memory, the hostname, what it can
    # open and connect to) are judged from inside and say so; a sandbox that hands the task the
    # launcher's whole environment is BROKEN there too, not "not tested".
    why = "its tasks run in a user-space kernel"
    honest = witness("--host-cannot-observe", why, "--json", str(tmp_path / "h.json"))
    report = json.loads((tmp_path / "h.json").read_text())
    rows = {p["promise"]: (p["verdict"], p["detail"]) for p in report["promises"]}
    assert honest.returncode == 0, honest.stdout
    for promise in ("environment", "secrets", "ipc", "uts", "devices", "host_sockets", "kernel_interfaces"):
        assert rows[promise] == ("kept", "task's view only: the host could not observe the task"), promise
    assert rows["capabilities"][0] == "not tested", "a kernel state only the host can read stays not tested"
    leaky = witness("--host-cannot-observe", why, "--perturb", "env_kept", "--json", str(tmp_path / "l.json"))
    rows = {p["promise"]: p["verdict"] for p in json.loads((tmp_path / "l.json").read_text())["promises"]}
    assert leaky.returncode == 1 and rows["environment"] == "BROKEN", leaky.stdout


def test_a_read_write_mount_whose_writes_something_else_refuses_is_named_a_contradiction(
    tmp_path: Path,
) -> None:
    # Issue 29: /usr bound read-write, every write there refused by a Landlock ruleset with EACCES, which
    # this profile accepts. The mount table and the task's behaviour disagree: still BROKEN (a call the
    # ruleset does not see may write), and the finding says which disagreement it is.
    from sandbox_conformance.conformance.preconditions import findings

    text = (REPO / "conformance" / "profiles" / "reference.toml").read_text()
    text = text.replace('absent = ["{neighbour_control}", "{other_user}"]\n',
                        'absent = ["{neighbour_control}", "{other_user}"]\nrefuse = ["EROFS", "EACCES"]\n', 1)
    prof = tmp_path / "p.toml"
    prof.write_text(text.split("\n[limits]")[0])
    disable = ["--disable-userns"] if findings(None)["disable_userns"].ok else []
    words = [sys.executable, "-m", "sandbox_conformance.conformance.control_launchers.reference",
             "--task={task_id}", *disable,
             "--append=--bind", "--append=/usr", "--append=/usr", "--landlock-refuse=/usr", "--"]
    launcher = " ".join(words)
    done = witness("--profile", str(prof), "--launcher", launcher, "--only", "read_only")
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("read_only /usr: "))
    assert done.returncode == 1 and "BROKEN" in line and "a contradiction: every write" in line, done.stdout
