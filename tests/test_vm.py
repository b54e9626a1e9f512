"""The VM mode: image building and the host-side plumbing (unit), then one real boot that checks what the
mode promises (integration: one VM for all of it, since this host only offers TCG)."""

from __future__ import annotations

import contextlib
import io
import json
import lzma
import os
import pwd
import re
import shutil
import stat
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from sandbox_conformance.processes import owner
from sandbox_conformance.processes.children import Completed
from sandbox_conformance.runners.progress import Progress, result_word
from sandbox_conformance.runners.vm import image as vm_image
from sandbox_conformance.runners.vm import mode as vm_mode
from sandbox_conformance.runners.vm import qemu as vm
from sandbox_conformance.runners.vm import suite as vm_suite
from sandbox_conformance.runners.vm.image import (
    ImageNotBuilt,
    VmImage,
    elf_has_interpreter,
    extract_vmlinux,
    kernel_version_of,
    modinfo_field,
    module_order,
    newc_archive,
    parse_meta_depends,
)
from sandbox_conformance.runners.vm.qemu import (
    Accel,
    VmResult,
    VmUnusable,
    check_workdir,
    kernel_cmdline,
    qemu_argv,
    run_in_vm,
)
from sandbox_conformance.runners.witness_args import WitnessOptions

# The VM tier's oracle: run inside the guest under `python3 -I -S`, it reports what it saw as JSON.
SELFCHECK = Path(__file__).resolve().with_name("vm_selfcheck.py")

# ---------------------------------------------------------------- image: pure parts


def test_the_kernel_package_is_read_from_the_meta_package_dependency():
    out = "linux-image-amd64\n  Depends: linux-image-6.1.0-57-amd64\n"
    assert parse_meta_depends(out) == "linux-image-6.1.0-57-amd64"
    assert parse_meta_depends("linux-image-amd64\n") is None


def test_the_cloud_kernel_is_refused_because_it_has_no_9p():
    assert kernel_version_of("linux-image-6.1.0-57-amd64") == "6.1.0-57-amd64"
    with pytest.raises(ImageNotBuilt, match="no 9p"):
        kernel_version_of("linux-image-6.1.0-57-cloud-amd64")
    with pytest.raises(ImageNotBuilt):
        kernel_version_of("busybox-static")


def test_modinfo_depends_is_read_from_the_module_bytes():
    ko = b"\x7fELF junk\x00license=GPL\x00depends=9pnet,fscache,netfs\x00name=9p\x00"
    assert modinfo_field(ko, "depends") == "9pnet,fscache,netfs"
    assert modinfo_field(ko, "name") == "9p"
    assert modinfo_field(ko, "vermagic") is None


def test_modules_load_after_their_dependencies_each_once():
    deps = {"9p": ["9pnet", "fscache", "netfs"], "9pnet": [], "fscache": ["netfs"], "netfs": [],
            "9pnet_virtio": ["virtio", "9pnet", "virtio_ring"], "virtio": ["virtio_ring"], "virtio_ring": []}
    order = module_order(["9pnet_virtio", "9p"], deps)
    assert sorted(order) == sorted(deps)
    for mod, needs in deps.items():
        assert all(order.index(n) < order.index(mod) for n in needs), (mod, order)


def test_a_missing_or_cyclic_module_is_an_error():
    with pytest.raises(ImageNotBuilt, match="not found"):
        module_order(["9p"], {"9p": ["netfs"]})
    with pytest.raises(ImageNotBuilt, match="cycle"):
        module_order(["a"], {"a": ["b"], "b": ["a"]})


def test_the_vmlinux_is_found_inside_an_xz_bzimage():
    elf = b"\x7fELF" + os.urandom(64)
    bz = b"MZ setup code \xfd7zXZ\x00 not a stream " + lzma.compress(elf, format=lzma.FORMAT_XZ) + b"tail"
    assert extract_vmlinux(bz) == elf
    assert extract_vmlinux(b"MZ" + lzma.compress(b"not an elf", format=lzma.FORMAT_XZ)) is None


def _elf64(interp: bool) -> bytes:
    phoff, phentsize = 64, 56
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x20, phoff)
    struct.pack_into("<HH", header, 0x36, phentsize, 2)
    phdrs = struct.pack("<I52x", 1) + struct.pack("<I52x", 3 if interp else 1)  # PT_LOAD, PT_INTERP
    return bytes(header) + phdrs


def test_a_dynamically_linked_busybox_is_told_apart_from_a_static_one():
    assert elf_has_interpreter(_elf64(interp=True))
    assert not elf_has_interpreter(_elf64(interp=False))
    assert elf_has_interpreter(Path(os.path.realpath("/usr/bin/python3")).read_bytes()[:1 << 16])


def test_the_initramfs_archive_is_a_newc_cpio_that_busybox_cpio_reads(tmp_path):
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("busybox not installed (apt-get install busybox-static: scripts/vm-deps)")
    entries = vm_image.initramfs_entries(b"#!fake busybox\n", [("virtio", b"V" * 5), ("9p", b"P" * 7)])
    archive = newc_archive(entries)
    assert len(archive) % 4 == 0
    # busybox's own cpio is the independent reader: it must list and extract what we wrote.
    listing = subprocess.run([busybox, "cpio", "-t"], input=archive, capture_output=True, timeout=30)
    names = set(listing.stdout.decode().split())
    assert {"init", "bin/busybox", "bin/sh", "bin/switch_root", "modules/9p.ko", "modules.order",
            "dev/console"} <= names
    out = tmp_path / "x"
    out.mkdir()
    subprocess.run([busybox, "cpio", "-i", "-d"], input=newc_archive([e for e in entries
                   if not stat.S_ISCHR(e.mode)]), cwd=out, capture_output=True, timeout=30, check=True)
    assert (out / "modules.order").read_text() == "virtio\n9p\n"
    assert (out / "modules" / "9p.ko").read_bytes() == b"P" * 7
    assert os.readlink(out / "bin" / "switch_root") == "busybox"
    assert (out / "init").stat().st_mode & 0o111
    assert (out / "init").read_text() == vm_image.INIT_SCRIPT


