"""The VM mode's boot image: a stock Debian kernel and a tiny initramfs, built once into a cache.

Everything comes from Debian's archive through the ordinary clients: `apt-get download` of the
generic `linux-image-*-amd64` (the cloud flavour lacks 9p), `dpkg-deb -x` to unpack it (the kernel is
never installed on the host), and `busybox-static` for the initramfs' shell. The initramfs holds only
busybox, the virtio/9p/overlay/dummy modules and `/init` (INIT_SCRIPT below); the guest's userland is the
host's own `/`, shared read-only over 9p, so python3, bwrap and /etc/passwd (with sbxc-test) are the
host's.

The cache lives outside the repo (/var/cache/sandbox-conformance/vm/<kernel>/ as root), one directory
per kernel version; the initramfs file name carries a hash of everything that goes into it, so a
change to INIT_SCRIPT or the module list makes a new one instead of booting a stale one.
`ensure_image()` is the one function CI calls (`python3 -m sandbox_conformance.runners.vm.image`).
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import stat
import struct
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from sandbox_conformance.processes.children import Runner, minimal_env, run

# The modules /init loads, in the order it loads them: transports first (virtio_pci finds the
# virtio-9p-pci devices qemu adds), then 9p (which in 6.x depends on netfs and fscache) and overlay.
# dummy: loading it creates `dummy0`, an interface besides `lo` (the VM has no NIC), so a witness that
# the task sees only `lo` can go red when a sandbox shares the network namespace; without it the
# guest has nothing else to show. The guest cannot load modules later: the host's /lib/modules is for
# the host's kernel. The order is computed from each module's own `.modinfo` depends= line
# (module_order), not hard-coded: a kernel update that adds a dependency then still boots.
WANTED_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay", "dummy")

# Busybox applets /init uses; each becomes a symlink to /bin/busybox in the initramfs.
APPLETS = ("sh", "mount", "umount", "insmod", "mkdir", "cat", "echo", "switch_root", "poweroff",
           "sleep", "tr", "grep", "cut", "cp", "rm")

BUSYBOX = Path("/bin/busybox")
# A replaced initramfs is kept this long for runs that loaded the image just before (refresh_initramfs).
STALE_SECONDS = 3600
META_PACKAGE = "linux-image-amd64"  # Debian's meta package: Depends names the current generic kernel

# /init: PID 1 until switch_root. It must stay small and boring: any failure prints one line to the
# console (ttyS0, which the host keeps as console.log) and powers off, so the host sees "no exit
# code" plus that line instead of a hang.
INIT_SCRIPT = r"""#!/bin/sh
fail() { echo "sbxc-init: $*"; poweroff -f; sleep 5; }
mkdir -p /proc /sys /dev /lower /upper /newroot
mount -t proc proc /proc || fail "mount proc"
mount -t devtmpfs devtmpfs /dev 2>/dev/null
for m in $(cat /modules.order); do
    insmod "/modules/$m.ko" || fail "insmod $m"
done
work=""
init=stage2
for arg in $(cat /proc/cmdline); do
    case "$arg" in
        sbxc_work=*) work="${arg#sbxc_work=}" ;;
        sbxc_init=*) init="${arg#sbxc_init=}" ;;
    esac
done
[ -n "$work" ] || fail "no sbxc_work= on the kernel command line"
# The host's / read-only (qemu exports it readonly=on as well), under a tmpfs upper layer: the guest
# gets a writable root whose writes vanish at power-off and never reach the host. cache=loose is safe
# for a lower layer that nothing in the guest writes to.
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro hostroot /lower \
    || fail "mount 9p hostroot"
mount -t tmpfs -o mode=0755 tmpfs /upper || fail "mount tmpfs upper"
mkdir -p /upper/data /upper/work
mount -t overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work overlay /newroot \
    || fail "mount overlay"
