"""The Docker tier: a private dockerd and an image built from the repository's Dockerfile, started once
per pytest session and always torn down.

Use it from a test module with `pytest_plugins = ["docker_tier"]` and the `docker_tier` fixture.

Set-up: `dockerd` on a private socket, data root and exec root under a fresh temp dir (`--bridge none
--iptables=false`: the daemon creates no docker0 and no iptables chains, nothing on the host to clean
up; builds use `--network host` to reach the mirror); a base image from `debootstrap --variant=minbase
bookworm` imported into it by scripts/docker-base-image (the tarball cached per day under
/var/cache/sandbox-conformance; no registry is reachable); then `docker build --build-arg BASE=...` of
the Dockerfile.

Teardown, whatever happened: remove containers and images, stop dockerd (SIGTERM, then SIGKILL to its
process group), kill anything else still running from our exec root (containerd, shims), unmount
whatever is left under the temp dir, remove it.

A cancelled `make test` (docs/cancellation.md): ^C, SIGTERM or SIGHUP stop pytest through a
KeyboardInterrupt (tests/conftest.py), so this teardown runs. A SIGKILL runs nothing: dockerd gets
SIGTERM from the kernel as its parent-death signal and stops its containers and containerd, and the
temp dir and cgroup parent, both named with pytest's owner stamp (processes/owner.py), are swept by
the next tier that starts (`sweep_dead_tiers`), which says what it removed.

Missing prerequisites (not root, no dockerd/docker/debootstrap) skip with that reason, which
SANDBOX_CONFORMANCE_REQUIRE=1 turns into a failure; anything else that fails is an error."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_conformance.processes import owner
from sandbox_conformance.processes.children import Completed, die_with_parent, run

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("SANDBOX_CONFORMANCE_CACHE", "/var/cache/sandbox-conformance"))
# Each test that uses the tier may be the one that pays for its set-up (pytest-randomly picks).
SETUP_TIMEOUT = 1500


class Unavailable(Exception):
    """A prerequisite of the tier is missing on this machine: skip with this reason."""


@dataclasses.dataclass(frozen=True)
class DockerTier:
    tmp: Path
    docker: str  # the client binary
    host: str  # DOCKER_HOST value
    base: str  # the imported debootstrap image
    image: str  # the image built from the Dockerfile
    setup_seconds: float
    cgroup_parent: str = ""  # where dockerd files its containers' cgroups; removed at teardown

    @property
    def env(self) -> dict[str, str]:
        """An environment for the docker client (and for `sandbox-conformance run`) that talks to the
        private daemon only."""
        return {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "DOCKER_HOST": self.host,
                "HOME": str(self.tmp / "home"), "DOCKER_CONFIG": str(self.tmp / "home" / ".docker")}

    def docker_cmd(self, *args: str, timeout: float = 120, input: str | None = None) -> Completed:
        return run([self.docker, *args], timeout=timeout, env=self.env, input=input)


def _need(c: Completed, what: str) -> Completed:
    if not c.ok:
        why = "timed out" if c.timed_out else f"exit {c.returncode}"
        raise RuntimeError(f"docker tier: {what} failed ({why}): {c.stderr_tail(6) or c.stdout[-500:]}")
    return c


def _prerequisites() -> tuple[str, str]:
    if os.geteuid() != 0:
        raise Unavailable("the Docker tier starts its own dockerd and needs root")
    missing = [b for b in ("dockerd", "docker", "debootstrap", "containerd", "runc") if not shutil.which(b)]
    if missing:
        raise Unavailable(f"the Docker tier needs {', '.join(missing)} "
                          "(apt-get install docker.io debootstrap)")
    return shutil.which("dockerd") or "dockerd", shutil.which("docker") or "docker"


def _our_processes(tmp: Path) -> list[int]:
    """Processes whose command line names our temp dir: dockerd, its containerd, the shims."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if str(tmp).encode() in cmdline:
            out.append(int(entry.name))
    return out