def test_init_mounts_a_fresh_cgroup2_and_uses_switch_root_not_chroot():
    script = vm_image.INIT_SCRIPT
    assert re.search(r"mount -t cgroup2 -o nsdelegate cgroup2 /newroot/sys/fs/cgroup", script)
    assert "exec switch_root /newroot " in script
    commands = [line.split("#", 1)[0] for line in script.splitlines()]
    assert not any("chroot" in c.split() for c in commands)


def test_a_stale_initramfs_is_not_loaded(tmp_path):
    (tmp_path / "modules").mkdir()
    (tmp_path / "modules" / "9p.ko").write_bytes(b"P")
    (tmp_path / "vmlinux").write_bytes(b"k")
    (tmp_path / "initramfs-0000.cpio").write_bytes(b"i")
    (tmp_path / "manifest.json").write_text(json.dumps({
        "kernel_version": "6.1.0-57-amd64", "kernel": "vmlinux", "initramfs": "initramfs-0000.cpio",
        "modules": ["9p"], "wanted": list(vm_image.WANTED_MODULES)}))
    with pytest.raises(ImageNotBuilt, match="stale"):
        vm_image.load_image(tmp_path, busybox_data=b"bb")
    good = vm_image.initramfs_name(b"bb", [("9p", b"P")])
    (tmp_path / "initramfs-0000.cpio").rename(tmp_path / good)
    (tmp_path / "manifest.json").write_text(json.dumps({
        "kernel_version": "6.1.0-57-amd64", "kernel": "vmlinux", "initramfs": good, "modules": ["9p"],
        "wanted": list(vm_image.WANTED_MODULES)}))
    assert vm_image.load_image(tmp_path, busybox_data=b"bb").initramfs == tmp_path / good
    # an image built for another module list is stale too, even with a matching initramfs name
    doc = json.loads((tmp_path / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**doc, "wanted": ["9p"]}))
    with pytest.raises(ImageNotBuilt, match="stale"):
        vm_image.load_image(tmp_path, busybox_data=b"bb")


# ---------------------------------------------------------------- host side: pure parts


def test_the_kernel_command_line_forbids_cgroup_v1_and_carries_the_workdir(tmp_path):
    line = kernel_cmdline(tmp_path)
    assert "cgroup_no_v1=all" in line.split()
    assert f"sbxc_work={tmp_path}" in line.split()
    assert "panic=-1" in line.split()


@pytest.mark.parametrize("bad", ["/", "/proc/x", "/run/sbxc", "/tmp/has space", "/nonexistent-h6-dir"])
def test_a_workdir_the_guest_could_not_share_is_refused(bad, tmp_path):
    if bad == "/tmp/has space":
        bad_path = tmp_path / "has space"
        bad_path.mkdir()
        bad = str(bad_path)
    with pytest.raises(VmUnusable):
        check_workdir(Path(bad))


def test_the_host_root_is_shared_read_only_and_only_the_workdir_read_write(tmp_path):
    image = VmImage("6.1.0-57-amd64", tmp_path / "vmlinux", tmp_path / "initramfs.cpio", tmp_path)
    argv = qemu_argv(image, tmp_path, Accel.tcg, console=tmp_path / "c.log")
    fsdevs = [argv[i + 1] for i, a in enumerate(argv) if a == "-fsdev"]
    assert len(fsdevs) == 2
    root = next(f for f in fsdevs if "id=hostroot" in f)
    work = next(f for f in fsdevs if "id=work" in f)
    assert "path=/," in root and "readonly=on" in root
    assert f"path={tmp_path}," in work and "readonly" not in work
    assert argv[argv.index("-accel") + 1] == "tcg"
    assert "-no-reboot" in argv


class FakeGuest:
    """Stands in for qemu: plays the guest's side of the exchange in workdir/.sbxc-vm."""

    def __init__(self, exit_code=None, stdout="", stderr="", timed_out=False, stage2_log="", events=""):
        self.exit_code, self.stdout, self.stderr = exit_code, stdout, stderr
        self.timed_out, self.stage2_log, self.events = timed_out, stage2_log, events
        self.calls: list[tuple[list[str], float]] = []
        self.request = None

    def __call__(self, argv, *, timeout, input=None, env=None, cwd=None):
        self.calls.append((list(argv), timeout))
        work = Path(re.search(r"sbxc_work=(\S+)", argv[argv.index("-append") + 1]).group(1))
        control = work / ".sbxc-vm"
        self.request = json.loads((control / "request.json").read_text())
        assert (control / "stage2.py").read_text() == vm.STAGE2.read_text()
        (control / "stdout").write_text(self.stdout)
        (control / "stderr").write_text(self.stderr)
        (control / "boot_seconds").write_text("3.5\n")
        if self.events:
            (control / "progress").write_text(self.events)
        if self.stage2_log:
            (control / "stage2.log").write_text(self.stage2_log)
        if self.exit_code is not None:
            (control / "exit_code").write_text(f"{self.exit_code}\n")
        return Completed(tuple(argv), None if self.timed_out else 0, "", "", 1.0, timed_out=self.timed_out)


@pytest.fixture
def fake_image(tmp_path, monkeypatch):
    monkeypatch.setattr(vm.shutil, "which", lambda name: f"/usr/bin/{name}")
    d = tmp_path / "image"
    d.mkdir()
    return VmImage("6.1.0-57-amd64", d / "vmlinux", d / "initramfs.cpio", d)


def test_exit_code_and_output_come_back_and_the_exchange_is_removed(tmp_path, fake_image):
    work = tmp_path / "work"
    work.mkdir()
    guest = FakeGuest(exit_code=7, stdout="out\n", stderr="err\n")
    live = (io.StringIO(), io.StringIO())
    r = run_in_vm(["sh", "-c", "exit 7"], workdir=work, timeout=30, env={"A": "1"}, image=fake_image,
                  accel=Accel.tcg, runner=guest, live=live)
    assert (live[0].getvalue(), live[1].getvalue()) == ("out\n", "err\n")  # followed, once each
    assert (r.exit_code, r.stdout, r.stderr, r.boot_seconds, r.accel) == (7, "out\n", "err\n", 3.5, Accel.tcg)
    assert r.error is None
    assert guest.request == {"argv": ["sh", "-c", "exit 7"], "env": {"A": "1"}, "cwd": "/", "timeout": 30}
    assert guest.calls[0][1] == 30 + vm.BOOT_BUDGET
    assert not (work / ".sbxc-vm").exists()