mkdir -p "/newroot$work"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,rw work "/newroot$work" || fail "mount 9p work"
# Files the host put under .sbxc-vm/root/ are laid over the guest's root (the tmpfs upper layer
# takes them; the host never sees them): unit files for a systemd guest, a test's config.
seed="/newroot$work/.sbxc-vm/root"
if [ -d "$seed" ]; then cp -a "$seed/." /newroot/ || fail "seed the root from $seed"; fi
# The initramfs' own /proc and /dev must go before switch_root: left behind, hidden under the new
# root, they still count for the kernel's "is a fully visible procfs already mounted?" test
# (fs/namespace.c mnt_already_visible walks every mount of the namespace, reachable or not), so a
# masked /proc in the guest would never refuse a fresh procfs the way it does on a real host.
if [ "$init" = systemd ]; then
    # systemd as PID 1 mounts /proc, /sys, /dev, /run and a cgroup2 hierarchy itself (mount_setup);
    # the units it starts come from the host's /etc and /lib plus the seeded ones.
    # A stray /.dockerenv on the host's / (this machine kind's image has one) makes systemd
    # believe it is in a Docker container (detect_container), and then it reads its options from
    # its own argv instead of the kernel command line and skips what a VM's PID 1 does: the guest
    # is a plain VM, so the marker goes from its view (a whiteout in the upper layer).
    rm -f /newroot/.dockerenv
    umount /dev 2>/dev/null
    umount /proc || fail "umount the initramfs /proc"
    exec switch_root /newroot /lib/systemd/systemd
    fail "switch_root to systemd"