def _mounts_under(tmp: Path) -> list[str]:
    """Mount points under tmp from /proc/self/mountinfo (field 5), deepest first."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == str(tmp) or point.startswith(f"{tmp}/"):
            points.append(point)
    return sorted(points, key=len, reverse=True)


CGROUP_FS = Path("/sys/fs/cgroup")


def cgroup_dirs(name: str, fs: Path = CGROUP_FS) -> list[Path]:
    """Every directory named `name` at the top of each mounted hierarchy (v1 controllers, unified)."""
    if not fs.is_dir():
        return []
    return [h / name for h in sorted(fs.iterdir()) if (h / name).is_dir()] + (
        [fs / name] if (fs / name / "cgroup.procs").exists() else [])


def remove_cgroup_tree(top: Path) -> None:
    """rmdir a cgroup tree bottom-up (cgroupfs allows rmdir only of a directory with no children and no
    tasks; its control files go with it). Only ever called on the parent our dockerd was told to use."""
    for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(FileNotFoundError):
            d.rmdir()
    with contextlib.suppress(FileNotFoundError):
        top.rmdir()


def teardown(tmp: Path, daemon: subprocess.Popen[bytes] | None, docker: str,
             env: dict[str, str], cgroup_parent: str | None = None) -> list[str]:
    """Leave nothing behind. Returns what it had to force, for the log."""
    forced: list[str] = []
    if daemon is not None and daemon.poll() is None:
        ids = run([docker, "ps", "--all", "--quiet"], timeout=30, env=env).stdout.split()
        if ids:
            run([docker, "rm", "--force", *ids], timeout=120, env=env)
        images = run([docker, "images", "--all", "--quiet"], timeout=30, env=env).stdout.split()
        if images:
            run([docker, "rmi", "--force", *sorted(set(images))], timeout=120, env=env)
        daemon.send_signal(signal.SIGTERM)  # dockerd stops its containerd and unmounts its data root
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            forced.append("dockerd did not stop on SIGTERM")
    if daemon is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait()
    for _ in range(3):
        pids = _our_processes(tmp)
        if not pids:
            break
        forced.append(f"killed {len(pids)} leftover process(es)")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    for point in _mounts_under(tmp):
        forced.append(f"unmounted {point}")
        if run(["umount", point], timeout=30).returncode != 0:
            run(["umount", "--lazy", point], timeout=30)
    if cgroup_parent:
        # dockerd (cgroupfs driver) made this parent in every hierarchy for its containers and leaves
        # it behind when it stops; the containers' own cgroups went with them.
        for top in cgroup_dirs(cgroup_parent):
            try:
                remove_cgroup_tree(top)
            except OSError as e:
                forced.append(f"could not remove cgroup {top}: {e.strerror}")
    shutil.rmtree(tmp, ignore_errors=True)
    return forced


def sweep_dead_tiers(docker: str, tmp_root: Path | None = None, fs: Path = CGROUP_FS) -> list[str]:
    """What tiers whose pytest is gone (SIGKILLed, crashed) left: their temp dirs (processes naming
    them, mounts, the tree) and cgroup parents (processes in them, the tree). Only stamped names whose
    owner is gone: a concurrent `make test`'s live tier, or an unstamped one, is never touched."""
    said = []
    for tmp in sorted(Path(tmp_root or tempfile.gettempdir()).glob("sbxc-docker.o*")):
        found = owner.find(tmp.name)
        if found is not None and owner.gone(found):
            forced = teardown(tmp, None, docker, {})
            said.append(f"swept {tmp}: its pytest (pid {found.pid}) is gone"
                        + (f" ({'; '.join(forced)})" if forced else ""))
    tops = sorted(fs.glob("sbxc-docker-o*")) + sorted(fs.glob("*/sbxc-docker-o*")) if fs.is_dir() else []
    for top in tops:
        found = owner.find(top.name)
        if top.is_dir() and found is not None and owner.gone(found):
            problem = owner.remove_cgroup(top)
            said.append(f"swept cgroup {top}: its pytest (pid {found.pid}) is gone"
                        + (f" ({problem})" if problem else ""))
    for line in said:
        print(f"docker tier: {line}", file=sys.stderr)
    return said