def test_a_guest_that_never_reports_is_an_error_naming_what_it_saw(tmp_path, fake_image):
    work = tmp_path / "work"
    work.mkdir()
    r = run_in_vm(["true"], workdir=work, timeout=5, image=fake_image, accel=Accel.tcg,
                  runner=FakeGuest(stage2_log="stage2 failed: FileNotFoundError: request.json\n"))
    assert r.exit_code is None and not r.ok
    assert "never reported" in r.error and "request.json" in r.error
    r = run_in_vm(["true"], workdir=work, timeout=5, image=fake_image, accel=Accel.tcg,
                  runner=FakeGuest(timed_out=True))
    assert r.timed_out and r.exit_code is None and "killed after" in r.error


def test_kvm_is_chosen_only_when_a_trial_boot_reaches_the_guest(tmp_path, fake_image, monkeypatch):
    monkeypatch.setattr(vm, "kvm_usable_device", lambda: True)
    monkeypatch.setattr(vm, "_accel_cache", {})
    assert vm.select_accel(fake_image, runner=FakeGuest(exit_code=None, timed_out=True), env={}) is Accel.tcg
    # remembered next to the image: a second call does not boot again
    assert vm.select_accel(fake_image, runner=None, env={}) is Accel.tcg  # type: ignore[arg-type]
    monkeypatch.setattr(vm, "_accel_cache", {})
    for f in fake_image.directory.glob("accel-*"):
        f.unlink()
    trial = FakeGuest(exit_code=0)
    assert vm.select_accel(fake_image, runner=trial, env={}) is Accel.kvm
    argv, timeout = trial.calls[0]
    assert argv[argv.index("-accel") + 1] == "kvm" and timeout <= vm.KVM_TRIAL_TIMEOUT
    assert vm.select_accel(fake_image, env={"SANDBOX_CONFORMANCE_VM_ACCEL": "tcg"}) is Accel.tcg
    with pytest.raises(VmUnusable):
        vm.select_accel(fake_image, env={"SANDBOX_CONFORMANCE_VM_ACCEL": "xen"})


# ---------------------------------------------------------------- integration: one real boot


def _image_or_skip() -> VmImage:
    if os.geteuid() != 0:
        pytest.skip("the VM tier runs as root (qemu's 9p passthrough keeps host owners only as root)")
    if shutil.which(vm.QEMU) is None:
        pytest.skip(f"{vm.QEMU} not installed: run scripts/vm-deps")
    try:
        return vm_image.ensure_image()
    except ImageNotBuilt as e:
        pytest.skip(f"no VM image: {e}")



@pytest.fixture(scope="session")
def vm_run(tmp_path_factory, test_user) -> tuple[VmResult, dict, list[str]]:
    image = _image_or_skip()
    work = tmp_path_factory.mktemp("vm")
    result = run_in_vm(["/usr/bin/python3", "-I", "-S",
                        str(SELFCHECK), "--user", test_user],
                       workdir=work, timeout=600, image=image)
    leftover = vm.qemu_pids(str(work))
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        report = {}
    print(f"\nVM self-check: accel={result.accel} boot={result.boot_seconds}s "
          f"wall={result.wall_seconds:.1f}s")
    return result, report, leftover


def _report(vm_run) -> dict:
    result, report, _ = vm_run
    assert result.exit_code == 0, (result.error, result.stderr[-2000:], result.console[-2000:])
    return report


@pytest.mark.integration
@pytest.mark.timeout(900)
class TestInsideTheVm:
    def test_the_guest_ran_and_left_no_qemu_behind(self, vm_run):
        result, _, leftover = vm_run
        assert result.exit_code == 0, (result.error, result.stderr[-2000:], result.console[-2000:])
        assert result.boot_seconds is not None and result.boot_seconds < vm.BOOT_BUDGET
        assert leftover == []

    def test_cgroup2_is_the_only_hierarchy(self, vm_run):
        h = _report(vm_run)["hierarchy"]
        assert h["proc_self_cgroup"] == ["0::/"]
        assert h["cgroup_mounts"] == [["/sys/fs/cgroup", "cgroup2"]]

    def test_loopback_is_up_so_the_network_witnesses_are_not_vacuous(self, vm_run):
        lo = _report(vm_run)["loopback"]
        assert (lo.get("connect"), lo.get("up")) == ("ok", True), lo

    def test_an_interface_besides_lo_exists_so_a_shared_netns_would_show(self, vm_run):
        assert "dummy0" in _report(vm_run)["loopback"]["interfaces"]

    def test_the_root_offers_the_memory_and_pids_controllers(self, vm_run):
        assert {"memory", "pids"} <= set(_report(vm_run)["hierarchy"]["controllers"])

    def test_cgroup_setup_proved_a_delegated_root(self, vm_run):
        setup = _report(vm_run)["setup"]
        assert setup.get("root") == "/sys/fs/cgroup/tasks", setup

    def test_an_allocation_past_memory_max_is_oom_killed_and_counted(self, vm_run):
        oom = _report(vm_run)["oom"]
        assert oom.get("memory_max") == str(32 << 20), oom
        assert oom["returncode"] == -9, oom  # SIGKILL from the OOM killer
        assert oom["memory_events"]["oom_kill"] >= 1, oom

    def test_without_memory_max_the_same_allocation_survives(self, vm_run):
        control = _report(vm_run)["oom_control"]
        assert control.get("memory_max") == "max", control
        assert control["returncode"] == 0 and control["stdout"] == str(200 << 20), control
        assert control["memory_events"].get("oom_kill", 0) == 0, control

    def test_forking_past_pids_max_fails_with_eagain(self, vm_run):
        pids = _report(vm_run)["pids"]
        assert pids.get("refused") == "EAGAIN", pids
        assert pids["forked"] == pids["pids_max"] - 1, pids  # the forker itself holds one pid
        assert pids["pids_events"].get("max", 0) >= 1, pids

    def test_without_pids_max_every_fork_succeeds(self, vm_run):
        control = _report(vm_run)["pids_control"]
        assert control.get("refused") is None and control["forked"] == 64, control

    def test_cgroup_kill_reaps_a_whole_tree(self, vm_run):
        kill = _report(vm_run)["kill"]
        assert len(kill.get("before", [])) == 5, kill
        assert kill["method"] == "cgroup.kill"
        assert kill["after"] == [] and kill["alive_after"] == [], kill

    def test_bwrap_creates_a_user_namespace_as_the_unprivileged_user(self, vm_run, test_user):
        bwrap = _report(vm_run)["bwrap"]
        inside = bwrap.get("inside")
        assert bwrap.get("returncode") == 0 and inside, bwrap
        uid = pwd.getpwnam(test_user).pw_uid
        assert inside["euid"] == uid
        assert inside["uid_map"][0] == str(uid), inside  # the user keeps its own uid inside
        assert inside["userns"] != bwrap["outer_userns"]

    def test_the_task_reads_its_own_leaf_in_proc_self_cgroup(self, vm_run):
        bwrap = _report(vm_run)["bwrap"]
        assert bwrap["inside"]["cgroup"] == [f"0::{bwrap['leaf']}"], bwrap

    def test_a_neighbour_leaf_is_not_writable_from_inside(self, vm_run):
        bwrap = _report(vm_run)["bwrap"]
        assert bwrap["inside"]["neighbour_write"] in ("EROFS", "EACCES", "EPERM"), bwrap
        assert bwrap["neighbour_memory_max"] == str(256 << 20)

    def test_every_leaf_was_removed(self, vm_run):
        assert _report(vm_run)["leftover_leaves"] == []


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_hung_guest_command_is_stopped_at_its_timeout_and_qemu_exits(tmp_path, root_only):
    image = _image_or_skip()
    r = run_in_vm(["sh", "-c", "echo started; sleep 600"], workdir=tmp_path, timeout=3, image=image)
    assert r.exit_code == 124, (r.error, r.console[-1000:])
    assert r.stdout == "started\n"
    # Each boot that hung is killed at BOOT_BUDGET and booted once more (seen in a loaded CI run: one
    # hung boot, 75 s in all); the command itself is stopped at its 3 s, never its 600.
    assert r.wall_seconds < 3 + vm.BOOT_BUDGET * (1 + r.hung_boots), (r.hung_boots, r.boot_seconds)
    assert vm.qemu_pids(str(tmp_path)) == []


