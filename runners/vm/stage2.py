"""PID 1 inside the VM after switch_root: run the requested command, record its exit code, power off.

Runs as `python3 -I -S stage2.py WORKDIR` on the guest's root (the host's / under a tmpfs overlay), so
it is stdlib-only and imports nothing of ours. The host copies this file into WORKDIR/.sbxc-vm/ and
writes request.json there; everything we hand back goes into the same directory, which is a
read-write 9p share of the host's WORKDIR:
  stdout, stderr   the command's output
  boot_seconds     the guest's uptime as the command starts, written whole (rename) just before it:
                   its presence is the host's sign that the boot is over (qemu.py's boot stage and
                   watchdog)
  progress         the command's own progress events, if it writes any: its path is in the
                   command's $SANDBOX_CONFORMANCE_VM_PROGRESS (runners/vm/qemu.py follows it)
  exit_code        written last (fsync + rename): its presence means the command ran to the end
  stage2.log       what this script itself saw (for the host's error message)
As PID 1 it must also reap every orphan (init(1)'s job), and when it exits the kernel panics, so the
normal end is reboot(2) with LINUX_REBOOT_CMD_POWER_OFF. In a systemd guest (runners/vm/qemu.py
SystemdGuest) it runs as a service instead; the same power-off ends that guest too.
"""

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import socket
import struct
import sys
import time

# <linux/reboot.h>; glibc's reboot(3) adds the two magic numbers itself.
LINUX_REBOOT_CMD_POWER_OFF = 0x4321FEDC
LINUX_REBOOT_CMD_RESTART = 0x01234567
TIMED_OUT = 124  # timeout(1)'s convention
# Where the command may append progress events, one JSON object a line (runners/vm/qemu.py _Events).
PROGRESS_ENV = "SANDBOX_CONFORMANCE_VM_PROGRESS"
PROGRESS_FILE = "progress"
BOOT_FILE = "boot_seconds"

# Annotations are for mypy only: the guest's python3 evaluates a def's annotations when the def runs,
# so any that is not a plain builtin is a string, and `typing` is imported only under TYPE_CHECKING
# (the convention of conformance/inside.py).
TYPE_CHECKING = False  # mypy takes any name TYPE_CHECKING as true; the guest never runs this block
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


def log(control: str, message: str) -> None:
    with open(os.path.join(control, "stage2.log"), "a") as f:
        f.write(message + "\n")


def write_whole(control: str, name: str, text: str) -> None:
    """NAME appears in the share only with its whole text: written under another name, then renamed
    (rename(2) is atomic; the host polls for NAME and reads it at once)."""
    tmp = os.path.join(control, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(control, name))


def write_exit_code(control: str, code: int) -> None:
    write_whole(control, "exit_code", f"{code}\n")


def loopback_up() -> None:
    """Bring `lo` up (the kernel then gives it 127.0.0.1/8). Nothing else does in this guest, and
    with it down the network witnesses would be vacuous: the task could not reach the harness's
    127.0.0.1 listener even with a shared network namespace, so a broken sandbox would pass.
    SIOCGIFFLAGS/SIOCSIFFLAGS on struct ifreq (netdevice(7)); ifreq is 40 bytes on x86-64."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sh22x", fcntl.ioctl(s, siocgifflags, struct.pack("16sh22x", b"lo", 0)))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sh22x", b"lo", flags | iff_up))


def power_off() -> None:
    os.sync()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.reboot(LINUX_REBOOT_CMD_POWER_OFF)
    # Only reached if power-off failed: a restart also ends qemu, which runs with -no-reboot.
    libc.reboot(LINUX_REBOOT_CMD_RESTART)
    time.sleep(5)


def run(control: str, request: "Mapping[str, Any]") -> int:
    env = dict(request.get("env") or {})
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    env.setdefault("HOME", "/root")
    env["SANDBOX_CONFORMANCE_IN_VM"] = "1"
    env[PROGRESS_ENV] = os.path.join(control, PROGRESS_FILE)
    deadline = time.monotonic() + float(request["timeout"])
    out = os.open(os.path.join(control, "stdout"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(os.path.join(control, "stderr"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open("/dev/null", os.O_RDONLY)
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(err, 2)
            os.chdir(request.get("cwd") or "/")
            os.execvpe(request["argv"][0], request["argv"], env)
        except OSError as e:
            os.write(2, f"sbxc-vm: cannot run {request['argv'][0]}: {e.strerror}\n".encode())
            os._exit(127)
    for fd in (out, err, null):
        os.close(fd)
    # Reap everything (we are init); stop when our child is gone or the deadline passes.
    while True:
        try:
            reaped, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 127
        if reaped == pid:
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
        if reaped == 0:
            if time.monotonic() > deadline:
                log(control, f"timed out after {request['timeout']} s: killing the command")
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return TIMED_OUT
            time.sleep(0.05)


def main() -> None:
    control = os.path.join(sys.argv[1], ".sbxc-vm")
    try:
        with open(os.path.join(control, "request.json")) as f:
            request = json.load(f)
        loopback_up()
        # Guest uptime when the command starts: the kernel + initramfs + switch_root part of a run.
        write_whole(control, BOOT_FILE, f"{time.clock_gettime(time.CLOCK_BOOTTIME):.3f}\n")
        code = run(control, request)
        write_exit_code(control, code)
    except Exception as e:  # PID 1 must never die with a traceback: say what happened, then power off
        log(control, f"stage2 failed: {type(e).__name__}: {e}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)  # everything but us: no writer may outlive the sync
        power_off()


if __name__ == "__main__":
    main()
