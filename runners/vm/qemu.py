"""VM mode: boot a clean Debian kernel under qemu with a pure cgroup v2 hierarchy, run one command inside,
bring back its exit code and output.

    result = run_in_vm(["python3", "-m", "pytest", ...], workdir=Path("/tmp/x"), timeout=900)

Why a VM: some hosts (this one: a hybrid layout, memory bound to cgroup v1) can never give a delegated
v2 subtree, natively or in a container, so the cgroup witnesses could never run there.

Shape of a run (one VM per run, never per test: under TCG, fork- and namespace-heavy work is 5x-60x
slower than native):
- the image (runners/vm/image.py): Debian's generic kernel + an initramfs of static busybox and the
  virtio/9p/overlay/dummy modules, cached outside the repo;
- the guest's root is the host's `/` exported read-only over virtio-9p (qemu's readonly=on, so even
  guest root cannot write the host), under a tmpfs overlay: python3, bwrap, the venv and /etc/passwd
  (with sbxc-test) are the host's, and the guest can write anywhere without it reaching the host;
- `workdir` is the one read-write share, mounted at the same path inside, so paths in arguments mean
  the same on both sides; the exchange lives in workdir/.sbxc-vm/ (runners/vm/stage2.py);
- a fresh cgroup2 mount (nsdelegate) and `cgroup_no_v1=all`: cgroup2 is the only hierarchy;
- no NIC, so no way out: `lo` is brought up by stage 2 and `dummy0` exists (both so the network
  witnesses can go red there, see stage2.loopback_up and image.WANTED_MODULES);
- or, with `systemd=SystemdGuest()`, the host's systemd as PID 1 (its own cgroup2 mount, logind,
  user managers) and stage 2 as one of its services: the shape of most users' hosts, for the
  host-shape lab (tests/test_host_shape_lab.py).

Chosen over virtme-ng: virtme-ng wants udev and real KVM (issue 5 measured about 18 s a boot here),
and this host's /dev/kvm is a paravirtual KVM under which stock kernels die with "KVM internal error
... emulation failure"; our own initramfs boots in about 4 s under plain TCG and needs only
qemu-system-x86 and busybox-static from apt. KVM is used where a trial boot proves it works
(`select_accel`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from sandbox_conformance.processes import owner
from sandbox_conformance.processes.children import Completed, Runner, minimal_env, run
from sandbox_conformance.processes.exits import Refusal
from sandbox_conformance.runners.progress import HEARTBEAT, Progress, Stage
from sandbox_conformance.runners.vm import image as vm_image
from sandbox_conformance.runners.vm.image import VmImage
from sandbox_conformance.runners.vm.stage2 import BOOT_FILE, PROGRESS_FILE

QEMU = "qemu-system-x86_64"
CONTROL = ".sbxc-vm"  # the exchange directory inside workdir
STAGE2 = Path(__file__).with_name("stage2.py")
# qemu start + kernel + initramfs + switch_root: ~4 s under TCG here; the margin covers a loaded host.
BOOT_BUDGET = 60.0
BOOT_ATTEMPTS = 2  # a guest that hangs before stage2 gets one more boot
KVM_TRIAL_TIMEOUT = 10.0  # a working KVM boots in about a second; a broken one hangs in qemu
# python + pytest + bwrap need ~1 GB; the reference profile promises memory.max=512M, and an OOM
# witness allocating past that must meet the leaf's limit, not the VM's. Guest RAM is only backed on
# the host as the guest touches it.
MEMORY_MB = 2048
# Paths the guest's own mounts cover (the kernel's proc/sys/dev, an empty /run): a workdir there would
# be hidden behind them, or would expose host state.
_HIDDEN = ("/proc", "/sys", "/dev", "/run")
_SAFE_PATH = re.compile(r"/[A-Za-z0-9._/+-]*")


class Accel(enum.StrEnum):
    kvm = "kvm"
    tcg = "tcg"  # qemu's software emulation: slow, but needs nothing from the host's hypervisor


class VmUnusable(Refusal):
    """The VM could not be used at all (no qemu, no image, bad workdir): one line, the Refusal's reason
    (processes/exits.py)."""


@dataclasses.dataclass(frozen=True)
class VmResult:
    exit_code: int | None  # None: the command never reported (boot failure, host-side timeout)
    stdout: str
    stderr: str
    boot_seconds: float | None  # guest uptime when the command started (kernel -> stage 2)
    wall_seconds: float  # qemu start to qemu exit, on the host
    accel: Accel
    console: str = ""  # the guest's serial console (kernel messages, /init failures)
    hung_boots: int = 0  # boots killed by the watchdog before this result's
    error: str | None = None  # one line when exit_code is None
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclasses.dataclass(frozen=True)
class SystemdGuest:
    """Boot the host's systemd as the guest's PID 1 (the host's / over 9p under a tmpfs overlay, as
    always), and run the command as a unit of it once `wants` are up: a host shaped like most users'
    (systemd, logind, user managers, a pure cgroup v2 tree that systemd itself mounts and delegates).

    The boot goes to our own target, never multi-user.target: the host's enabled services
    (databases, container engines) stay down unless listed in `wants`; `mask` keeps units down even
    when something asks for them (docker.socket would start dockerd on a probe's connect)."""

    wants: tuple[str, ...] = ("systemd-logind.service", "dbus.service")
    mask: tuple[str, ...] = (
        "docker.socket", "docker.service", "containerd.service", "timers.target",
        "systemd-timesyncd.service", "getty.target",
        # ConditionNeedsUpdate=/etc holds on a / that systemd never booted (no /etc/.updated): these
        # would rebuild the hwdb, the ld.so cache and the journal catalog, minutes under TCG.
        "systemd-hwdb-update.service", "ldconfig.service", "systemd-journal-catalog-update.service",
        "systemd-update-done.service",
        # No hardware to coldplug, and no device units are waited for (fstab=no).
        "systemd-udev-trigger.service", "systemd-udevd.service", "systemd-udevd-control.socket",
        "systemd-udevd-kernel.socket")
    # systemd + udev + journald + logind over 9p under TCG: ~20-40 s here; a loaded host, more.
    boot_budget: float = 240.0

    TARGET = "sbxc-guest.target"
    SERVICE = "sbxc-guest.service"

    def kernel_args(self) -> list[str]:
        # fstab=no: the host's /etc/fstab names the host's disks (systemd-fstab-generator(8)).
        # systemd.mask=: systemd-debug-generator(8).
        return ["sbxc_init=systemd", f"systemd.unit={self.TARGET}", "fstab=no",
                "systemd.show_status=false", *(f"systemd.mask={u}" for u in self.mask)]

    def units(self, workdir: Path) -> dict[str, str]:
        """The target and the service that runs stage 2 (not as PID 1 here: it still writes the exit
        code and powers the guest off, which is all the host waits for)."""
        wants = " ".join((*self.wants, self.SERVICE))
        target = (f"[Unit]\nDescription=sandbox-conformance VM guest\nRequires=basic.target\n"
                  f"Wants={wants}\nAfter=basic.target\nAllowIsolate=yes\n")
        after = " ".join(("basic.target", *self.wants))
        service = (f"[Unit]\nDescription=sandbox-conformance VM guest command\nAfter={after}\n"
                   f"[Service]\nType=exec\nExecStart=/usr/bin/python3 -I -S {workdir}/{CONTROL}/stage2.py "
                   f"{workdir}\nStandardOutput=journal+console\nStandardError=journal+console\n")
        return {f"/etc/systemd/system/{self.TARGET}": target, f"/etc/systemd/system/{self.SERVICE}": service,
                # Debian's tmp.conf says `D /tmp`: empty /tmp at boot. Here /tmp is the host's (a CI
                # clone, the workdir of a test may live there): keep it, as `d` does
                # (tmpfiles.d(5); a file of the same name in /etc overrides /usr/lib's). Walking the
                # host's /tmp over 9p to whiteout every entry was also most of the boot time.
                "/etc/tmpfiles.d/tmp.conf": "d /tmp 1777 root root -\n"}


# ---- pure parts ----

def check_workdir(workdir: Path) -> Path:
    """An absolute, existing directory whose path can travel on the kernel command line (no spaces or
    shell metacharacters: /init splits /proc/cmdline on whitespace) and that the guest's own mounts
    do not hide."""
    workdir = Path(os.path.realpath(workdir))
    text = str(workdir)
    if not _SAFE_PATH.fullmatch(text) or text == "/":
        raise VmUnusable(f"workdir {text!r}: must be a directory path of letters, digits and ._/+- only")
    if any(text == h or text.startswith(h + "/") for h in _HIDDEN):
        raise VmUnusable(f"workdir {text}: under {', '.join(_HIDDEN)}, which the guest mounts over")
    if not workdir.is_dir():
        raise VmUnusable(f"workdir {text}: not a directory")
    return workdir


def kernel_cmdline(workdir: Path, *, quiet: bool = False, extra: Sequence[str] = ()) -> str:
    parts = ["console=ttyS0",
             # PID 1 exiting or a panic must end qemu (-no-reboot), never leave it spinning.
             "panic=-1", "oops=panic",
             # No v1 hierarchy can ever be mounted: cgroup2 is the only one (the point of this mode).
             "cgroup_no_v1=all",
             # No hardware to probe: skip what costs seconds under TCG.
             "tsc=reliable", "no_timer_check", "i8042.noaux", "i8042.nokbd",
             f"sbxc_work={workdir}", *extra]
    if quiet:
        parts.insert(1, "quiet")
    return " ".join(p for p in parts if p)


def qemu_argv(image: VmImage, workdir: Path, accel: Accel, *, memory_mb: int = MEMORY_MB, cpus: int = 2,
              console: Path, as_root: bool = True, kernel_args: Sequence[str] = ()) -> list[str]:
    # passthrough keeps the host's real owners and modes visible in the guest (sbxc-test's files are
    # sbxc-test's), which needs qemu to run as root; "none" is the unprivileged equivalent that
    # simply does not chown.
    model = "passthrough" if as_root else "none"
    cpu = "host" if accel is Accel.kvm else "max"
    return [
        QEMU,
        "-nodefaults", "-no-user-config",
        "-no-reboot",  # a guest reboot (or panic) ends qemu
        "-display", "none",
        "-accel", accel.value,
        "-cpu", cpu,
        "-m", str(memory_mb),
        "-smp", str(cpus),
        "-kernel", str(image.kernel),
        "-initrd", str(image.initramfs),
        "-append", kernel_cmdline(workdir, extra=kernel_args),
        "-serial", f"file:{console}",
        # multidevs=remap: the host's / spans several filesystems; without it inode numbers collide.
        "-fsdev", f"local,id=hostroot,path=/,security_model={model},readonly=on,multidevs=remap",
        "-device", "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
        "-fsdev", f"local,id=work,path={workdir},security_model={model},multidevs=remap",
        "-device", "virtio-9p-pci,fsdev=work,mount_tag=work",
    ]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return None


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


# ---- running ----

def run_in_vm(argv: Sequence[str], *, workdir: Path, timeout: float, env: Mapping[str, str] | None = None,
              cwd: str | None = None, image: VmImage | None = None, accel: Accel | None = None,
              memory_mb: int = MEMORY_MB, cpus: int = 2, runner: Runner = run,
              live: tuple[IO[str], IO[str]] | None = None, systemd: SystemdGuest | None = None,
              seed: Mapping[str, str] | None = None, progress: Progress | None = None) -> VmResult:
    """Boot, run argv as root inside (cwd default "/"), power off. `timeout` bounds the command in
    the guest; qemu as a whole gets BOOT_BUDGET more and is killed with its process group after that.
    env: the command's whole environment (default: the minimal allowlist of processes.children).
    live: (out, err) streams that get the command's output as it is written (a long suite under TCG
    must not look hung); the result still carries all of it.
    systemd: boot systemd as PID 1 (runners/vm/qemu.py SystemdGuest) and run the command as a unit of
    it, instead of as stage 2's child with stage 2 as PID 1.
    seed: {absolute guest path: text} laid over the guest's root before init starts (the tmpfs
    upper layer takes them, never the host): config files a test needs in place at boot.
    progress: on a terminal, the boot as a stage (from qemu's start until stage 2 writes boot_seconds,
    just before it starts the command) and each stage the command announces in its progress file
    (runners/vm/suite.py Events: the set-up, each leg, the controls)."""
    if not argv:
        raise VmUnusable("empty argv")
    if shutil.which(QEMU) is None:
        raise VmUnusable(f"{QEMU} not found: apt-get install qemu-system-x86 (scripts/vm-deps)")
    workdir = check_workdir(workdir)
    image = image or vm_image.ensure_image()
    accel = accel or select_accel(image, runner=runner)
    control = workdir / CONTROL
    if control.exists():
        shutil.rmtree(control)
    control.mkdir()
    try:
        kernel_args, budget = _stage(control, workdir, argv, env=env, cwd=cwd, timeout=timeout, seed=seed,
                                     systemd=systemd)
        started = time.monotonic()
        progress = progress or Progress.off()
        events = _Events(progress)
        follower = _Follow(control, live, events if progress.enabled else None) \
            if live or progress.enabled else None
        try:
            done, hung = _boot(control, workdir, image, accel, runner, progress, events, budget=budget,
                               timeout=timeout, memory_mb=memory_mb, cpus=cpus, kernel_args=kernel_args)
        finally:
            if follower:
                follower.stop()
            # A stage the command began and never ended (killed at its timeout, a cancelled run).
            events.close("the VM ended")
        return _result(control, done, hung, accel, budget=budget, timeout=timeout,
                       wall=time.monotonic() - started)
    finally:
        shutil.rmtree(control, ignore_errors=True)


def _stage(control: Path, workdir: Path, argv: Sequence[str], *, env: Mapping[str, str] | None,
           cwd: str | None, timeout: float, seed: Mapping[str, str] | None,
           systemd: SystemdGuest | None) -> tuple[list[str], float]:
    """The control directory the guest's stage 2 reads: itself, the request, and the files laid over
    the guest's root. Returns the kernel arguments and the boot budget."""
    shutil.copyfile(STAGE2, control / "stage2.py")
    request = {"argv": list(argv), "env": dict(env if env is not None else minimal_env()),
               "cwd": cwd or "/", "timeout": timeout}
    (control / "request.json").write_text(json.dumps(request))
    files = dict(seed or {})
    kernel_args: list[str] = []
    budget = BOOT_BUDGET
    if systemd is not None:
        files.update(systemd.units(workdir))
        kernel_args = systemd.kernel_args()
        budget = systemd.boot_budget
    for path, text in files.items():
        dest = control / "root" / path.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text)
    return kernel_args, budget