# ---------------------------------------------------------------- run --mode vm: host and guest drivers


def test_the_vm_runs_root_and_the_unprivileged_user_as_two_legs():
    assert vm_mode.legs(WitnessOptions(), passwd=lambda name: object()) == ["root", "sbxc-test:sbxc-test"]

    def nobody(name):
        raise KeyError(name)

    assert vm_mode.legs(WitnessOptions(), passwd=nobody) == ["root"]
    assert vm_mode.legs(WitnessOptions(as_user="alice"), passwd=nobody) == ["alice:alice"]


def test_the_guest_gets_our_settings_but_never_a_cgroup_root_of_ours():
    env = vm_mode.guest_env({"SANDBOX_CONFORMANCE_REQUIRE": "1", "SANDBOX_CONFORMANCE_CGROUP_ROOT": "/x",
                             "SANDBOX_CONFORMANCE_MODE": "vm", "AWS_SECRET_ACCESS_KEY": "s", "PATH": "/bin"})
    assert env["SANDBOX_CONFORMANCE_REQUIRE"] == "1"
    assert "SANDBOX_CONFORMANCE_CGROUP_ROOT" not in env and "SANDBOX_CONFORMANCE_MODE" not in env
    assert "AWS_SECRET_ACCESS_KEY" not in env
    assert env["HOME"] == "/root"


def test_inputs_are_copied_into_the_share_and_reports_come_back_per_leg(tmp_path):
    profile = tmp_path / "p.toml"
    profile.write_text("x = 1\n")
    work = tmp_path / "work"
    work.mkdir()
    opts, reports = vm_mode.inside_options(
        WitnessOptions(profile=str(profile), json=str(tmp_path / "out" / "r.json"), as_user="bob"), work)
    assert Path(opts.profile).parent == work and Path(opts.profile).read_text() == "x = 1\n"
    assert opts.as_user is None  # the leg says who, not the options
    assert opts.json == str(work / "out-report-{label}.json")
    assert reports == {str(work / "out-report-{label}.json"): str(tmp_path / "out" / "r-{label}.json")}
    argv = vm_mode.guest_argv(opts, leg_specs=["root", "u:u"], summary=work / "s.json", timeout=60,
                              python="/venv/bin/python")
    assert argv[:3] == ["/venv/bin/python", "-m", "sandbox_conformance.runners.vm.suite"]
    assert argv[argv.index("--") + 1:] == opts.argv()
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--leg"] == ["root", "u:u"]
    assert "--controls" not in argv
    argv = vm_mode.guest_argv(opts, leg_specs=["root"], summary=work / "s.json", timeout=60,
                              controls=("limits_dropped", "ipc_shared"), controls_json=work / "c.json")
    head = argv[:argv.index("--")]
    assert head[head.index("--controls") + 1] == "limits_dropped,ipc_shared"
    assert head[head.index("--controls-json") + 1] == str(work / "c.json")
    assert argv[argv.index("--") + 1:] == opts.argv()


@pytest.mark.parametrize(("codes", "want"), [([0, 0], 0), ([0, 1], 1), ([75, 0], 75), ([2, 75], 2),
                                             ([None, 0], 1), ([], 1), ([1, 2], 1)])
def test_the_legs_combine_into_one_exit_code_as_container_mode_does(codes, want):
    assert vm_suite.combine(codes) == want
    assert vm_suite.parse_leg("root") == ("root", None)
    assert vm_suite.parse_leg("sbxc:sbxc-test") == ("sbxc", "sbxc-test")


CGROUP_WITNESSES = (
    "test_the_task_runs_in_its_own_cgroup_leaf",
    "test_an_allocation_past_memory_max_is_oom_killed",
    "test_forking_past_pids_max_fails_with_eagain",
    "test_a_task_tree_is_reaped_whole_by_cgroup_kill",
    "test_a_neighbour_tasks_leaf_is_not_writable_from_inside",
)


