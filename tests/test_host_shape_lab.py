"""Issue 12's host-shape lab: the hosts users have, built on real kernels under qemu (runners/vm/), each
asserted for the probe's verdict and named cause and the runner's decision and exit code.

Three boots, each grouping its shapes (a boot under TCG is cheap, the CLI inside is not):
- kernel policy (tests/host_shape_lab/kernel_policy.py, stage 2 as PID 1): Debian's generic kernel;
  `kernel.unprivileged_userns_clone=0`, `user.max_user_namespaces=0`, a masked /proc file, a
  read-only /proc/sys, a `bwrap --disable-userns` sandbox around the CLI, a setuid bwrap, and that
  setuid bwrap under the sysctl (Debian <= 10's default), changed between commands inside the guest;
- systemd (tests/host_shape_lab/systemd_host.py, systemd 252 as PID 1 over the host's / with a tmpfs
  upper layer): logind, a lingering user manager with delegated controllers, `run --delegate`, the
  systemd-run adapter, the deployment guard against real units;
- container host (tests/host_shape_lab/container_host.py, stage 2 as PID 1, cgroup2 only: the shape of
  Docker Desktop's Linux VM): dockerd with the cgroupfs driver inside the guest, the Docker tier's image
  loaded into it, `run --mode container` (the cgroup set-up for real, both legs), and a plain `docker
  run` under Docker's default seccomp profile.

Fast unit tests at the end pin the classification rules these boots proved (they fail on the code
before the fixes the lab made). The boots' wall times are printed (pytest -s) and in docs/findings.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_conformance.probes.classify import Cause, Rung, Signals, Step, TrialOutcome, classify
from sandbox_conformance.probes.finding import Verdict
from sandbox_conformance.processes import owner
from sandbox_conformance.runners.vm import image as vm_image
from sandbox_conformance.runners.vm import mode as vm_mode
from sandbox_conformance.runners.vm import qemu as vm
from sandbox_conformance.runners.vm.qemu import SystemdGuest, VmResult, run_in_vm

if TYPE_CHECKING:
    from docker_tier import DockerTier

# The Docker tier's session fixture (tests/docker_tier.py): the container boot's image is the one the
# tier builds once per session from the Dockerfile, saved into the guest's share.
pytest_plugins = ["docker_tier"]

REPO = Path(__file__).resolve().parent.parent
LAB = Path(__file__).resolve().parent / "host_shape_lab"
CLI = REPO / ".venv/bin/sandbox-conformance"
LADDER = ("bwrap", "userns", "userns.map", "netns", "pidns.proc", "disable_userns")
OK = ("supported", None)
# The unit suffix the systemd guest's signature names (tests/host_shape_lab/systemd_host.py).
UNIT = "deploy-sbxc-lab-agent.service"

# bwrap 0.8.0's own words, as the shapes below produced them on Debian's 6.1 kernel.
MASKED = "bwrap: Can't mount proc on /newroot/proc: Operation not permitted"
RO_SYS = "bwrap: cannot open /proc/sys/user/max_user_namespaces: Read-only file system"
SETUID_NESTED = "bwrap: cannot open /proc/sys/user/max_user_namespaces: Permission denied"
NESTING = ("bwrap: Creating new namespace failed: nesting depth or /proc/sys/user/max_*_namespaces "
           "exceeded (ENOSPC)")
NO_USERNS = ("bwrap: No permissions to create new namespace, likely because the kernel does not allow "
             "non-privileged user namespaces. See <https://deb.li/bubblewrap> or "
             "<file:///usr/share/doc/bubblewrap/README.Debian.gz>.")
ROOT_NESTED_UUC = "bwrap: unshare user ns: Operation not permitted"


# ---------------------------------------------------------------- boots


@dataclasses.dataclass(frozen=True)
class Boot:
    result: VmResult
    doc: dict
    files: Mapping[str, str]  # reports the guest wrote into the share, read before it was removed
    leftover_qemu: list[int]  # pids (runners/vm/qemu.py qemu_pids)
    leftover_workdir: bool


def _image() -> vm_image.VmImage:
    if os.geteuid() != 0:
        pytest.skip("the host-shape lab runs as root (qemu's 9p passthrough keeps host owners only as root)")
    if shutil.which(vm.QEMU) is None:
        pytest.skip(f"{vm.QEMU} not installed: run scripts/vm-deps")
    if not CLI.exists():
        pytest.skip(f"{CLI} not installed: run `make test` (pip install -e .)")
    try:
        return vm_image.ensure_image()
    except vm_image.ImageNotBuilt as e:
        pytest.skip(f"no VM image: {e}")



def guest_args(args: list[str], *, out: Path, work: Path, accel: vm.Accel) -> list[str]:
    """A lab script's arguments with its placeholders filled: {out}, {work}, and {launch_timeout}, the
    per-launch timeout the VM mode gives this accelerator's guest (runners/vm/mode.py): the witness's
    native 30 s ran out in a TCG guest beside two busy loops (issue 28)."""
    fill = {"{out}": str(out), "{work}": str(work), "{launch_timeout}": str(vm_mode.launch_timeout(accel))}

    def filled(arg: str) -> str:
        for key, value in fill.items():  # inside a word too: "{work}/image.tar"
            arg = arg.replace(key, value)
        return arg

    return [filled(a) for a in args]


def _boot(name: str, script: str, args: list[str], *, timeout: float,
          systemd: SystemdGuest | None = None, prepare: Callable[[Path], None] | None = None) -> Boot:
    """prepare(workdir): puts what the guest needs into the share before the boot (removed with it)."""
    image = _image()
    # Under /var/tmp (the host's /, seen by the guest), with the owner's stamp: a SIGKILLed session's
    # leftover is swept by the next run (processes/owner.py, prefix sbxc-vm.).
    work = Path(tempfile.mkdtemp(prefix=f"sbxc-vm.{owner.stamp()}.lab-{name}.", dir="/var/tmp"))
    work.chmod(0o711)  # the guest's unprivileged user reaches its report directory (out/, 1777) through it
    files: dict[str, str] = {}
    try:
        if prepare is not None:
            prepare(work)
        out = work / "out"
        accel = vm.select_accel(image)  # before the boot: the guest's launch timeout depends on it
        argv = ["/usr/bin/python3", "-I", "-S", str(LAB / script), "--cli", str(CLI), "--repo", str(REPO),
                *guest_args(args, out=out, work=work, accel=accel)]
        started = time.monotonic()
        result = run_in_vm(argv, workdir=work, timeout=timeout, cwd=str(REPO), image=image, accel=accel,
                           systemd=systemd)
        wall = time.monotonic() - started
        print(f"\nhost-shape lab, {name} boot: exit {result.exit_code}, {result.accel}, boot "
              f"{result.boot_seconds}s, wall {wall:.1f}s, load {os.getloadavg()[0]:.1f}")
        if out.is_dir():
            files = {p.name: p.read_text(errors="replace") for p in out.iterdir() if p.is_file()}
        try:
            doc = json.loads(result.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            doc = {}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Boot(result, doc, files, vm.qemu_pids(str(work)), work.exists())


def _ok(boot: Boot) -> dict:
    r = boot.result
    assert r.exit_code == 0 and boot.doc, (r.error, r.stderr[-3000:], r.console[-3000:])
    return boot.doc


@pytest.fixture(scope="session")
def policy_boot(test_user: str) -> Boot:
    return _boot("policy", "kernel_policy.py", ["--user", test_user], timeout=900)


def systemd_args(user: str) -> list[str]:
    return ["--user", user, "--out", "{out}", "--launch-timeout", "{launch_timeout}"]


@pytest.fixture(scope="session")
def systemd_boot(test_user: str) -> Boot:
    return _boot("systemd", "systemd_host.py", systemd_args(test_user), timeout=1200,
                 systemd=SystemdGuest())


# ---------------------------------------------------------------- kernel policy shapes


Ladder = dict[str, tuple[str, str | None]]


def _ladder(*pairs: tuple[str, str | None]) -> Ladder:
    return dict(zip(LADDER, pairs, strict=True))


ALL_OK = _ladder(OK, OK, OK, OK, OK, OK)


@dataclasses.dataclass(frozen=True)
class Shape:
    root: Ladder | None  # None: the shape has no root ladder (the nested shape runs as the user only)
    user: Ladder
    stderr: Mapping[str, str] = dataclasses.field(default_factory=dict)  # "probe@who" -> evidence
    modes: Mapping[str, tuple[int, tuple[str, ...]]] = dataclasses.field(default_factory=dict)
    bwrap: Mapping[str, str] = dataclasses.field(default_factory=dict)  # bwrap_root/_user/_nested_user


D, UNK = "denied", "unknown"
SHAPES: dict[str, Shape] = {
    # The guest itself, unchanged: the control every other shape differs from.
    "baseline": Shape(ALL_OK, ALL_OK, modes={"mode_user": (0, ("mode: native",))},
                      bwrap={"bwrap_root": "", "bwrap_user": "", "bwrap_nested_user": ""}),
    "masked_proc": Shape(
        _ladder(OK, OK, OK, OK, (D, "masked_proc"), OK), _ladder(OK, OK, OK, OK, (D, "masked_proc"), OK),
        stderr={"pidns.proc@root": MASKED, "pidns.proc@user": MASKED},
        modes={"mode_root": (75, ("mode: refused (requested auto)", "pidns.proc: denied (masked_proc)",
                                  "way on: run where nothing is mounted over /proc contents"))},
        bwrap={"bwrap_root": MASKED, "bwrap_user": MASKED, "bwrap_nested_user": ""}),
    "readonly_proc_sys": Shape(
        _ladder(OK, OK, OK, OK, (D, "masked_proc"), (D, "readonly_proc_sys")),
        _ladder(OK, OK, OK, OK, (D, "masked_proc"), (D, "readonly_proc_sys")),
        stderr={"pidns.proc@root": MASKED, "disable_userns@root": RO_SYS, "disable_userns@user": RO_SYS},
        modes={"mode_root": (75, ("pidns.proc: denied (masked_proc)",))},
        bwrap={"bwrap_root": MASKED, "bwrap_nested_user": RO_SYS}),
    # bwrap 0.8.0 setuid: namespaces work, --disable-userns cannot write the limit (EACCES).
    "setuid_bwrap": Shape(
        ALL_OK, _ladder(OK, OK, OK, OK, OK, (D, "setuid_bwrap")),
        stderr={"disable_userns@user": SETUID_NESTED},
        modes={"mode_user": (0, ("mode: native",))},
        bwrap={"bwrap_user": "", "bwrap_nested_user": SETUID_NESTED}),
    "nested": Shape(
        None, _ladder(OK, (D, "nested"), (UNK, "earlier_rung"), (D, "nested"), (D, "nested"), (D, "nested")),
        stderr={"netns@user": NESTING, "pidns.proc@user": NESTING, "disable_userns@user": NESTING},
        modes={"mode_user": (75, ("running inside a sandbox", "userns: denied",
                                  "way on: run sandbox-conformance on the host, outside the sandbox"))}),
    # Root keeps CAP_SYS_ADMIN for its own namespaces, not for --disable-userns's nested one.
    "unprivileged_userns_clone=0": Shape(
        _ladder(OK, OK, OK, OK, OK, (D, "unprivileged_userns_clone")),
        _ladder(OK, (D, "unprivileged_userns_clone"), (UNK, "earlier_rung"),
                *[(D, "unprivileged_userns_clone")] * 3),
        stderr={"disable_userns@root": ROOT_NESTED_UUC, "netns@user": NO_USERNS,
                "pidns.proc@user": NO_USERNS},
        modes={"mode_root": (0, ("mode: native",)),
               "mode_user": (75, ("userns: denied (unprivileged_userns_clone)",
                                  "way on: allow unprivileged user namespaces: "
                                  "sysctl -w kernel.unprivileged_userns_clone=1"))},
        bwrap={"bwrap_root": "", "bwrap_user": NO_USERNS}),
    "max_user_namespaces=0": Shape(
        _ladder(OK, (D, "max_user_namespaces"), (UNK, "earlier_rung"), *[(D, "max_user_namespaces")] * 3),
        _ladder(OK, (D, "max_user_namespaces"), (UNK, "earlier_rung"), *[(D, "max_user_namespaces")] * 3),
        stderr={"netns@root": NESTING, "netns@user": NESTING},
        modes={"mode_user": (75, ("userns: denied (max_user_namespaces)",
                                  "way on: allow user namespaces: "
                                  "sysctl -w user.max_user_namespaces=15000"))},
        bwrap={"bwrap_root": NESTING, "bwrap_user": NESTING}),
    # A setuid bwrap makes its namespaces with privilege, so the sysctl stops only our own unshare:
    # the suite's userns trials (and its nested-userns witness) need unprivileged user namespaces,
    # so the run is refused with the sysctl as the way on.
    "setuid_bwrap+unprivileged_userns_clone=0": Shape(
        _ladder(OK, OK, OK, OK, OK, (D, "unprivileged_userns_clone")),
        _ladder(OK, (D, "unprivileged_userns_clone"), (UNK, "earlier_rung"), OK, OK, (D, "setuid_bwrap")),
        stderr={"disable_userns@user": SETUID_NESTED},
        modes={"mode_user": (75, ("userns: denied (unprivileged_userns_clone)",))},
        bwrap={"bwrap_user": "", "bwrap_nested_user": SETUID_NESTED}),
}


def _findings(result: Mapping) -> dict[str, dict]:
    assert result["rc"] == 0, result["stderr"][-2000:]
    return {f["probe"]: f for f in json.loads(result["stdout"])["findings"]}


def _shape(policy_boot: Boot, name: str) -> dict:
    shapes = _ok(policy_boot)["shapes"]
    assert name in shapes, sorted(shapes)
    return shapes[name]


@pytest.mark.integration
@pytest.mark.timeout(1200)
class TestKernelPolicyShapes:
    def test_the_guest_runs_debians_kernel_and_left_nothing_behind(self, policy_boot: Boot) -> None:
        doc = _ok(policy_boot)
        assert doc["kernel"].endswith("-amd64"), doc["kernel"]
        assert policy_boot.leftover_qemu == [] and not policy_boot.leftover_workdir

    @pytest.mark.parametrize("name", list(SHAPES))
    def test_the_probe_gives_each_shape_its_verdict_and_cause(self, policy_boot: Boot, name: str,
                                                               test_user: str) -> None:
        shape, ran = SHAPES[name], _shape(policy_boot, name)
        seen: dict[str, dict] = {}
        if shape.root is not None:
            by = _findings(ran["probe"])
            got = {p: (by[p]["verdict"], by[p]["facts"].get("cause")) for p in LADDER}
            assert got == shape.root, {p: by[p]["reason"] for p in LADDER}
            # --as-user repeats the rungs, not the bwrap probe (one binary for both).
            rungs = LADDER[1:]
            got = {p: (by[f"{p}@{test_user}"]["verdict"], by[f"{p}@{test_user}"]["facts"].get("cause"))
                   for p in rungs}
            assert got == {p: shape.user[p] for p in rungs}, {p: by[f"{p}@{test_user}"]["reason"]
                                                              for p in rungs}
            seen = {**{f"{p}@root": by[p] for p in LADDER}, **{f"{p}@user": by[f"{p}@{test_user}"]
                                                                for p in rungs}}
        else:
            by = _findings(ran["probe_user"])
            got = {p: (by[p]["verdict"], by[p]["facts"].get("cause")) for p in LADDER}
            assert got == shape.user, {p: by[p]["reason"] for p in LADDER}
            seen = {f"{p}@user": by[p] for p in LADDER}
        for key, words in shape.stderr.items():
            assert seen[key]["evidence"].get("stderr") == words, (key, seen[key]["evidence"])

    @pytest.mark.parametrize("name", list(SHAPES))
    def test_run_decides_each_shape_with_its_exit_code(self, policy_boot: Boot, name: str) -> None:
        ran = _shape(policy_boot, name)
        for key, (code, lines) in SHAPES[name].modes.items():
            done = ran[key]
            assert done["rc"] == code, (key, done["stdout"], done["stderr"][-2000:])
            for words in lines:
                assert words in done["stdout"], (key, done["stdout"])
            assert "install bubblewrap" not in done["stdout"], (key, done["stdout"])

    @pytest.mark.parametrize("name", [n for n in SHAPES if SHAPES[n].bwrap])
    def test_bwrap_says_what_the_findings_quote(self, policy_boot: Boot, name: str) -> None:
        ran = _shape(policy_boot, name)
        for key, words in SHAPES[name].bwrap.items():
            done = ran[key]
            assert done["stderr"].strip() == words, (key, done)
            assert (done["rc"] == 0) == (words == ""), (key, done)

    def test_the_setuid_shape_really_ran_a_setuid_bwrap(self, policy_boot: Boot, test_user: str) -> None:
        for name in ("setuid_bwrap", "setuid_bwrap+unprivileged_userns_clone=0"):
            bwrap = _findings(_shape(policy_boot, name)["probe"])["bwrap"]
            assert bwrap["facts"]["setuid"] is True, bwrap
        assert _findings(_shape(policy_boot, "baseline")["probe"])["bwrap"]["facts"]["setuid"] is False

    def test_each_sysctl_was_restored_for_the_shapes_after_it(self, policy_boot: Boot) -> None:
        # The combined shape ran last, after both sysctl shapes: its root ladder works, so neither
        # max_user_namespaces=0 nor anything else leaked into it.
        by = _findings(_shape(policy_boot, "setuid_bwrap+unprivileged_userns_clone=0")["probe"])
        assert by["userns"]["verdict"] == "supported", by["userns"]


# ---------------------------------------------------------------- systemd as PID 1


def _junit(text: str) -> dict[str, str]:
    out = {}
    for case in ET.fromstring(text).iter("testcase"):
        kinds = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
        out[case.get("name", "")] = kinds[0] if kinds else "passed"
    return out


def _verdicts(report: dict) -> dict[str, str]:
    return {p["promise"]: p["verdict"] for p in report["promises"]}


@pytest.mark.integration
@pytest.mark.timeout(1500)
class TestSystemdHost:
    def test_systemd_is_pid_1_and_the_user_lingers_with_a_manager(self, systemd_boot: Boot) -> None:
        doc = _ok(systemd_boot)
        assert doc["pid1"] == "systemd"
        assert doc["own_cgroup"] == "0::/system.slice/sbxc-guest.service", doc["own_cgroup"]
        assert doc["linger"]["rc"] == 0 and doc["user_manager_up"], doc["linger"]
        assert systemd_boot.leftover_qemu == [] and not systemd_boot.leftover_workdir

    def test_systemd_user_finds_the_manager_and_its_delegated_controllers(self, systemd_boot: Boot) -> None:
        doc = _ok(systemd_boot)
        f = _findings(doc["probe_user"])["systemd_user"]
        assert f["verdict"] == "supported", f["reason"]
        assert f["facts"]["reachable"] and f["facts"]["booted"] and f["facts"]["linger"], f["facts"]
        # The probe's list is what the kernel says user@UID.service may hand down.
        assert f["facts"]["delegated_controllers"] == sorted(doc["user_service_controllers"].split())
        assert {"memory", "pids"} <= set(f["facts"]["delegated_controllers"])

    def test_run_delegate_runs_the_cgroup_witnesses_in_the_delegated_subtree(
            self, systemd_boot: Boot, test_user: str) -> None:
        """Was: PASS with cgroup, memory_max and pids_max `not tested` (EBUSY enabling controllers on
        the unit's own cgroup, which held the rerun itself)."""
        doc = _ok(systemd_boot)
        done = doc["delegate"]
        assert done["rc"] == 0, done["stdout"][-3000:] + done["stderr"][-3000:]
        assert "re-executing under" in done["stderr"]
        report = json.loads(systemd_boot.files["delegate.json"])
        verdicts = _verdicts(report)
        assert {k: verdicts.get(k) for k in ("cgroup", "memory_max", "pids_max")} == dict.fromkeys(
            ("cgroup", "memory_max", "pids_max"), "kept"), verdicts
        cases = _junit(systemd_boot.files["delegate.xml"])
        for name in ("test_the_task_runs_in_its_own_cgroup_leaf",
                     "test_an_allocation_past_memory_max_is_oom_killed",
                     "test_forking_past_pids_max_fails_with_eagain"):
            assert cases.get(name) == "passed", (name, cases)
        uid = _uid(test_user)
        delegated = f"/user.slice/user-{uid}.slice/user@{uid}.service/"
        # The host side's record of each task's leaf (the harness's observer): inside the subtree the
        # user manager delegated, not anywhere the rerun could not own.
        for task in report["tasks"]:
            assert task["cgroup"] and delegated in json.dumps(task["cgroup"]), task["cgroup"]

    def test_the_systemd_run_adapter_keeps_every_promise(self, systemd_boot: Boot) -> None:
        """Was: write_surface BROKEN (/home, /root, /run/user and the host's /dev writable under
        ProtectSystem=strict alone). The native run of this adapter stays in tests/expected-skips.txt:
        this machine has no systemd as PID 1; this boot is where it runs."""
        doc = _ok(systemd_boot)
        done = doc["adapter"]
        report = json.loads(systemd_boot.files["adapter.json"])
        broken = {k: v for k, v in _verdicts(report).items() if v != "kept"}
        assert not broken, (broken, done["stdout"][-3000:])
        assert done["rc"] == 0, done["stdout"][-3000:] + done["stderr"][-2000:]
        cases = _junit(systemd_boot.files["adapter.xml"])
        assert cases and set(cases.values()) == {"passed"}, cases

    def test_the_deployment_guard_sees_a_real_unit_under_the_system_manager_and_refuses(
            self, systemd_boot: Boot) -> None:
        dep = _ok(systemd_boot)["deployment"]
        clear = _findings(dep["clear_probe"])["deployment"]
        assert clear["verdict"] == "not_detected", clear  # the control: signature set, no such unit
        assert dep["system_start"]["rc"] == 0, dep["system_start"]
        seen = _findings(dep["system_probe"])["deployment"]
        assert seen["verdict"] == "detected", seen
        assert UNIT in json.dumps(seen["facts"]["matches"]), seen["facts"]
        run = dep["system_run"]
        assert run["rc"] == 75, run["stdout"][-2000:] + run["stderr"][-2000:]
        assert "REFUSED mode=auto exit=75" in run["stderr"], run["stderr"][-2000:]
        assert UNIT in run["stdout"] + run["stderr"]

    def test_the_deployment_guard_sees_a_real_unit_under_the_user_manager_and_refuses(
            self, systemd_boot: Boot) -> None:
        dep = _ok(systemd_boot)["deployment"]
        assert dep["user_start"]["rc"] == 0, dep["user_start"]
        seen = _findings(dep["user_probe"])["deployment"]
        assert seen["verdict"] == "detected", seen
        assert UNIT in json.dumps(seen["facts"]["matches"]), seen["facts"]
        mode = dep["user_mode"]
        assert mode["rc"] == 75, mode["stdout"] + mode["stderr"][-2000:]
        assert "mode: refused (requested auto)" in mode["stdout"] and UNIT in mode["stdout"], mode["stdout"]


def _uid(user: str) -> int:
    import pwd

    return pwd.getpwnam(user).pw_uid


# ---------------------------------------------------------------- container mode on a cgroup2-only host


@dataclasses.dataclass(frozen=True)
class ContainerBoot:
    boot: Boot
    image: str
    tarball_left: bool  # the `docker save` tarball still on the host after the boot
    images_before: frozenset[str]  # the Docker tier's images, before the save and after the boot
    images_after: frozenset[str]


def _tier_images(tier: DockerTier) -> frozenset[str]:
    listed = tier.docker_cmd("images", "--all", "--quiet", "--no-trunc", timeout=60)
    assert listed.ok, listed.stderr
    return frozenset(listed.stdout.split())


@pytest.fixture(scope="session")
def container_boot(docker_tier: DockerTier) -> ContainerBoot:
    """The image is built once per session by the Docker tier (the guest has no network, so the
    Dockerfile's apt-get cannot run there); `docker save` puts it in the boot's share, which goes with
    the workdir."""
    before = _tier_images(docker_tier)
    saved: list[Path] = []

    def save(work: Path) -> None:
        tar = work / "image.tar"
        saved.append(tar)
        done = docker_tier.docker_cmd("save", "--output", str(tar), docker_tier.image, timeout=300)
        if not done.ok:
            raise RuntimeError(f"docker save {docker_tier.image}: {done.stderr_tail(3)}")

    # 1500 s: 520 s in a good boot beside two busy loops (docker load 253 s, the run 228 s), and over
    # 960 s in a fresh-clone CI run at the same load (issue 28), where 900 s killed it mid-run.
    boot = _boot("container", "container_host.py",
                 ["--out", "{out}", "--image-tar", "{work}/image.tar", "--image", docker_tier.image],
                 timeout=1500, prepare=save)
    steps = {k: v.get("seconds") for k, v in boot.doc.items() if isinstance(v, dict) and "seconds" in v}
    print(f"host-shape lab, container boot steps (s): {steps}")
    return ContainerBoot(boot, docker_tier.image, any(p.exists() for p in saved), before,
                         _tier_images(docker_tier))


def _in_plain_container(container_boot: ContainerBoot) -> dict[str, Any]:
    """What the commands in the plain `docker run` saw (container_host.py IN_CONTAINER)."""
    done = _ok(container_boot.boot)["seccomp"]
    assert done["rc"] == 0, (done["stdout"][-2000:], done["stderr"][-2000:])
    seen: dict[str, Any] = json.loads(done["stdout"].strip().splitlines()[-1])
    return seen


CGROUP_FAMILIES = ("cgroup", "memory_max", "pids_max")
CGROUP_TESTS = ("test_the_task_runs_in_its_own_cgroup_leaf",
                "test_an_allocation_past_memory_max_is_oom_killed",
                "test_forking_past_pids_max_fails_with_eagain",
                "test_a_task_tree_is_reaped_whole_by_cgroup_kill")
SETUP_ROOT = "/sys/fs/cgroup/tasks"  # runners/cgroup_setup.py: <the container's cgroup2 mount>/tasks


@pytest.mark.integration
@pytest.mark.timeout(3000)  # the Docker tier's set-up (debootstrap, build) may be paid here, then the boot
class TestContainerHost:
    def test_the_guest_is_cgroup2_only_and_dockerd_files_containers_with_cgroupfs(
            self, container_boot: ContainerBoot) -> None:
        doc = _ok(container_boot.boot)
        # One cgroup2 mount, no v1 hierarchy bound to any controller (/proc/cgroups column 2 is 0).
        fstypes = [m.split(" - ")[1].split()[0] for m in doc["cgroup_mounts"]]
        assert fstypes == ["cgroup2"], doc["cgroup_mounts"]
        rows = [line.split() for line in doc["proc_cgroups"].splitlines()[1:]]
        assert rows and all(r[1] == "0" for r in rows), doc["proc_cgroups"]
        assert {"memory", "pids"} <= set(doc["root_controllers"].split())
        assert doc["dockerd"]["up"], doc["dockerd"]
        assert doc["info"]["stdout"].split()[:3] == ["2", "cgroupfs", "overlay2"], doc["info"]
        assert "name=seccomp,profile=default" in doc["info"]["stdout"], doc["info"]
        assert f"Loaded image: {container_boot.image}" in doc["load"]["stdout"], doc["load"]

    def test_nothing_is_left_behind(self, container_boot: ContainerBoot) -> None:
        boot = container_boot.boot
        assert boot.leftover_qemu == [] and not boot.leftover_workdir
        assert not container_boot.tarball_left
        # docker save creates no image; the tier's images are the tier's, removed at its teardown.
        assert container_boot.images_after == container_boot.images_before
        left = _ok(boot)["containers_left"]
        assert left["rc"] == 0 and left["stdout"].split() == [], left  # in the guest: run's --rm and rm

    def test_container_mode_passes_both_legs_after_a_real_cgroup_setup(
            self, container_boot: ContainerBoot) -> None:
        done = _ok(container_boot.boot)["run"]
        out = done["stdout"][-3000:] + done["stderr"][-3000:]
        assert done["rc"] == 0, out
        setup = [ln for ln in done["stderr"].splitlines() if "container: cgroup set-up:" in ln]
        assert setup == [f"sandbox-conformance run: container: cgroup set-up: exported "
                         f"SANDBOX_CONFORMANCE_CGROUP_ROOT={SETUP_ROOT}"], out
        for label in ("root", "sbxc"):
            assert f"container: as {label}: PASS" in done["stderr"], out
        last = done["stderr"].strip().splitlines()[-1]
        assert last.startswith("sandbox-conformance: PASS mode=container exit=0"), last
        verdict = json.loads(container_boot.boot.files["verdict.json"])
        assert (verdict["verdict"], verdict["mode"], verdict["exit"]) == ("PASS", "container", 0), verdict

    @pytest.mark.parametrize("label", ["root", "sbxc"])
    def test_the_cgroup_witnesses_passed_in_the_leg(self, container_boot: ContainerBoot, label: str) -> None:
        """The runner's --require means nothing may skip: every witness ran in both legs, the cgroup
        ones in leaves under the root the set-up proved (the task's cgroup as the host side saw it)."""
        files = container_boot.boot.files
        report = json.loads(files[f"run-{label}.json"])
        assert report["as_user"] == (None if label == "root" else "sbxc")
        assert report["cgroup_setup"]["root"] == SETUP_ROOT, report["cgroup_setup"]
        assert report["summary"]["not_tested"] == 0 and report["summary"]["broken"] == 0, report["summary"]
        verdicts = _verdicts(report)
        kept = dict.fromkeys(CGROUP_FAMILIES, "kept")
        assert {k: verdicts.get(k) for k in CGROUP_FAMILIES} == kept, verdicts
        outcomes = {t["nodeid"].rsplit("::", 1)[-1]: t["outcome"]
                    for p in report["promises"] for t in p["tests"] if t["family"] in CGROUP_FAMILIES}
        assert outcomes and set(outcomes.values()) == {"passed"}, outcomes
        cases = _junit(files[f"run-{label}.xml"])
        passed = dict.fromkeys(CGROUP_TESTS, "passed")
        assert {name: cases.get(name) for name in CGROUP_TESTS} == passed, cases
        leaves = [t["cgroup"] for t in report["tasks"] if t.get("cgroup")]
        assert leaves and all(c["path"].startswith(f"{SETUP_ROOT}/") for c in leaves), leaves
        # The memory.max witness's task met its leaf's limit: the kernel counted an OOM kill there.
        assert any(c.get("oom_kill", 0) >= 1 for c in leaves), leaves

    def test_dockers_default_seccomp_profile_denies_userns_with_its_cause(
            self, container_boot: ContainerBoot) -> None:
        """A plain `docker run` of the same image: no CAP_SYS_ADMIN, Seccomp: 2. bwrap blames the
        kernel (NO_USERNS), which allows user namespaces here; the probe names the filter."""
        seen = _in_plain_container(container_boot)
        assert "Seccomp:\t2" in seen["status"]["stdout"], seen["status"]
        by = _findings(seen["probe"])
        ladder = ("userns", "userns.map", "netns", "pidns.proc", "disable_userns")
        # disable_userns: its namespace was refused before the read-only /proc/sys could matter (was
        # `readonly_proc_sys`, also seccomp; probes/classify.py).
        expected = {"userns": ("denied", "seccomp"), "userns.map": ("unknown", "earlier_rung"),
                    "netns": ("denied", "seccomp"), "pidns.proc": ("denied", "seccomp"),
                    "disable_userns": ("denied", "seccomp")}
        for who in ("", "@sbxc"):
            got = {p: (by[p + who]["verdict"], by[p + who]["facts"].get("cause")) for p in ladder}
            assert got == expected, {p: by[p + who]["reason"] for p in ladder}
        assert by["userns"]["evidence"]["errno"] == "EPERM", by["userns"]["evidence"]
        # The kernel allows them: bwrap's "the kernel does not allow" is wrong here, the filter refused.
        assert by["userns"]["evidence"]["kernel.unprivileged_userns_clone"] == "1", by["userns"]["evidence"]
        assert by["netns"]["evidence"]["stderr"] == NO_USERNS
        assert (by["platform"]["verdict"], by["platform"]["facts"]["container"]) == ("detected", "docker")
        for key in ("bwrap_root", "bwrap_user"):
            assert (seen[key]["rc"], seen[key]["stderr"].strip()) == (1, NO_USERNS), seen[key]

    @pytest.mark.parametrize("key", ["run_root", "run_user"])
    def test_run_in_the_plain_container_refuses_naming_the_filter(self, container_boot: ContainerBoot,
                                                                  key: str) -> None:
        done = _in_plain_container(container_boot)[key]
        assert done["rc"] == 75, done
        lines = done["stderr"].strip().splitlines()
        assert lines[-1].startswith("sandbox-conformance: REFUSED mode=auto exit=75"), lines
        assert any("because: userns: denied" in ln and "seccomp filter without CAP_SYS_ADMIN" in ln
                   for ln in lines), lines
        assert "install bubblewrap" not in done["stderr"]
        # The filter, not nesting: and the container's own way on beside leaving it.
        assert "user namespaces are denied here (seccomp)" in done["stderr"], lines
        assert "nested user namespaces are refused" not in done["stderr"], lines
        assert any("way on:" in ln and "seccomp=unconfined" in ln for ln in lines), lines


# ---------------------------------------------------------------- the rules the boots proved (fast)


ADMIN = 1 << 21  # CAP_SYS_ADMIN in CapEff
AFTER_USERNS = frozenset({Rung.userns, Rung.userns_map, Rung.netns, Rung.pidns_proc})


@pytest.mark.parametrize(("signals", "rung", "outcome", "succeeded", "cause"), [
    # Root, Debian's sysctl at 0: its own namespaces work, --disable-userns's nested one does not
    # (was: unclassified).
    (Signals(euid=0, cap_eff=ADMIN, unprivileged_userns_clone=0, max_user_namespaces=100),
     Rung.disable_userns, TrialOutcome(False, Step.bwrap,
                                       "EPERM"), AFTER_USERNS, Cause.unprivileged_userns_clone),
    # The same as root with a setuid bwrap: root is not in setuid mode (was: setuid_bwrap).
    (Signals(euid=0, cap_eff=ADMIN, unprivileged_userns_clone=0, max_user_namespaces=100, bwrap_setuid=True),
     Rung.disable_userns, TrialOutcome(False, Step.bwrap,
                                       "EPERM"), AFTER_USERNS, Cause.unprivileged_userns_clone),
    # A user, the sysctl at 0 and a setuid bwrap: bwrap's namespaces work (setuid), --disable-userns
    # cannot write the limit in setuid mode (was: unprivileged_userns_clone, also setuid_bwrap).
    (Signals(euid=1000, cap_eff=0, unprivileged_userns_clone=0, max_user_namespaces=100, bwrap_setuid=True),
     Rung.disable_userns, TrialOutcome(False, Step.bwrap, "EACCES"), frozenset({Rung.netns, Rung.pidns_proc}),
     Cause.setuid_bwrap),
])
def test_the_causes_the_lab_proved(signals: Signals, rung: Rung, outcome: TrialOutcome, succeeded: frozenset,
                                   cause: Cause) -> None:
    got = classify(signals, rung, outcome, succeeded=succeeded,
                   earlier_failed=None if Rung.userns in succeeded else Rung.userns)
    assert (got.verdict, got.cause) == (Verdict.denied, cause), got
    assert Cause.setuid_bwrap not in got.also or signals.euid != 0, got


def test_a_root_run_is_never_in_setuid_mode() -> None:
    s = Signals(euid=0, cap_eff=ADMIN, bwrap_setuid=True, max_user_namespaces=100)
    got = classify(s, Rung.netns, TrialOutcome(False, Step.bwrap, "EPERM"),
                   succeeded=frozenset({Rung.userns}))
    assert Cause.setuid_bwrap not in (got.cause, *got.also), got


def test_the_systemd_guests_adapter_launches_get_the_accelerators_launch_timeout(tmp_path: Path) -> None:
    """The adapter leg ran each launch with the witness's native 30 s: beside two busy loops a TCG
    guest's launches ran out (issue 28). The host now passes the VM mode's timeout for the accelerator,
    and the lab script hands it to the witness as its per-launch --launch-timeout."""
    import importlib.util
    import sys

    args = guest_args(systemd_args("u"), out=tmp_path / "out", work=tmp_path, accel=vm.Accel.tcg)
    seconds = float(args[args.index("--launch-timeout") + 1])
    assert seconds == vm_mode.LAUNCH_TIMEOUT[vm.Accel.tcg] > 30.0, args
    assert "{out}" not in args and str(tmp_path / "out") in args
    # A placeholder inside a word is filled too (the container boot's "{work}/image.tar").
    assert guest_args(["{work}/image.tar"], out=tmp_path, work=tmp_path, accel=vm.Accel.tcg) == [
        f"{tmp_path}/image.tar"]
    spec = importlib.util.spec_from_file_location("systemd_host", LAB / "systemd_host.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    saved = list(sys.path)
    try:
        spec.loader.exec_module(script)  # it puts LAB on sys.path for its `guest` helpers
    finally:
        sys.path[:] = saved
        sys.modules.pop("guest", None)
    argv = script.adapter_argv("/cli", "/out", seconds)
    assert argv[:4] == ["/cli", "witness", "--adapter", "systemd-run"]
    assert float(argv[argv.index("--launch-timeout") + 1]) == seconds, argv


@pytest.mark.parametrize(("model", "seconds"), [
    ("QEMU TCG CPU version 2.5+", 120.0),  # qemu -accel tcg -cpu max: the lab's guest
    ("Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", 30.0),  # KVM's -cpu host, and a native host
])
def test_a_witness_with_no_timeout_given_gives_a_tcg_guests_launches_the_vm_modes_time(
    tmp_path: Path, model: str, seconds: float
) -> None:
    """`run --delegate` in the systemd guest passes no per-launch timeout: its launches ran out at the
    native 30 s (issue 28). The default now reads the CPU's model, as the VM mode's table has it."""
    from sandbox_conformance.conformance import settings

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: {model}\n")
    assert settings.default_timeout(cpuinfo) == seconds
    assert vm_mode.LAUNCH_TIMEOUT[vm.Accel.tcg] == settings.TCG_LAUNCH_TIMEOUT
    assert settings.default_timeout(tmp_path / "none") == settings.LAUNCH_TIMEOUT