def _boot(control: Path, workdir: Path, image: VmImage, accel: Accel, runner: Runner, progress: Progress,
          events: _Events, *, budget: float, timeout: float, memory_mb: int, cpus: int,
          kernel_args: Sequence[str]) -> tuple[Completed, list[float]]:
    """qemu, booted up to BOOT_ATTEMPTS times: its last run, and the budget of each boot that hung."""
    console = control / "console.log"
    hung: list[float] = []
    for attempt in range(BOOT_ATTEMPTS):
        boot = progress.begin("vm boot" + (f" (attempt {attempt + 1})" if attempt else ""),
                              heartbeat=HEARTBEAT)
        events.booted = _boot_ender(boot, control, accel)
        # A guest that never reaches stage2 is killed after BOOT_BUDGET and booted once more, instead
        # of spinning until the whole timeout: seen once under TCG on a loaded host, qemu at 2 cores'
        # worth of CPU with nothing on the console for 11 minutes.
        watchdog = _BootWatchdog(control, workdir, budget, booted=events.booted)
        try:
            done = runner(qemu_argv(image, workdir, accel, memory_mb=memory_mb, cpus=cpus,
                                    console=console, as_root=os.geteuid() == 0,
                                    kernel_args=list(kernel_args)),
                          # qemu is ours, not a launcher: found on the caller's PATH, as the check
                          # before the boot found it (not minimal_env's fixed one).
                          timeout=timeout + budget,
                          env=minimal_env({"PATH": os.environ.get("PATH", "/usr/bin:/bin")}))
        except BaseException as e:  # a cancelled run: the stage says it stopped, then on up
            boot.end(type(e).__name__, word="stopped after")
            raise
        finally:
            watchdog.stop()
        if (control / BOOT_FILE).exists():
            events.booted()  # a command quicker than both pollers: its boot ended all the same
        elif watchdog.fired:
            boot.end(f"no stage 2 within {budget:.0f}s", word="stopped after")
        else:
            boot.end("qemu exited before stage 2", word="stopped after")
        if not watchdog.fired:
            break
        hung.append(budget)
        if attempt + 1 < BOOT_ATTEMPTS:
            (control / f"console.hung-{attempt}.log").write_bytes(
                console.read_bytes() if console.exists() else b"")
    return done, hung