def _junit_outcomes(path: Path) -> dict[str, str]:
    import xml.etree.ElementTree as ET

    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
        out[case.get("name", "")] = kinds[0] if kinds else "passed"
    return out


@pytest.fixture(scope="session")
def vm_suite_run(tmp_path_factory, test_user):
    """ONE boot for `run --mode vm`: the witness suite as root and as the unprivileged user with the
    require switch, then the cgroup negative controls, in the same guest (runners/vm/suite.py)."""
    _image_or_skip()
    out = tmp_path_factory.mktemp("vm-suite")
    # Only this process's workdirs (named with its stamp, processes/owner.py): another run on the machine
    # makes and removes its own meanwhile.
    ours = f"sbxc-vm.{owner.stamp()}*"
    before = set(Path("/var/tmp").glob(ours))
    said: list[str] = []
    started = time.monotonic()
    # Progress on a real pseudo-terminal (its own isatty() turns it on), drained as it is written.
    tty = _PtyStream()
    code = vm_mode.run_vm(WitnessOptions(json=str(out / "report.json"), junitxml=str(out / "junit.xml")),
                          timeout=600, say=said.append, environ={"SANDBOX_CONFORMANCE_REQUIRE": "1"},
                          controls=("limits_dropped", "leaf_not_entered", "cgroup_tree_bound"),
                          controls_json=str(out / "controls.json"), progress=Progress("p", stream=tty.stream))
    progress = tty.close()
    wall = time.monotonic() - started
    print(f"\nVM suite + controls: exit {code}, wall {wall:.1f}s: {said}\n{progress}")
    leftover = set(Path("/var/tmp").glob(ours)) - before
    return {"code": code, "said": said, "out": out, "leftover": leftover, "user": test_user,
            "progress": progress}


class _PtyStream:
    """A text stream on a pseudo-terminal's slave; a thread reads the master until close()."""

    def __init__(self):
        import pty

        self.master, slave = pty.openpty()
        self.stream = os.fdopen(slave, "w")
        self.chunks: list[bytes] = []
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self):
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO once the slave is closed (pty(7))
                return
            if not data:
                return
            self.chunks.append(data)

    def close(self) -> str:
        self.stream.close()
        self.thread.join(timeout=10)
        os.close(self.master)
        return b"".join(self.chunks).decode(errors="replace").replace("\r\n", "\n")


@pytest.mark.integration
@pytest.mark.timeout(1500)
class TestRunModeVm:
    def test_the_suite_passes_under_the_require_switch_in_both_legs(self, vm_suite_run):
        assert vm_suite_run["code"] == 0, vm_suite_run["said"]
        for label in ("root", vm_suite_run["user"]):
            doc = json.loads((vm_suite_run["out"] / f"report-{label}.json").read_text())
            assert doc["exit"] == 0 and doc["summary"]["kept"] > 0, doc["summary"]
            assert doc["summary"]["not_tested"] == 0, doc["summary"]
        assert any(s.startswith("vm: as root: exit 0") for s in vm_suite_run["said"]), vm_suite_run["said"]

    def test_the_cgroup_witnesses_ran_and_passed_not_skipped(self, vm_suite_run):
        for label in ("root", vm_suite_run["user"]):
            cases = _junit_outcomes(vm_suite_run["out"] / f"junit-{label}.xml")
            assert {name: cases.get(name) for name in CGROUP_WITNESSES} == dict.fromkeys(
                CGROUP_WITNESSES, "passed"), (label, cases)

    def test_the_limits_the_host_saw_match_what_the_task_saw(self, vm_suite_run):
        # An independent look at the same run: the leaf's counters on the guest's host side.
        doc = json.loads((vm_suite_run["out"] / f"report-{vm_suite_run['user']}.json").read_text())
        [task] = doc["tasks"]
        cg, obs = task["cgroup"], task["observations"]
        assert obs["memory_trial"]["signal"] == 9 and cg["memory_events"]["oom_kill"] >= 1, (obs, cg)
        assert obs["pids_trial"]["refused"] == "EAGAIN" and cg["pids_events"]["max"] >= 1, (obs, cg)
        assert cg["kill"]["method"] == "cgroup.kill" and cg["kill"]["alive_after"] == [], cg["kill"]
        sessions = {v["sid"] for v in cg["kill"]["before"] if v["pidns"] == obs["namespaces"]["pid"]}
        assert len(sessions) >= 2, cg["kill"]  # the setsid grandchild really left the task's session

    def _control(self, vm_suite_run, name):
        doc = json.loads((vm_suite_run["out"] / "controls.json").read_text())
        assert doc["cgroup_root"]["usable"], doc["cgroup_root"]
        assert doc["baseline"]["problems"] == [], doc["baseline"]["problems"]
        [control] = [c for c in doc["controls"] if c["name"] == name]
        assert control["status"] == "ok", control
        return control

    def test_dropping_the_limits_turns_exactly_the_limit_witnesses_red(self, vm_suite_run):
        control = self._control(vm_suite_run, "limits_dropped")
        assert sorted(control["reddened"]) == sorted(control["must_redden"]) == sorted(
            CGROUP_WITNESSES[1:3]), control
        assert any(s.startswith("vm: controls limits_dropped,leaf_not_entered,cgroup_tree_bound: exit 0")
                   for s in vm_suite_run["said"]), vm_suite_run["said"]

    def test_a_leaf_the_task_never_enters_turns_every_cgroup_witness_but_the_neighbours_red(
            self, vm_suite_run):
        control = self._control(vm_suite_run, "leaf_not_entered")
        assert sorted(control["reddened"]) == sorted(control["must_redden"]) == sorted(
            CGROUP_WITNESSES[:4]), control

    def test_a_task_shown_the_cgroup_tree_writes_to_its_neighbours_leaf_and_goes_red(self, vm_suite_run):
        control = self._control(vm_suite_run, "cgroup_tree_bound")
        kernel = "test_the_hosts_kernel_settings_cannot_be_opened_for_writing"  # the tree's root, writable
        assert sorted(control["reddened"]) == sorted(control["must_redden"]) == sorted(
            [CGROUP_WITNESSES[4], kernel]), control

    def test_the_shared_workdir_is_gone(self, vm_suite_run):
        assert vm_suite_run["leftover"] == set()

    def test_on_a_terminal_the_boot_and_each_leg_are_stages_with_their_verdict(self, vm_suite_run):
        """Issue 15, from a real boot: the boot ends when stage 2 wrote boot_seconds (the guest's
        uptime in its result), then each step the guest's suite announced, in order, each ended."""
        stages = _stages(vm_suite_run["progress"])
        user = vm_suite_run["user"]
        controls = "vm controls"
        assert [(name, what) for name, what, _ in stages] == [
            ("vm boot", "started"), ("vm boot", "done"),
            ("vm cgroup set-up", "started"), ("vm cgroup set-up", "done"),
            ("vm as root", "started"), ("vm as root", "done"),
            (f"vm as {user}", "started"), (f"vm as {user}", "done"),
            (controls, "started"), (controls, "done")], vm_suite_run["progress"]
        results = {name: result for name, what, result in stages if what == "done"}
        assert re.fullmatch(r"(tcg|kvm), guest up \d+\.\ds", results["vm boot"]), results
        assert results["vm cgroup set-up"] == "root /sys/fs/cgroup/tasks", results
        # Each step's word is its exit as the run's summary read it from the guest (summary.json), not
        # a pass assumed: whether the suite passed is the other tests' business.
        exits = {}
        for line in vm_suite_run["said"]:
            if m := re.match(r"vm: (as \S+|controls)(?: \S+)?: exit (-?\d+|None) \(", line):
                exits["vm " + m[1]] = None if m[2] == "None" else int(m[2])
        assert set(exits) == {"vm as root", f"vm as {user}", controls}, vm_suite_run["said"]
        assert {step: results[step] for step in exits} == {s: result_word(c) for s, c in exits.items()}, \
            (results, vm_suite_run["said"])