def _wait_for_daemon(docker: str, env: dict[str, str], daemon: subprocess.Popen[bytes], log: Path,
                     timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise RuntimeError(f"docker tier: dockerd exited {daemon.returncode}: "
                               + " | ".join(log.read_text(errors="replace").splitlines()[-5:]))
        if run([docker, "version", "--format", "{{.Server.Version}}"], timeout=10, env=env).ok:
            return
        time.sleep(0.5)
    raise RuntimeError(f"docker tier: dockerd did not answer within {timeout:.0f}s")


@contextlib.contextmanager
def docker_tier_up() -> Iterator[DockerTier]:
    dockerd, docker = _prerequisites()
    started = time.monotonic()
    sweep_dead_tiers(docker)
    stamp = owner.stamp()  # this pytest's: see the module doc
    tmp = Path(tempfile.mkdtemp(prefix=f"sbxc-docker.{stamp}."))
    (tmp / "home" / ".docker").mkdir(parents=True)
    (tmp / "daemon.json").write_text("{}\n")  # never the host's /etc/docker/daemon.json
    host = f"unix://{tmp}/docker.sock"
    env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "DOCKER_HOST": host,
           "HOME": str(tmp / "home"), "DOCKER_CONFIG": str(tmp / "home" / ".docker")}
    daemon: subprocess.Popen[bytes] | None = None
    log = tmp / "dockerd.log"
    tag = secrets.token_hex(4)
    # Without this dockerd files its containers under a `docker` cgroup in every hierarchy of the host
    # and never removes it; a parent named for this run is one teardown can find and remove.
    cgroup_parent = f"sbxc-docker-{stamp}-{tag}"
    try:
        with log.open("wb") as out:
            daemon = subprocess.Popen(
                [dockerd, "--host", host, "--data-root", str(tmp / "data"), "--exec-root", str(tmp / "exec"),
                 "--pidfile", str(tmp / "dockerd.pid"), "--config-file", str(tmp / "daemon.json"),
                 # No docker0 bridge and no iptables chains: nothing on the host outlives the daemon.
                 "--bridge", "none", "--iptables=false", "--ip-masq=false",
                 "--exec-opt", "native.cgroupdriver=cgroupfs", "--cgroup-parent", f"/{cgroup_parent}"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                # SIGTERM when pytest dies: dockerd then stops its containers and containerd. Started
                # from pytest's main thread, which lives as long as the session (processes/children.py).
                preexec_fn=die_with_parent(signal.SIGTERM))
        _wait_for_daemon(docker, env, daemon, log)
        # The script a user runs offline (README, container mode): debootstrap, then `docker import`
        # into this tier's daemon (DOCKER_HOST is in env); it prints the name to build on.
        base = _need(run([str(REPO / "scripts" / "docker-base-image"), "--engine", "docker", str(CACHE)],
                         timeout=1300, env=env),
                     "scripts/docker-base-image (debootstrap, docker import)").stdout.strip().splitlines()[-1]
        image = f"sbxc-tier:{tag}"
        _need(run([docker, "build", "--network", "host", "--tag", image, "--build-arg", f"BASE={base}",
                   "--file", str(REPO / "Dockerfile"), str(REPO)], timeout=1200, env=env),
              "docker build of the Dockerfile")
        yield DockerTier(tmp, docker, host, base, image, time.monotonic() - started, cgroup_parent)
    finally:
        teardown(tmp, daemon, docker, env, cgroup_parent)


@pytest.fixture(scope="session")
def docker_tier() -> Iterator[DockerTier]:
    try:
        cm = docker_tier_up()
        tier = cm.__enter__()
    except Unavailable as e:
        pytest.skip(str(e))
    try:
        print(f"\ndocker tier: up in {tier.setup_seconds:.1f}s (image {tier.image}, base {tier.base})")
        yield tier
    finally:
        cm.__exit__(None, None, None)