def _result(control: Path, done: Completed, hung: Sequence[float], accel: Accel, *, budget: float,
            timeout: float, wall: float) -> VmResult:
    """What the guest left in the control directory, and why there is no exit code where there is none."""
    console_text = _read(control / "console.log") or ""
    code_text = _read(control / "exit_code")
    boot_text = _read(control / "boot_seconds")
    exit_code = int(code_text) if code_text and code_text.strip().lstrip("-").isdigit() else None
    error = None
    if exit_code is None:
        stage2 = _read(control / "stage2.log") or ""
        if hung and len(hung) == BOOT_ATTEMPTS:
            last = _tail(console_text) or "nothing on the console"
            error = (f"the guest did not start the command within {budget:.0f} s of boot, "
                     f"{BOOT_ATTEMPTS} times ({accel}): {last}")
        elif done.timed_out:
            error = f"qemu killed after {timeout + budget:.0f} s ({accel}): no exit code"
        elif done.not_found:
            error = done.stderr.strip()
        else:
            why = (_tail(stage2) or _tail(done.stderr) or _tail(console_text)
                   or f"qemu exit {done.returncode}")
            error = f"the guest never reported an exit code ({accel}): {why}"
    return VmResult(
        exit_code=exit_code,
        stdout=_read(control / "stdout") or "",
        stderr=_read(control / "stderr") or "",
        boot_seconds=float(boot_text) if boot_text else None,
        wall_seconds=wall,
        accel=accel,
        console=console_text,
        error=error,
        timed_out=done.timed_out,
        hung_boots=len(hung),
    )