def test_a_guest_that_hangs_before_stage2_is_killed_and_booted_once_more(tmp_path, fake_image, monkeypatch):
    """A qemu that never gets the guest to stage2 (no boot_seconds) is killed by the boot watchdog
    after BOOT_BUDGET, with its process group, and booted again; twice hung is an error saying so."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    starts = tmp_path / "starts"
    fake_qemu = bin_dir / vm.QEMU
    # Stays a shell (no exec) so its comm is the script's name, as a real qemu's is; the sleep child
    # shares its process group and must die with it.
    fake_qemu.write_text(f"#!/bin/sh\necho started >> {starts}\nsleep 600\necho not-killed >> {starts}\n")
    fake_qemu.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    monkeypatch.setattr(vm, "BOOT_BUDGET", 1.0)
    work = tmp_path / "work"
    work.mkdir()
    t0 = time.monotonic()
    loud = _Tty()
    r = run_in_vm(["true"], workdir=work, timeout=120, image=fake_image, accel=Accel.tcg,
                  progress=Progress("p", stream=loud))
    assert time.monotonic() - t0 < 30, "the watchdog did not cut the hung boot short"
    assert r.exit_code is None and "did not start the command" in r.error and "2 times" in r.error, r.error
    assert _stages(loud.getvalue()) == [
        ("vm boot", "started", ""), ("vm boot", "stopped", "no stage 2 within 1s"),
        ("vm boot (attempt 2)", "started", ""), ("vm boot (attempt 2)", "stopped", "no stage 2 within 1s")]
    assert starts.read_text().split() == ["started", "started"]
    assert not vm.qemu_pids(f"sbxc_work={work}")


# ---------------------------------------------------------------- per-launch timeout (issue 19)


def test_under_tcg_the_guest_suite_gets_a_launch_timeout_sized_for_emulation():
    """Four `run --mode vm` at once on 2 cores went red at the witness's native 30 s per launch."""
    assert vm_mode.launch_timeout(Accel.kvm) == 30.0
    assert vm_mode.launch_timeout(Accel.tcg) >= 120.0
    opts = WitnessOptions(pytest_args=("-k", "cgroup"))
    argv = vm_mode.guest_argv(opts, leg_specs=["root"], summary=Path("/s.json"), timeout=600,
                              launch_timeout=vm_mode.launch_timeout(Accel.tcg))
    head = argv[:argv.index("--")]
    assert head[head.index("--launch-timeout") + 1] == "120.0"
    # The guest driver puts it on the witness command, before any `-- PYTEST ARGS`.
    leg = vm_suite.witness_argv("root", "u", opts.argv(), launch_timeout=120.0, python="/py")
    assert leg[:4] == ["/py", "-m", "sandbox_conformance", "witness"]
    at = leg.index("--launch-timeout")
    assert leg[at + 1] == "120.0" and at < leg.index("--")
    assert leg[leg.index("--") + 1:] == ["-k", "cgroup"]
    assert "--launch-timeout" not in vm_suite.witness_argv("root", None, [], launch_timeout=None)


def test_the_guests_controls_run_one_witness_run_at_a_time_with_the_tcg_launch_timeout(monkeypatch):
    """Two at once shared the guest's two emulated CPUs and missed the launch timeout (122 s, twice)."""
    seen = []
    monkeypatch.setattr(vm_suite, "run", lambda argv, **kw: seen.append(argv) or Completed(
        tuple(argv), 0, "{}", "", 1.0))
    summary = {}
    vm_suite.run_controls("limits_dropped", None, env={}, timeout=600, summary=summary, launch_timeout=120.0)
    [argv] = seen
    assert argv[argv.index("--jobs") + 1] == "1"
    assert argv[argv.index("--launch-timeout") + 1] == "120.0"
    assert summary["controls"]["returncode"] == 0


def test_run_vm_hands_the_guest_the_launch_timeout_of_the_accelerator_it_boots(tmp_path, monkeypatch):
    booted: list[list[str]] = []

    def fake_run_in_vm(argv, **kw):
        booted.append(list(argv))
        return VmResult(0, "", "", 3.0, 5.0, Accel.tcg)

    image = VmImage("6.1.0-57-amd64", tmp_path / "k", tmp_path / "i", tmp_path)
    monkeypatch.setattr(vm_image, "ensure_image", lambda: image)
    monkeypatch.setattr(vm_mode, "cached_image", lambda: None)  # not the host's cache: the image above
    monkeypatch.setattr(vm, "select_accel", lambda image: Accel.tcg)
    monkeypatch.setattr(vm, "run_in_vm", fake_run_in_vm)
    code = vm_mode.run_vm(WitnessOptions(), timeout=600, say=lambda s: None, environ={})
    assert code == 0
    [argv] = booted
    head = argv[:argv.index("--")]
    assert head[head.index("--launch-timeout") + 1] == str(vm_mode.launch_timeout(Accel.tcg))