fi
mount -t proc proc /newroot/proc || fail "mount proc"
mount -t sysfs sysfs /newroot/sys || fail "mount sysfs"
# A fresh cgroup2 and nothing else (cgroup_no_v1=all on the command line): the pure v2 hierarchy the
# host's hybrid layout cannot give. nsdelegate: a cgroup namespace root is a delegation boundary
# (Documentation/admin-guide/cgroup-v2.rst, "Delegation").
mount -t cgroup2 -o nsdelegate cgroup2 /newroot/sys/fs/cgroup || fail "mount cgroup2"
mount -t devtmpfs devtmpfs /newroot/dev || fail "mount devtmpfs"
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /newroot/dev/pts || fail "mount devpts"
mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm || fail "mount /dev/shm"
# /run holds the host's live sockets and pid files: hide them behind an empty tmpfs.
mount -t tmpfs -o mode=0755 tmpfs /newroot/run || fail "mount /run"
umount /dev 2>/dev/null
umount /proc || fail "umount the initramfs /proc"
# switch_root, not chroot: a chrooted process may not create user namespaces (unshare(2): EPERM
# "the caller is in a chroot environment"), and bwrap needs them.
exec switch_root /newroot /usr/bin/python3 -I -S "$work/.sbxc-vm/stage2.py" "$work"
fail "switch_root"
"""


class ImageNotBuilt(Exception):
    """The boot image could not be built: one line naming the step that failed."""


@dataclasses.dataclass(frozen=True)
class VmImage:
    kernel_version: str  # "6.1.0-57-amd64"
    kernel: Path  # an uncompressed vmlinux (PVH entry) when extraction worked, else the bzImage
    initramfs: Path
    directory: Path


def default_cache_root(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("SANDBOX_CONFORMANCE_VM_CACHE"):
        return Path(env["SANDBOX_CONFORMANCE_VM_CACHE"])
    if os.geteuid() == 0:
        return Path("/var/cache/sandbox-conformance/vm")
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sandbox-conformance" / "vm"


# ---- pure helpers (unit-tested) ----

def parse_meta_depends(apt_cache_depends: str) -> str | None:
    """The kernel package a meta package depends on, from `apt-cache depends` output."""
    for line in apt_cache_depends.splitlines():
        m = re.match(r"\s*Depends:\s*(linux-image-\S+)", line)
        if m:
            return m.group(1)
    return None


def kernel_version_of(package: str) -> str:
    """linux-image-6.1.0-57-amd64 -> 6.1.0-57-amd64 (the /lib/modules directory name)."""
    if not package.startswith("linux-image-"):
        raise ImageNotBuilt(f"not a kernel image package: {package}")
    version = package.removeprefix("linux-image-")
    if "cloud" in version:
        # Debian's cloud flavour is built without CONFIG_NET_9P: the guest could not reach the host's /.
        raise ImageNotBuilt(f"{package}: the cloud kernel has no 9p; use the generic -amd64 flavour")
    return version


def modinfo_field(ko: bytes, field: str) -> str | None:
    """A field of a module's .modinfo section ("depends", "name"): NUL-separated key=value strings.
    Read directly so building needs no kmod on the host."""
    m = re.search(rb"(?:^|\x00)" + re.escape(field.encode()) + rb"=([^\x00]*)", ko)
    return m.group(1).decode() if m else None


def module_order(wanted: Iterable[str], depends: Mapping[str, Sequence[str]]) -> list[str]:
    """Dependencies before dependants (a depth-first post-order), each module once."""
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order:
            return
        if name not in depends:
            raise ImageNotBuilt(f"module {name} not found in the kernel package")
        if name in visiting:
            raise ImageNotBuilt(f"module dependency cycle through {name}")
        visiting.add(name)
        for dep in depends[name]:
            visit(dep)
        visiting.discard(name)
        order.append(name)

    for name in wanted:
        visit(name)
    return order


def elf_has_interpreter(elf: bytes) -> bool:
    """True for a dynamically linked ELF64 (a PT_INTERP program header): such a busybox would find no
    libc in the initramfs and the kernel would panic with "No working init found"."""
    if not elf.startswith(b"\x7fELF\x02\x01"):
        raise ImageNotBuilt("busybox is not a little-endian ELF64 binary")
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    return any(struct.unpack_from("<I", elf, phoff + i * phentsize)[0] == 3  # PT_INTERP (elf.h)
               for i in range(phnum))


def extract_vmlinux(bzimage: bytes) -> bytes | None:
    """The ELF vmlinux inside an xz-compressed bzImage (what linux/scripts/extract-vmlinux does).
    qemu boots it through its PVH note (CONFIG_PVH=y in Debian's kernels), skipping the in-guest
    decompression that costs seconds under TCG. None when no xz payload yields an ELF."""
    magic = b"\xfd7zXZ\x00"
    start = bzimage.find(magic)
    while start != -1:
        try:
            out = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(bzimage[start:])
        except lzma.LZMAError:
            out = b""
        if out.startswith(b"\x7fELF"):
            return out
        start = bzimage.find(magic, start + 1)
    return None


@dataclasses.dataclass(frozen=True)
class CpioEntry:
    name: str  # without a leading slash
    mode: int  # full st_mode, type bits included
    data: bytes = b""
    rdev: tuple[int, int] = (0, 0)


def newc_archive(entries: Sequence[CpioEntry]) -> bytes:
    """An uncompressed cpio "newc" archive, the format the kernel unpacks as an initramfs
    (Documentation/driver-api/early-userspace/buffer-format.rst). Written here so the build needs
    no cpio binary; uncompressed so TCG spends no boot time inflating it."""
    out = io.BytesIO()

    def pad(n: int) -> None:
        out.write(b"\x00" * ((4 - n % 4) % 4))

    def header(ino: int, e: CpioEntry) -> None:
        name = e.name.encode() + b"\x00"
        fields = (ino, e.mode, 0, 0, 2 if stat.S_ISDIR(e.mode) else 1, 0, len(e.data), 0, 0,
                  e.rdev[0], e.rdev[1], len(name), 0)
        head = b"070701" + b"".join(b"%08X" % f for f in fields)
        out.write(head + name)
        pad(len(head) + len(name))
        out.write(e.data)
        pad(len(e.data))

    for ino, e in enumerate(entries, start=1):
        header(ino, e)
    header(0, CpioEntry("TRAILER!!!", 0))
    return out.getvalue()


def initramfs_entries(busybox: bytes, modules: Sequence[tuple[str, bytes]]) -> list[CpioEntry]:
    d, f, x, lnk = stat.S_IFDIR | 0o755, stat.S_IFREG | 0o644, stat.S_IFREG | 0o755, stat.S_IFLNK | 0o777
    entries = [CpioEntry("bin", d), CpioEntry("dev", d), CpioEntry("modules", d),
               # The kernel opens /dev/console for init's stdio before running /init.
               CpioEntry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1)),
               CpioEntry("bin/busybox", x, busybox)]
    entries += [CpioEntry(f"bin/{a}", lnk, b"busybox") for a in APPLETS]
    entries += [CpioEntry(f"modules/{name}.ko", f, data) for name, data in modules]
    entries.append(CpioEntry("modules.order", f, "".join(f"{n}\n" for n, _ in modules).encode()))
    entries.append(CpioEntry("init", x, INIT_SCRIPT.encode()))
    return entries


# ---- the build (I/O) ----

def _check(done, step: str) -> None:  # type: ignore[no-untyped-def]
    if not done.ok:
        why = "timed out" if done.timed_out else (done.stderr_tail() or f"exit {done.returncode}")
        raise ImageNotBuilt(f"{step}: {why}")


def resolve_kernel_package(runner: Runner = run) -> str:
    done = runner(["apt-cache", "depends", META_PACKAGE], timeout=60)
    _check(done, f"apt-cache depends {META_PACKAGE}")
    package = parse_meta_depends(done.stdout)
    if package is None:
        raise ImageNotBuilt(f"apt-cache depends {META_PACKAGE}: no linux-image dependency "
                            "(run apt-get update?)")
    return package


def build_image(directory: Path, package: str, *, runner: Runner = run, busybox: Path = BUSYBOX) -> VmImage:
    """Download and unpack `package`, write vmlinux + initramfs into `directory` (made atomically)."""
    version = kernel_version_of(package)
    if not busybox.exists():
        raise ImageNotBuilt(f"{busybox} missing: apt-get install busybox-static (scripts/vm-deps)")
    busybox_data = busybox.read_bytes()
    if elf_has_interpreter(busybox_data):
        raise ImageNotBuilt(f"{busybox} is dynamically linked: the initramfs needs busybox-static")
    directory.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=directory.parent) as tmp:
        t = Path(tmp)
        # apt drops privileges to _apt for downloads unless told otherwise; _apt cannot write here.
        done = runner(["apt-get", "download", "-o", "APT::Sandbox::User=root", package],
                      timeout=600, cwd=str(t), env=minimal_env())
        _check(done, f"apt-get download {package}")
        debs = sorted(t.glob("*.deb"))
        if not debs:
            raise ImageNotBuilt(f"apt-get download {package}: no .deb appeared")
        done = runner(["dpkg-deb", "-x", str(debs[0]), str(t / "x")], timeout=300)
        _check(done, "dpkg-deb -x")
        bzimage = t / "x" / "boot" / f"vmlinuz-{version}"
        moddir = t / "x" / "lib" / "modules" / version / "kernel"
        if not bzimage.exists() or not moddir.is_dir():
            raise ImageNotBuilt(f"{debs[0].name}: no boot/vmlinuz-{version} or lib/modules/{version}")
        files = {p.name.split(".ko")[0]: p for p in moddir.rglob("*.ko*")}
        if any(p.suffix in (".xz", ".zst", ".gz") for p in files.values()):
            raise ImageNotBuilt(f"{package}: compressed modules; busybox insmod needs plain .ko")
        depends: dict[str, list[str]] = {}
        for name, p in files.items():
            deps = modinfo_field(p.read_bytes(), "depends") or ""
            depends[name] = [dep for dep in deps.split(",") if dep]
        order = module_order(WANTED_MODULES, depends)
        modules = [(name, files[name].read_bytes()) for name in order]
        out = t / "image"
        (out / "modules").mkdir(parents=True)
        for name, data in modules:  # kept so load_image can tell a stale initramfs from a current one
            (out / "modules" / f"{name}.ko").write_bytes(data)
        raw = bzimage.read_bytes()
        vmlinux = extract_vmlinux(raw)
        kernel = out / ("vmlinux" if vmlinux else "vmlinuz")
        kernel.write_bytes(vmlinux or raw)
        archive = newc_archive(initramfs_entries(busybox_data, modules))
        initramfs = out / initramfs_name(busybox_data, modules)
        initramfs.write_bytes(archive)
        (out / "manifest.json").write_text(json.dumps({
            "package": package, "kernel_version": version, "kernel": kernel.name,
            "initramfs": initramfs.name, "modules": order, "wanted": list(WANTED_MODULES),
        }, indent=1) + "\n")
        if directory.exists():
            shutil.rmtree(directory)
        out.rename(directory)
    return load_image(directory, busybox_data=busybox_data)


def initramfs_name(busybox_data: bytes, modules: Sequence[tuple[str, bytes]]) -> str:
    h = hashlib.sha256(INIT_SCRIPT.encode() + busybox_data)
    for name, data in modules:
        h.update(name.encode() + data)
    h.update(repr(APPLETS).encode())
    return f"initramfs-{h.hexdigest()[:16]}.cpio"


def load_image(directory: Path, *, busybox_data: bytes | None = None) -> VmImage:
    """A previously built image, or ImageNotBuilt when missing or stale (INIT_SCRIPT changed)."""
    try:
        manifest = json.loads((directory / "manifest.json").read_text())
    except FileNotFoundError:
        raise ImageNotBuilt(f"no VM image in {directory}") from None
    if manifest.get("wanted") != list(WANTED_MODULES):
        raise ImageNotBuilt(f"stale VM image in {directory} (built for modules {manifest.get('wanted')})")
    kernel = directory / manifest["kernel"]
    initramfs = directory / manifest["initramfs"]
    if not kernel.exists() or not initramfs.exists():
        raise ImageNotBuilt(f"incomplete VM image in {directory}")
    if busybox_data is not None or BUSYBOX.exists():
        data = busybox_data if busybox_data is not None else BUSYBOX.read_bytes()
        modules = [(n, (directory / "modules" / f"{n}.ko").read_bytes())
                   for n in manifest["modules"] if (directory / "modules" / f"{n}.ko").exists()]
        if modules and initramfs_name(data, modules) != initramfs.name:
            raise ImageNotBuilt(f"stale VM image in {directory}")
    return VmImage(manifest["kernel_version"], kernel, initramfs, directory)


def ensure_image(cache_root: Path | None = None, *, package: str | None = None,
                 runner: Runner = run) -> VmImage:
    """The cached image for the current Debian generic kernel, built when absent or stale."""
    root = cache_root or default_cache_root()
    package = package or resolve_kernel_package(runner)
    directory = root / kernel_version_of(package)
    try:
        return load_image(directory)
    except ImageNotBuilt:
        pass
    root.mkdir(parents=True, exist_ok=True)
    # Two runs building at once (CI's set-up step and a test session) would replace each other's
    # directory mid-boot: one builder at a time, and the second one finds the first one's image.
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return load_image(directory)
        except ImageNotBuilt:
            pass
        refreshed = refresh_initramfs(directory)
        return refreshed or build_image(directory, package, runner=runner)


def refresh_initramfs(directory: Path, *, busybox: Path = BUSYBOX) -> VmImage | None:
    """A stale initramfs next to a kernel and modules that still fit (INIT_SCRIPT, the applets or
    busybox changed, the module list did not): write only a new initramfs, with no download. None
    when the directory cannot be refreshed (no manifest, another module list, a file missing).
    Earlier initramfs files stay a while: a run that loaded the image just before may be about to
    hand one to qemu; those older than STALE_SECONDS go."""
    try:
        manifest = json.loads((directory / "manifest.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    files = [directory / "modules" / f"{n}.ko" for n in manifest.get("modules", [])]
    if manifest.get("wanted") != list(WANTED_MODULES) or not files or not busybox.exists() \
            or not all(f.exists() for f in files) or not (directory / manifest.get("kernel", "-")).exists():
        return None
    busybox_data = busybox.read_bytes()
    if elf_has_interpreter(busybox_data):
        return None
    modules = [(f.stem, f.read_bytes()) for f in files]
    name = initramfs_name(busybox_data, modules)
    tmp = directory / f".{name}.tmp"
    tmp.write_bytes(newc_archive(initramfs_entries(busybox_data, modules)))
    tmp.rename(directory / name)
    doc = directory / ".manifest.json.tmp"
    doc.write_text(json.dumps({**manifest, "initramfs": name}, indent=1) + "\n")
    doc.rename(directory / "manifest.json")
    for old in directory.glob("initramfs-*.cpio"):
        if old.name != name and time.time() - old.stat().st_mtime > STALE_SECONDS:
            old.unlink(missing_ok=True)
    return load_image(directory, busybox_data=busybox_data)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m sandbox_conformance.runners.vm.image",
                                     description="Build (once) the VM mode's kernel + initramfs cache.")
    parser.add_argument("--cache", type=Path, default=None, help="cache root (default: %(default)s)")
    parser.add_argument("--package", default=None, help="kernel package (default: what linux-image-amd64 "
                        "depends on)")
    args = parser.parse_args(argv)
    try:
        image = ensure_image(args.cache, package=args.package)
    except ImageNotBuilt as e:
        print(f"sandbox-conformance: VM image: {e}", file=sys.stderr)
        return 75
    print(f"{image.kernel_version} {image.kernel} {image.initramfs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