def _boot_ender(boot: Stage, control: Path, accel: Accel) -> Callable[[], None]:
    """Ends the boot stage, from whichever thread sees stage 2's boot_seconds first (Stage.end is
    once only), with the guest's own uptime at that moment: kernel + initramfs + switch_root."""
    def booted() -> None:
        if boot.ended:
            return
        text = (_read(control / BOOT_FILE) or "").strip()
        up = f", guest up {float(text):.1f}s" if re.fullmatch(r"\d+(\.\d+)?", text) else ""
        boot.end(f"{accel}{up}")
    return booted


class _BootWatchdog:
    """Kills our qemu when the guest has not written boot_seconds (stage2's first act) within
    BOOT_BUDGET. The runner owns the qemu process, so ours is found by the workdir on its command
    line (`sbxc_work=` in -append, unique per run) and its whole process group is killed.
    `booted` is called once it sees boot_seconds (the end of the boot's progress stage)."""

    def __init__(self, control: Path, workdir: Path, budget: float | None = None,
                 booted: Callable[[], None] = lambda: None) -> None:
        self.fired = False
        self._control, self._marker = control, f"sbxc_work={workdir}"
        self._booted = booted
        self._budget = BOOT_BUDGET if budget is None else budget
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="vm-boot-watchdog", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        deadline = time.monotonic() + self._budget
        while not self._stopped.wait(0.5):
            if (self._control / BOOT_FILE).exists():
                self._booted()
                return
            if time.monotonic() >= deadline:
                for pid in qemu_pids(self._marker):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(os.getpgid(pid), signal.SIGKILL)
                        self.fired = True
                return

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()