# ---------------------------------------------------------------- systemd guests, seeds, the initramfs


def test_a_systemd_guest_boots_its_own_target_with_the_hosts_services_kept_down(tmp_path):
    guest = vm.SystemdGuest()
    args = guest.kernel_args()
    assert "sbxc_init=systemd" in args and f"systemd.unit={guest.TARGET}" in args and "fstab=no" in args
    masked = {a.split("=", 1)[1] for a in args if a.startswith("systemd.mask=")}
    assert {"docker.socket", "docker.service", "systemd-hwdb-update.service"} <= masked
    units = guest.units(tmp_path)
    service = units[f"/etc/systemd/system/{guest.SERVICE}"]
    assert f"ExecStart=/usr/bin/python3 -I -S {tmp_path}/{vm.CONTROL}/stage2.py {tmp_path}" in service
    target = units[f"/etc/systemd/system/{guest.TARGET}"]
    assert "Requires=basic.target" in target and guest.SERVICE in target and "multi-user" not in target
    # /tmp is the host's (a CI clone may live there): never emptied at boot.
    assert units["/etc/tmpfiles.d/tmp.conf"].split() == ["d", "/tmp", "1777", "root", "root", "-"]


def test_seed_files_and_the_systemd_switch_reach_the_guest(tmp_path, fake_image):
    work = tmp_path / "work"
    work.mkdir()
    seen: dict[str, str] = {}

    class Guest(FakeGuest):
        def __call__(self, argv, **kw):
            control = work / ".sbxc-vm"
            seen.update({str(p.relative_to(control / "root")): p.read_text()
                         for p in (control / "root").rglob("*") if p.is_file()})
            seen["-append"] = argv[argv.index("-append") + 1]
            return super().__call__(argv, **kw)

    guest = Guest(exit_code=0)
    r = run_in_vm(["true"], workdir=work, timeout=30, image=fake_image, accel=Accel.tcg, runner=guest,
                  seed={"/etc/x.toml": "a = 1\n"}, systemd=vm.SystemdGuest(boot_budget=99.0))
    assert r.exit_code == 0
    assert seen["etc/x.toml"] == "a = 1\n" and f"etc/systemd/system/{vm.SystemdGuest.SERVICE}" in seen
    assert "sbxc_init=systemd" in seen["-append"].split()
    assert guest.calls[0][1] == 30 + 99.0  # the systemd boot's own budget
    assert not (work / ".sbxc-vm").exists()


def test_init_unmounts_its_own_proc_before_switch_root():
    """Left mounted under the new root, the initramfs' /proc counted as a fully visible procfs
    (mnt_already_visible walks every mount of the namespace): a masked /proc never refused a fresh
    procfs in the guest (seen on the first lab boot: pidns.proc supported under a masked file)."""
    lines = [line.split("#", 1)[0].strip() for line in vm_image.INIT_SCRIPT.splitlines()]
    for target in ("/newroot /usr/bin/python3", "/newroot /lib/systemd/systemd"):
        at = next(i for i, line in enumerate(lines) if line.startswith(f"exec switch_root {target}"))
        assert any(line.startswith("umount /proc") for line in lines[:at][-6:]), target
    assert "cp" in vm_image.APPLETS and "rm" in vm_image.APPLETS


def test_a_stale_initramfs_is_rebuilt_from_the_cached_kernel_without_a_download(tmp_path):
    busybox = tmp_path / "busybox"
    busybox.write_bytes(_elf64(interp=False))
    d = tmp_path / "6.1.0-57-amd64"
    (d / "modules").mkdir(parents=True)
    (d / "modules" / "9p.ko").write_bytes(b"P")
    (d / "vmlinux").write_bytes(b"k")
    (d / "initramfs-0000.cpio").write_bytes(b"old")
    (d / "manifest.json").write_text(json.dumps({
        "kernel_version": "6.1.0-57-amd64", "kernel": "vmlinux", "initramfs": "initramfs-0000.cpio",
        "modules": ["9p"], "wanted": list(vm_image.WANTED_MODULES)}))
    image = vm_image.refresh_initramfs(d, busybox=busybox)
    assert image is not None and image.kernel == d / "vmlinux"
    assert image.initramfs.name == vm_image.initramfs_name(busybox.read_bytes(), [("9p", b"P")])
    assert vm_image.INIT_SCRIPT.encode() in image.initramfs.read_bytes()
    assert (d / "initramfs-0000.cpio").exists()  # a run that loaded it a moment ago may still boot it
    # Another module list cannot be refreshed: that needs the kernel package again.
    doc = json.loads((d / "manifest.json").read_text())
    (d / "manifest.json").write_text(json.dumps({**doc, "wanted": ["9p"]}))
    assert vm_image.refresh_initramfs(d, busybox=busybox) is None


# ---------------------------------------------------------------- progress on a terminal (issue 15)


class _Tty(io.StringIO):
    def isatty(self):
        return True


def _stages(text):
    """(stage, started|done|stopped, result) for each line of a Progress named "p"; heartbeats dropped."""
    out = []
    for line in text.replace("\r\n", "\n").splitlines():
        m = re.fullmatch(r"p: (.+?): (?:(started)|(done|stopped) (?:in|after) \d+\.\ds(?: \((.*)\))?)", line)
        assert m or line.endswith(" so far"), line
        if m:
            out.append((m[1], m[2] or m[3], m[4] or ""))
    return out


def _events(*events):
    return "".join(json.dumps(e) + "\n" for e in events)


GUEST_EVENTS = _events({"begin": "vm cgroup set-up"}, {"end": "vm cgroup set-up", "result": "root /x"},
                       {"begin": "vm as root"}, {"end": "vm as root", "result": "PASS"},
                       {"begin": "vm as sbxc-test"}, {"end": "vm as sbxc-test", "result": "FAIL"})
