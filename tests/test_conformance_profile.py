"""Profiles: validation (one line naming file, key and what was expected; exit 2 from the CLI),
placeholder expansion, and the reference bwrap argv as a pure function of its inputs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sandbox_conformance.conformance import bwrap_argv
from sandbox_conformance.conformance import profile as P
from sandbox_conformance.conformance.layout import layout

REPO = Path(__file__).resolve().parent.parent
MINIMAL = '[profile]\nname = "t"\n[network]\nmode = "none"\n'


def _write(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "p.toml"
    f.write_text(textwrap.dedent(text))
    return f


def test_the_reference_profile_loads_and_makes_every_promise_family() -> None:
    prof = P.load(None)
    assert prof.name == "reference"
    assert set(prof.promises()) == {
        "masked",
        "read_only",
        "writable",
        "absent",
        "aliases",
        "write_surface",
        "kernel_view",
        "leftovers",
        "control",
        "user_tmp",
        "workdir",
        "network",
        "nested_userns",
        "pid",
        "ipc",
        "uts",
        "capabilities",
        "no_new_privs",
        "environment",
        "environment_set",
        "cgroup",
        "memory_max",
        "pids_max",
        "descriptors",
        "secrets",
        "kernel_interfaces",
        "devices",
        "host_sockets",
        "lifecycle",
        "unchanged",
        "terminal",
        "syscalls",
    }
    assert prof.limits.memory_max == 512 * 1024**2 and prof.limits.pids_max == 256


@pytest.mark.parametrize(
    ("body", "key", "expected"),
    [
        ('[profile]\nname = "t"\n[netwrok]\nmode = "none"\n', "netwrok", "unknown section"),
        ('[profile]\nname = "t"\n[network]\nmode = "off"\n', "network.mode", "'none', 'host'"),
        ('[profile]\nname = "t"\n[network]\nmod = "none"\n', "network.mod", "unknown key"),
        ('[network]\nmode = "none"\n', "profile.name", "a profile name"),
        (MINIMAL + '[filesystem]\nmasked = "{state}/db"\n', "filesystem.masked", "a list of paths"),
        (MINIMAL + '[filesystem]\nmasked = ["{statee}/db"]\n', "filesystem.masked[0]", "placeholders among"),
        (MINIMAL + '[filesystem]\nabsent = ["relative/x"]\n', "filesystem.absent[0]", "an absolute path"),
        (MINIMAL + '[filesystem]\nread_only = ["/usr/../etc"]\n', "filesystem.read_only[0]", "without '..'"),
        (MINIMAL + '[task]\ncontrol = "{control}"\n', "task.control_files", "at least one file"),
        (
            MINIMAL + '[task]\ncontrol = "{control}"\ncontrol_files = ["a/b"]\n',
            "task.control_files",
            "plain file",
        ),
        (MINIMAL + '[userns]\nnested = "no"\n', "userns.nested", "'refused', 'allowed'"),
        (MINIMAL + "[namespaces]\npid = true\n", "namespaces.pid", "'private', 'shared'"),
        (MINIMAL + '[namespaces]\nhostname = "h"\n', "namespaces.hostname", 'uts = "private"'),
        (MINIMAL + '[process]\nno_new_privs = "yes"\n', "process.no_new_privs", "true or false"),
        (MINIMAL + '[process]\ninit = "bwrap"\n', "process.init", 'pid = "private"'),
        (MINIMAL + '[environment]\nallow = ["A-B"]\n', "environment.allow", "variable names"),
        (
            MINIMAL + '[environment]\nallow = ["A"]\n[environment.set]\nB = "x"\n',
            "environment.set.B",
            "listed in",
        ),
        (MINIMAL + '[limits]\nmemory_max = "12Q"\n', "limits.memory_max", "512M"),
        (MINIMAL + "[limits]\npids_max = 0\n", "limits.pids_max", "positive integer"),
        (MINIMAL + "[limits]\npids_max = true\n", "limits.pids_max", "positive integer"),
        ('[profile\nname = "t"\n', "(syntax)", "valid TOML"),
    ],
)
def test_a_bad_profile_names_file_key_and_expectation(
    tmp_path: Path, body: str, key: str, expected: str
) -> None:
    f = _write(tmp_path, body)
    with pytest.raises(P.InvalidProfile) as e:
        P.load(f)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{f}: {key}: expected "), msg
    assert expected in msg


def test_a_missing_profile_file_is_a_profile_error(tmp_path: Path) -> None:
    with pytest.raises(P.InvalidProfile, match=r"no such file"):
        P.load(tmp_path / "nope.toml")


def test_limits_parse_sizes_and_max(tmp_path: Path) -> None:
    prof = P.load(_write(tmp_path, MINIMAL + '[limits]\nmemory_max = "2G"\npids_max = "max"\n'))
    assert prof.limits.memory_max == 2 * 1024**3 and prof.limits.pids_max is None
    # pids_max = "max" promises no pids limit: its witness is not generated, the leaf's are.
    assert {"cgroup", "memory_max"} <= set(prof.promises()) and "pids_max" not in prof.promises()


def test_a_promise_not_made_is_not_in_the_profiles_promises(tmp_path: Path) -> None:
    prof = P.load(
        _write(tmp_path, '[profile]\nname = "t"\n[network]\nmode = "host"\n[process]\nno_new_privs = true\n')
    )
    # Every profile is held to the host-side promises unless it opts out of the write surface.
    assert prof.promises() == (
        "write_surface", "kernel_view", "leftovers", "unchanged", "no_new_privs", *P.DEFAULT_PROMISES
    )


def test_placeholders_expand_against_the_layout() -> None:
    with layout() as lay:
        values = lay.values()
        assert P.expand("{state}/db", values) == f"{lay.root}/state/db"
        assert P.expand("{control}", values).endswith(f"/users/alice/tasks/{lay.task_id}/control")
        assert P.expand("{user_tmp}/x", values) == f"{lay.root}/state/users/alice/tmp/x"
        assert lay.neighbour_task_id != lay.task_id
        assert (lay.control / "system_prompt.txt").read_text().startswith("SBXC-CANARY control")
        root = lay.root
    assert not root.exists(), "the layout is removed on exit"


def test_the_layout_is_removed_even_when_the_body_raises() -> None:
    with pytest.raises(RuntimeError), layout() as lay:
        root = lay.root
        raise RuntimeError("boom")
    assert not root.exists()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandbox_conformance", "witness", *args],
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=60,
    )


def test_the_witness_command_exits_2_with_one_line_for_a_bad_profile(tmp_path: Path) -> None:
    f = _write(tmp_path, '[profile]\nname = "t"\n[network]\nmode = "off"\n')
    done = _cli("--profile", str(f))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert str(f) in lines[0] and "network.mode" in lines[0] and "expected one of 'none', 'host'" in lines[0]
    assert done.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ["--perturb", "nonsense"],
        ["--launcher", "'unterminated"],
        ["--launcher", "entry-point:no-such-launcher"],
        ["--launch-timeout", "0"],
    ],
)
def test_the_witness_command_exits_2_for_other_bad_input(args: list[str]) -> None:
    done = _cli(*args)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


# ---- the reference argv: a pure function -------------------------------------------------------------

VALUES = {
    "state": "/s",
    "user": "alice",
    "task_id": "t1",
    "control": "/s/users/alice/tasks/t1/control",
    "workdir": "/s/users/alice/tasks/t1/work",
    "user_tmp": "/s/users/alice/tmp",
    "neighbour_control": "/s/users/alice/tasks/t2/control",
    "other_user": "/s/users/bob",
}
FACTS = bwrap_argv.Facts(bwrap="/usr/bin/bwrap", disable_userns=True, system_links={"/bin": "usr/bin"})


def _pairs(argv: tuple[str, ...], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_the_reference_argv_hides_absent_paths_under_a_bound_tree_then_rebinds_the_task() -> None:
    argv = bwrap_argv.reference_argv(P.load(None), VALUES, FACTS)
    tmpfs = _pairs(argv, "--tmpfs")
    assert "/s/db" in tmpfs and "/s/users" in tmpfs  # the mask, and the hide for bob and task t2
    assert argv.index("/s/users") < argv.index(VALUES["control"])  # rebound after the hide
    assert set(_pairs(argv, "--remount-ro")) == {"/s/db", "/s/users"}
    assert "--disable-userns" in argv and "--clearenv" in argv
    assert VALUES["neighbour_control"] not in argv and VALUES["other_user"] not in argv


def test_disable_userns_is_passed_only_where_the_probe_saw_it_work() -> None:
    no = bwrap_argv.Facts(bwrap="/usr/bin/bwrap", disable_userns=False)
    assert "--disable-userns" not in bwrap_argv.reference_argv(P.load(None), VALUES, no)


@pytest.mark.parametrize(
    ("perturbation", "present", "absent"),
    [
        ("mask_dropped", [], ["/s/db"]),
        ("network_shared", [], ["--unshare-net"]),
        ("nested_userns_enabled", [], ["--disable-userns"]),
        ("pid_shared", [], ["--unshare-pid"]),
        ("caps_kept", ["--cap-add"], ["--cap-drop"]),
        ("env_kept", [], ["--clearenv", "-i"]),
        ("secret_in_init", ["--clearenv"], ["-i"]),
        ("proc_sys_writable", ["--proc"], ["/proc/sys"]),
        ("other_user_bound", ["/s/users/bob"], []),
    ],
)
def test_each_perturbation_flips_one_thing(perturbation: str, present: list[str], absent: list[str]) -> None:
    base = bwrap_argv.reference_argv(P.load(None), VALUES, FACTS)
    argv = bwrap_argv.reference_argv(P.load(None), VALUES, FACTS, frozenset({perturbation}))
    assert argv != base
    assert all(a in argv for a in present) and not any(a in argv for a in absent)


def test_an_unknown_perturbation_is_refused() -> None:
    with pytest.raises(bwrap_argv.UnbuildableProfile, match="unknown perturbation"):
        bwrap_argv.reference_argv(P.load(None), VALUES, FACTS, frozenset({"nope"}))


def test_a_profile_can_say_it_confines_no_filesystem_and_how_nesting_is_refused(tmp_path: Path) -> None:
    prof = P.load(
        _write(
            tmp_path,
            '[profile]\nname = "t"\n[filesystem]\nwrite_surface = "any"\nscratch = ["/dev/shm"]\n'
            '[userns]\nnested = "refused"\nerrno = ["ENOSPC", "EPERM"]\n',
        )
    )
    assert "write_surface" not in prof.promises() and "nested_userns" in prof.promises()
    assert prof.filesystem.scratch == ("/dev/shm",) and prof.nested_errno == ("ENOSPC", "EPERM")


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ('[userns]\nnested = "refused"\nerrno = "ENOSPC"\n', "userns.errno"),
        ('[userns]\nnested = "refused"\nerrno = ["nospc"]\n', "userns.errno"),
        ('[userns]\nerrno = ["EPERM"]\n', "userns.errno"),
        ('[filesystem]\nwrite_surface = "some"\n', "filesystem.write_surface"),
    ],
)
def test_a_bad_nesting_errno_or_write_surface_names_its_key(tmp_path: Path, body: str, key: str) -> None:
    with pytest.raises(P.InvalidProfile) as e:
        P.load(_write(tmp_path, '[profile]\nname = "t"\n' + body))
    assert e.value.key == key


def test_bwrap_itself_starts_with_no_environment_and_a_read_only_proc_sys() -> None:
    # bwrap's --clearenv clears only what the task execs with; bwrap, the sandbox's PID 1, keeps what it
    # was started with (/proc/1/environ), so it is started through `env -i`. And its --proc leaves the
    # host's sysctls writable to a root task: /proc/sys is bound read-only over it.
    argv = bwrap_argv.reference_argv(P.load(None), VALUES, FACTS)
    assert argv[:3] == ("/usr/bin/env", "-i", "/usr/bin/bwrap")
    proc = argv.index("--proc")
    assert argv[proc + 2 : proc + 5] == ("--ro-bind", "/proc/sys", "/proc/sys")


def test_a_profile_disclaims_a_default_promise_with_a_reason_and_allows_devices_and_sockets(
    tmp_path: Path,
) -> None:
    prof = P.load(
        _write(
            tmp_path,
            MINIMAL
            + 'unix_allowed = ["/run/agent.sock"]\n[devices]\nallow = ["/dev/fuse"]\n'
            + '[promises]\nnot_claimed = { host_sockets = "binds / read-only: every host socket shows" }\n',
        )
    )
    assert "host_sockets" not in prof.promises() and "devices" in prof.promises()
    assert prof.not_claimed == {"host_sockets": "binds / read-only: every host socket shows"}
    assert prof.devices_allowed == ("/dev/fuse",) and prof.unix_allowed == ("/run/agent.sock",)


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ('[promises]\nnot_claimed = { network = "x" }\n', "promises.not_claimed.network"),
        ('[promises]\nnot_claimed = { devices = "" }\n', "promises.not_claimed.devices"),
        ('[promises]\nnot_claimed = "all"\n', "promises.not_claimed"),
        ('[devices]\nallow = ["/etc/passwd"]\n', "devices.allow"),
        ('[devices]\nallow = "/dev/fuse"\n', "devices.allow"),
    ],
)
def test_a_bad_reach_key_names_itself(tmp_path: Path, body: str, key: str) -> None:
    with pytest.raises(P.InvalidProfile) as e:
        P.load(_write(tmp_path, MINIMAL + body))
    assert e.value.key == key
