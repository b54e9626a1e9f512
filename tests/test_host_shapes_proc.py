"""Issue 12 on a real kernel: each host shape is built in a throwaway mount namespace
(`unshare --mount --propagation private`, torn down when its shell exits), then the probe's verdict
and cause and the runner's decision and exit code are asserted from the real CLI.

Only per-mount changes and new mounts are made, never a superblock change: `mount -o remount,ro
/proc` (no `bind`) or `-o remount,hidepid=` would flip the procfs superblock the host's /proc shares
with the copy. A fixture checks the host's /proc mounts and bwrap's mode are the same afterwards."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shlex
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox_conformance.processes.children import Completed, run

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parent.parent
CLI = REPO / ".venv/bin/sandbox-conformance"
LADDER = ("bwrap", "userns", "userns.map", "netns", "pidns.proc", "disable_userns")
OK = ("supported", None)
# A file under /proc that exists on every kernel this runs on: the one a shape binds /dev/null over.
MASK_TARGET = next((p for p in ("/proc/keys", "/proc/timer_list", "/proc/kallsyms") if os.path.isfile(p)),
                   None)

Shell = Callable[[str, Path], str]


def _masked(bwrap: str, tmp: Path) -> str:
    if MASK_TARGET is None:
        pytest.skip("no file under /proc to bind /dev/null over")
    return f"mount --bind /dev/null {MASK_TARGET}"


def _hidepid(bwrap: str, tmp: Path) -> str:
    # A NEW procfs instance: since Linux 5.8 each proc mount has its own superblock, so hidepid= here
    # is this mount's alone (fs/proc/root.c). Before 5.8 it would be the pid namespace's, the host's.
    if tuple(int(x) for x in platform.release().split(".")[:2]) < (5, 8):
        pytest.skip("hidepid is per pid namespace before Linux 5.8: the shape would change the host's /proc")
    return "mount -t proc -o hidepid=2 proc /proc"


def _bwrap_noexec(bwrap: str, tmp: Path) -> str:
    # A mode-0644 copy bound over the real path: the host's file is never touched.
    copy = tmp / "bwrap"
    return f"cp {bwrap} {copy} && chmod 0644 {copy} && mount --bind {copy} {bwrap}"


@dataclasses.dataclass(frozen=True)
class HostShape:
    build: Shell
    ladder: dict[str, tuple[str, str | None]]  # probe -> (verdict, cause); bwrap: (verdict, None)
    stderr: dict[str, str] = dataclasses.field(default_factory=dict)  # bwrap's exact words, observed
    also: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    exit: int = 75  # run --print-mode
    decision: tuple[str, ...] = ()  # lines of run --print-mode's output that must appear
    never: tuple[str, ...] = ()  # ... and that must not
    # Also a private pid namespace whose PID 1 declares `container=docker` in its environment, as a
    # container manager does (systemd's detect_container reads it): the platform probe's tier 1.
    in_container: bool = False


def _ladder(*pairs: tuple[str, str | None]) -> dict[str, tuple[str, str | None]]:
    return dict(zip(LADDER, pairs, strict=True))


SHAPES: dict[str, HostShape] = {
    # Docker's masked paths, in small: /dev/null over one /proc file.
    "masked /proc file": HostShape(
        _masked, _ladder(OK, OK, OK, OK, ("denied", "masked_proc"), OK),
        stderr={"pidns.proc": "bwrap: Can't mount proc on /newroot/proc: Operation not permitted"},
        also={"pidns.proc": []},
        decision=("mode: refused (requested auto)", "pidns.proc: denied (masked_proc)",
                  "way on: run where nothing is mounted over /proc contents"),
        never=("install bubblewrap",)),
    "read-only /proc/sys": HostShape(
        lambda b, t: "mount -o bind,ro /proc/sys /proc/sys",
        _ladder(OK, OK, OK, OK, ("denied", "masked_proc"), ("denied", "readonly_proc_sys")),
        stderr={"disable_userns":
                "bwrap: cannot open /proc/sys/user/max_user_namespaces: Read-only file system"},
        decision=("pidns.proc: denied (masked_proc)",),
        never=("install bubblewrap",)),
    "read-only /proc": HostShape(
        lambda b, t: "mount -o remount,bind,ro /proc",
        _ladder(OK, OK, *[("denied", "readonly_proc")] * 4),
        stderr={"netns": "bwrap: setting up uid map: Read-only file system"},
        decision=("userns.map: denied (readonly_proc)",
                  "way on: mount /proc read-write where the suite runs"),
        never=("install bubblewrap", "allow unprivileged user namespaces")),
    "hidepid=2": HostShape(
        _hidepid, _ladder(OK, OK, OK, OK, OK, OK), exit=0, decision=("mode: native",)),
    "hidepid=2 over a masked file": HostShape(
        lambda b, t: f"{_hidepid(b, t)} && {_masked(b, t)}",
        _ladder(OK, OK, OK, OK, ("denied", "masked_proc"), OK),
        also={"pidns.proc": []},
        decision=("pidns.proc: denied (masked_proc)",)),
    "declared docker container": HostShape(
        lambda b, t: "true", _ladder(OK, OK, OK, OK, OK, OK), exit=0, in_container=True,
        decision=("mode: native", "why: inside a docker container (platform: ")),
    "declared docker container with a masked /proc file": HostShape(
        _masked, _ladder(OK, OK, OK, OK, ("denied", "masked_proc"), OK), in_container=True,
        decision=("nor a reachable container engine, inside a docker container",
                  "because: platform: ")),
    "bwrap not executable": HostShape(
        _bwrap_noexec,
        _ladder(("denied", None), OK, OK, *[("unsupported", "no_bwrap")] * 3),
        decision=("bwrap: denied", "chmod 0755"),
        never=("apt-get install bubblewrap",)),
}


def _host_state(bwrap: str) -> tuple[list[str], int]:
    with open("/proc/self/mountinfo") as f:
        proc = [line for line in f if " /proc" in line.split(" - ")[0]]
    return proc, os.stat(bwrap).st_mode


@pytest.fixture
def in_shape(root_only: None, bwrap_path: str, tmp_path: Path) -> Iterator[Callable[..., Completed]]:
    if shutil.which("unshare") is None:
        pytest.skip("util-linux unshare not installed")
    if not CLI.exists():
        pytest.skip(f"{CLI} not installed: run `make test` (pip install -e .)")
    bwrap = os.path.realpath(bwrap_path)
    before = _host_state(bwrap)
    (tmp_path / "xdg").mkdir()
    # No engine, whatever the docker tier is doing meanwhile: the decision must not depend on it.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C", "HOME": str(tmp_path),
           "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock",
           "CONTAINER_HOST": f"unix://{tmp_path}/no-podman.sock"}

    def go(shape: HostShape, *args: str, timeout: float = 120) -> Completed:
        script = f"{shape.build(bwrap, tmp_path)} && exec {shlex.quote(str(CLI))} {shlex.join(args)}"
        # --mount-proc mounts a NEW procfs for the new pid namespace (its own superblock), in the
        # private mount namespace only.
        pid1 = ["--pid", "--fork", "--mount-proc", "env", "container=docker"] if shape.in_container else []
        return run(["unshare", "--mount", "--propagation", "private", *pid1, "sh", "-c", script],
                   timeout=timeout, env=env, cwd=str(REPO))

    yield go
    assert _host_state(bwrap) == before, "a shape leaked onto the host"


@pytest.mark.parametrize("name", list(SHAPES))
def test_the_probe_gives_each_shape_its_verdict_and_true_cause(
        in_shape: Callable[..., Completed], name: str) -> None:
    shape = SHAPES[name]
    done = in_shape(shape, "probe", "--json", "--only", ",".join(LADDER))
    assert done.returncode == 0, done.stderr
    by = {f["probe"]: f for f in json.loads(done.stdout)["findings"]}
    got = {p: (by[p]["verdict"], by[p]["facts"].get("cause")) for p in LADDER}
    assert got == shape.ladder, {p: by[p]["reason"] for p in LADDER}
    for probe, words in shape.stderr.items():
        assert by[probe]["evidence"]["stderr"] == words
    for probe, also in shape.also.items():
        assert by[probe]["facts"]["also"] == also
    if name == "bwrap not executable":
        assert by["bwrap"]["reason"].startswith(f"bwrap found at {by['bwrap']['facts']['path']} but not "
                                                f"executable (mode -rw-r--r-- 0644)")


@pytest.mark.parametrize("name", list(SHAPES))
def test_run_print_mode_decides_each_shape(in_shape: Callable[..., Completed], name: str) -> None:
    shape = SHAPES[name]
    done = in_shape(shape, "run", "--print-mode")
    assert done.returncode == shape.exit, done.stdout + done.stderr
    for words in shape.decision:
        assert words in done.stdout, done.stdout
    for words in shape.never:
        assert words not in done.stdout, done.stdout


def test_run_refuses_a_masked_proc_before_running_anything(in_shape: Callable[..., Completed]) -> None:
    """Was: native picked, every task a harness error, `FAIL mode=native exit=1`."""
    done = in_shape(SHAPES["masked /proc file"], "run", timeout=300)
    assert done.returncode == 75, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith("sandbox-conformance: REFUSED mode=auto exit=75")
    assert "pidns.proc: denied (masked_proc)" in done.stderr


def test_the_host_bwrap_mode_is_what_the_noexec_shape_copies(bwrap_path: str) -> None:
    """The non-executable shape binds a 0644 copy; the real file stays executable."""
    assert os.stat(os.path.realpath(bwrap_path)).st_mode & stat.S_IXUSR