def qemu_pids(marker: str) -> list[int]:
    """qemu processes (by comm, which the kernel truncates to 15 bytes) whose command line has marker:
    the watchdog's target, and what the tests check is gone after a run."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if comm.startswith("qemu-system") and any(marker.encode() in arg for arg in cmdline):
            out.append(int(entry.name))
    return out


class _Events:
    """The command's progress events (runners/vm/suite.py Events: one JSON object a line,
    {"begin": NAME} or {"end": NAME, "result": WORD}) as stages of ours. Lines are taken whole only:
    a line the guest is still writing waits for the next read. Any event, and any output, proves the
    command started, so the boot stage ends first: the lines read in the order things happened."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.booted: Callable[[], None] = lambda: None
        self.stages: dict[str, Stage] = {}
        self._partial = b""

    def feed(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # not ours to judge: a progress line lost, never the run
            if not isinstance(event, dict):
                continue
            self.booted()
            if isinstance(event.get("begin"), str):
                self.stages[event["begin"]] = self.progress.begin(event["begin"], heartbeat=HEARTBEAT)
            elif isinstance(event.get("end"), str) and event["end"] in self.stages:
                self.stages.pop(event["end"]).end(str(event.get("result", "")))

    def close(self, why: str) -> None:
        for stage in self.stages.values():
            stage.end(why, word="stopped after")
        self.stages.clear()


class _Follow:
    """Copies what the guest appends to stdout/stderr in the share to our streams, and its progress
    events to `events`, every 0.3 s, like `tail -f` (the work share is mounted without caching, so
    guest writes reach the host file)."""

    def __init__(self, control: Path, streams: tuple[IO[str], IO[str]] | None,
                 events: _Events | None = None) -> None:
        self.control, self.events = control, events
        self.files: list[tuple[Path, Callable[[bytes], None]]] = []
        self.partial: dict[int, bytes] = {}
        self.streams = list(streams or ())
        for i, (name, stream) in enumerate(zip(("stdout", "stderr"), self.streams, strict=False)):
            self.files.append((control / name, self._writer(i, stream)))
        if events is not None:
            self.files.append((control / PROGRESS_FILE, events.feed))
        self.offsets = [0] * len(self.files)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="vm-follow", daemon=True)
        self.thread.start()

    def _writer(self, i: int, stream: IO[str]) -> Callable[[bytes], None]:
        # Whole lines only, the rest kept for the next read: a progress line written to the same
        # terminal between two reads then never lands inside a line of the guest's output.
        def write(data: bytes) -> None:
            whole, nl, rest = (self.partial.get(i, b"") + data).rpartition(b"\n")
            self.partial[i] = rest
            if nl:
                stream.write((whole + nl).decode(errors="replace"))
                stream.flush()
        return write

    def _pump(self) -> None:
        if self.events is not None and (self.control / BOOT_FILE).exists():
            self.events.booted()  # before the command's first output is copied
        for i, (path, sink) in enumerate(self.files):
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[i])
                    data = f.read()
            except FileNotFoundError:
                continue
            if data:
                self.offsets[i] += len(data)
                sink(data)

    def _loop(self) -> None:
        while not self.done.wait(0.3):
            self._pump()

    def stop(self) -> None:
        self.done.set()
        self.thread.join()
        self._pump()
        for i, stream in enumerate(self.streams):  # a last line without its newline
            if self.partial.get(i):
                stream.write(self.partial.pop(i).decode(errors="replace"))
                stream.flush()