GUEST_STAGES = [("vm boot", "started", ""), ("vm boot", "done", "tcg, guest up 3.5s"),
                ("vm cgroup set-up", "started", ""), ("vm cgroup set-up", "done", "root /x"),
                ("vm as root", "started", ""), ("vm as root", "done", "PASS"),
                ("vm as sbxc-test", "started", ""), ("vm as sbxc-test", "done", "FAIL")]


def test_the_boot_and_what_the_guest_announces_are_stages_in_order(tmp_path, fake_image):
    work = tmp_path / "work"
    work.mkdir()
    loud = _Tty()
    progress = Progress("p", stream=loud, clock=iter(range(1000)).__next__)
    r = run_in_vm(["true"], workdir=work, timeout=30, image=fake_image, accel=Accel.tcg, progress=progress,
                  runner=FakeGuest(exit_code=1, events=GUEST_EVENTS))
    assert r.exit_code == 1
    assert _stages(loud.getvalue()) == GUEST_STAGES
    # A leg the guest began and never ended (killed at its timeout) says so when the VM is gone.
    loud = _Tty()
    run_in_vm(["true"], workdir=work, timeout=30, image=fake_image, accel=Accel.tcg,
              progress=Progress("p", stream=loud),
              runner=FakeGuest(timed_out=True, events=_events({"begin": "vm as root"})))
    assert _stages(loud.getvalue())[-2:] == [("vm as root", "started", ""),
                                             ("vm as root", "stopped", "the VM ended")]


def test_the_stages_reach_a_real_terminal_and_never_a_pipe(tmp_path, fake_image):
    """The same fake run with stderr on a pseudo-terminal, then on a pipe: the gate is the stream's own
    isatty(), nothing we tell it."""
    import pty

    work = tmp_path / "work"
    work.mkdir()
    got = {}
    for kind in ("pty", "pipe"):
        r, w = pty.openpty() if kind == "pty" else os.pipe()
        with os.fdopen(w, "w") as stream:
            run_in_vm(["true"], workdir=work, timeout=30, image=fake_image, accel=Accel.tcg,
                      progress=Progress("p", stream=stream),
                      runner=FakeGuest(exit_code=0, events=GUEST_EVENTS))
        os.set_blocking(r, False)
        chunks = []
        with contextlib.suppress(BlockingIOError, OSError):
            while data := os.read(r, 65536):
                chunks.append(data)
        os.close(r)
        got[kind] = b"".join(chunks).decode()
    assert _stages(got["pty"]) == GUEST_STAGES
    assert got["pipe"] == ""


def test_the_guest_suites_events_read_back_as_stages_even_split_mid_line(tmp_path):
    path = tmp_path / "progress"
    events = vm_suite.Events({vm_suite.PROGRESS_ENV: str(path)})
    events.begin("vm as root")
    events.end("vm as root", "PASS")
    data = path.read_bytes()
    assert [json.loads(ln) for ln in data.splitlines()] == [{"begin": "vm as root"},
                                                             {"end": "vm as root", "result": "PASS"}]
    loud = _Tty()
    host = vm._Events(Progress("p", stream=loud))
    booted = []
    host.booted = lambda: booted.append(1)
    for i in range(len(data)):  # a byte at a time: only whole lines count
        host.feed(data[i:i + 1])
    assert _stages(loud.getvalue()) == [("vm as root", "started", ""), ("vm as root", "done", "PASS")]
    assert booted, "an event from the command did not end the boot stage first"
    vm_suite.Events({}).begin("vm as root")  # outside the VM: no file, no error


def test_the_image_build_is_a_stage_only_when_the_image_is_not_cached(tmp_path, monkeypatch):
    image = VmImage("6.1.0-57-amd64", tmp_path / "k", tmp_path / "i", tmp_path)
    monkeypatch.setattr(vm_image, "ensure_image", lambda: image)
    for cached, want in ((image, []), (None, [("vm image build", "started", ""),
                                              ("vm image build", "done", "6.1.0-57-amd64")])):
        monkeypatch.setattr(vm_mode, "cached_image", lambda cached=cached: cached)
        loud = _Tty()
        assert vm_mode.prepare_image(Progress("p", stream=loud)) is image
        assert _stages(loud.getvalue()) == want


def test_the_guests_output_is_copied_in_whole_lines_so_progress_never_splits_one(tmp_path):
    control = tmp_path
    out, err = _Tty(), _Tty()
    follow = vm._Follow(control, (out, err))
    try:
        with open(control / "stderr", "ab") as f:
            f.write(b"pid: ke")
            f.flush()
            time.sleep(0.8)  # two polls: the half line must wait
            assert err.getvalue() == ""
            f.write(b"pt\nlast, no newline")
    finally:
        follow.stop()
    assert err.getvalue() == "pid: kept\nlast, no newline" and out.getvalue() == ""


def test_run_vm_names_each_legs_report_once_it_is_copied_back(tmp_path, monkeypatch):
    """The run's verdict document reads its legs from the host's copies (runners/orchestrate.py)."""

    def fake_run_in_vm(argv, **kw):
        guest = argv[argv.index("--json") + 1]  # the guest's witness argument, `{label}` in it
        Path(guest.replace("{label}", "root")).write_text('{"version": 1}\n')
        return VmResult(0, "", "", 3.0, 5.0, Accel.tcg)

    image = VmImage("6.1.0-57-amd64", tmp_path / "k", tmp_path / "i", tmp_path)
    monkeypatch.setattr(vm_mode, "cached_image", lambda: image)
    monkeypatch.setattr(vm, "select_accel", lambda image: Accel.tcg)
    monkeypatch.setattr(vm, "run_in_vm", fake_run_in_vm)
    told: list[tuple[str, str]] = []
    options = WitnessOptions(json=str(tmp_path / "report.json"), as_user="root")
    assert vm_mode.run_vm(options, timeout=600, say=lambda s: None, environ={},
                          leg_report=lambda label, path: told.append((label, path))) == 0
    assert told == [("root", str(tmp_path / "report-root.json"))]
    assert (tmp_path / "report-root.json").read_text() == '{"version": 1}\n'