_accel_cache: dict[str, Accel] = {}


def kvm_usable_device(dev: Path = Path("/dev/kvm")) -> bool:
    return dev.exists() and os.access(dev, os.R_OK | os.W_OK)


def select_accel(image: VmImage, *, runner: Runner = run, env: Mapping[str, str] | None = None) -> Accel:
    """KVM when a trial boot under it works, else TCG. /dev/kvm existing proves nothing here: this
    host's is a paravirtual KVM under which a stock kernel dies early with an emulation failure (and
    qemu then hangs rather than exits), so only a boot that reaches stage 2 counts.
    SANDBOX_CONFORMANCE_VM_ACCEL=kvm|tcg skips the trial. The verdict is kept for this process."""
    env = os.environ if env is None else env
    forced = env.get("SANDBOX_CONFORMANCE_VM_ACCEL", "")
    if forced:
        try:
            return Accel(forced)
        except ValueError:
            raise VmUnusable(f"SANDBOX_CONFORMANCE_VM_ACCEL={forced!r}: use kvm or tcg") from None
    key = f"{image.kernel}:{image.initramfs}"
    if key in _accel_cache:
        return _accel_cache[key]
    # The verdict depends on the host's hypervisor and kernel, not on us: remember it next to the
    # image so each run does not pay a hung trial boot again.
    remembered = image.directory / f"accel-{os.uname().release}-{image.initramfs.stem}.txt"
    text = (_read(remembered) or "").strip()
    if text in Accel.__members__:
        _accel_cache[key] = Accel(text)
        return Accel(text)
    accel = Accel.tcg
    if kvm_usable_device():
        with tempfile.TemporaryDirectory(prefix=f"sbxc-kvm-trial-{owner.stamp()}-") as tmp:
            trial = run_in_vm(["/bin/true"], workdir=Path(tmp), timeout=KVM_TRIAL_TIMEOUT, image=image,
                              accel=Accel.kvm, memory_mb=256, cpus=1, runner=_trial_runner(runner))
        if trial.exit_code == 0:
            accel = Accel.kvm
    _accel_cache[key] = accel
    with contextlib.suppress(PermissionError):
        remembered.write_text(f"{accel}\n")
    return accel


def _trial_runner(runner: Runner) -> Runner:
    """The trial's qemu gets KVM_TRIAL_TIMEOUT in all, not the usual boot budget."""
    def trial(argv, *, timeout, input=None, env=None, cwd=None):  # type: ignore[no-untyped-def]
        return runner(argv, timeout=min(timeout, KVM_TRIAL_TIMEOUT), input=input, env=env, cwd=cwd)
    return trial
