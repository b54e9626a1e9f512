"""Container mode: build the repository's Dockerfile with docker or podman, start one privileged-enough
container with the checkout bound read-only at /src, install the project inside without writing to
the bind, and run the witness suite twice: as root, and as the image's unprivileged user, so the
user-namespace path a deployment really takes is exercised here too. Both verdicts count."""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from probes.run import Completed, run
from runners.stream import stream
from runners.witness_args import WitnessOptions

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TAG = "sandbox-conformance:local"
# The Dockerfile's unprivileged user and the venv it prepares (keep in step with the Dockerfile).
IMAGE_USER = "sbxc"
IMAGE_VENV = "/opt/sandbox-conformance"
INPUTS = "/run/sandbox-conformance/in"
OUTPUTS = "/run/sandbox-conformance/out"
# Client-side variables that say which daemon to talk to and where its config lives.
ENGINE_ENV = ("DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH",
              "CONTAINER_HOST", "CONTAINERS_CONF", "XDG_RUNTIME_DIR", "HOME")


class ContainerError(Exception):
    """The container could not be prepared (build, start, install): nothing was tested."""


@dataclasses.dataclass(frozen=True)
class Engine:
    kind: str  # "docker" | "podman"
    path: str
    env: Mapping[str, str]

    @classmethod
    def from_facts(cls, facts: Mapping[str, object], environ: Mapping[str, str]) -> Engine:
        kind = str(facts.get("cli") or "docker")
        path = str(facts.get("path") or shutil.which(kind) or kind)
        env = {"PATH": environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")}
        env.update({k: environ[k] for k in ENGINE_ENV if k in environ})
        return cls(kind, path, env)


def security_flags(kind: str) -> list[str]:
    """What bwrap needs from the container, and no more than that (no --privileged)."""
    flags = [
        # bwrap as root sets up mounts and namespaces with CAP_SYS_ADMIN; the network rung brings
        # `lo` up in the new net namespace with CAP_NET_ADMIN.
        "--cap-add", "SYS_ADMIN",
        "--cap-add", "NET_ADMIN",
        # Docker's default seccomp profile refuses unshare(CLONE_NEWUSER) (and clone with namespace
        # flags) to a process without CAP_SYS_ADMIN: the unprivileged user could not create the
        # user namespace bwrap starts from.
        "--security-opt", "seccomp=unconfined",
    ]
    if kind == "podman":
        # podman's spelling of the same: unmask every masked /proc and /sys path.
        flags += ["--security-opt", "unmask=ALL"]
    else:
        # Docker masks /proc paths (/proc/kcore, /proc/sys read-only, ...). The kernel refuses a new
        # procfs mount in a pid namespace whose existing /proc has overmounted entries
        # (fs/namespace.c mount_too_revealing()), so `bwrap --unshare-pid --proc /proc` fails with
        # EPERM: only systempaths=unconfined lets it mount a procfs.
        flags += ["--security-opt", "systempaths=unconfined"]
    flags += [
        # The cgroup witnesses need the real hierarchy, writable: the host's cgroup namespace, and
        # /sys/fs/cgroup bound read-write (Docker mounts it read-only without --privileged).
        "--cgroupns=host",
        "--volume", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
    ]
    return flags


def build_argv(engine: Engine, *, tag: str, base: str | None, repo: Path = REPO) -> list[str]:
    argv = [engine.path, "build", "--tag", tag, "--file", str(repo / "Dockerfile")]
    if base:
        argv += ["--build-arg", f"BASE={base}"]
    # Host networking for the build's apt-get: it reaches the mirror whether or not the daemon has
    # a bridge (a daemon started with --bridge none, as the test tier does, to leave no iptables
    # rules or docker0 behind).
    argv += ["--network", "host", str(repo)]
    return argv


def start_argv(engine: Engine, *, name: str, image: str, repo: Path, inputs: Path,
               outputs: Path) -> list[str]:
    # --pull never: the image is the one just built (or named by --image); never reach for a registry.
    return [engine.path, "run", "--detach", "--rm", "--init", "--pull", "never", "--name", name,
            *security_flags(engine.kind),
            "--network", "none",  # the suite makes its own namespaces; it needs no way out
            "--volume", f"{repo}:/src:ro",
            "--volume", f"{inputs}:{INPUTS}:ro",
            "--volume", f"{outputs}:{OUTPUTS}:rw",
            image, "sleep", "infinity"]


# Copy the read-only checkout and install it into the image's venv (made with
# --system-site-packages, so Debian's python3-pytest, -psutil, -pyroute2, -prctl serve as the
# dependencies). --no-deps: pytest-randomly and cgroupspy are not packaged in Debian bookworm and
# PyPI is not reachable from here; nothing imports them at run time (randomly is only a pytest
# plugin when installed). pip builds in the copy, never in /src.
INSTALL_SCRIPT = f"""set -eu
rm -rf /tmp/sbxc-src && mkdir /tmp/sbxc-src
tar -C /src --exclude=./.venv --exclude=./.git --exclude=./build --exclude='*.egg-info' -cf - . \\
    | tar -C /tmp/sbxc-src -xf -
{IMAGE_VENV}/bin/python -m pip install --quiet --no-deps --no-build-isolation --no-index /tmp/sbxc-src
rm -rf /tmp/sbxc-src
"""


def exec_argv(engine: Engine, name: str, argv: Sequence[str], *, user: str | None = None) -> list[str]:
    out = [engine.path, "exec", "--workdir", "/tmp"]
    if user:
        out += ["--user", user, "--env", f"HOME=/home/{user}"]
    return [*out, name, *argv]


def inside_options(options: WitnessOptions, *, label: str,
                   inputs: Path) -> tuple[WitnessOptions, dict[str, str]]:
    """The witness options as seen from inside: input files copied into the read-only inputs bind,
    reports written to the outputs bind as NAME-LABEL.EXT. Returns (options, {inside report: host path})."""
    reports: dict[str, str] = {}

    def infile(path: str | None, key: str) -> str | None:
        if path is None:
            return None
        dest = inputs / f"{key}-{Path(path).name}"
        if not dest.exists():
            shutil.copyfile(path, dest)
        return f"{INPUTS}/{dest.name}"

    def outfile(path: str | None, key: str) -> str | None:
        if path is None:
            return None
        p = Path(path)
        host = p.with_name(f"{p.stem}-{label}{p.suffix}")
        inside = f"{OUTPUTS}/{key}-{label}{p.suffix}"
        reports[inside] = str(host)
        return inside

    return dataclasses.replace(
        options,
        profile=infile(options.profile, "profile"),
        expected_skips=infile(options.expected_skips, "expected-skips"),
        junitxml=outfile(options.junitxml, "junit"),
        json=outfile(options.json, "report"),
        as_user=None,
    ), reports


@dataclasses.dataclass(frozen=True)
class Leg:
    label: str  # "root" or the image user
    returncode: int | None


def combine(legs: Sequence[Leg]) -> int:
    """Both verdicts count: any red is red (1), then bad input (2), then did-not-run (75)."""
    codes = [1 if leg.returncode is None else leg.returncode for leg in legs]
    for wanted in (1, 2, 75):
        if wanted in codes:
            return wanted
    return 0 if codes and all(c == 0 for c in codes) else 1


def _check(c: Completed, what: str) -> Completed:
    if not c.ok:
        why = "timed out" if c.timed_out else f"exit {c.returncode}"
        raise ContainerError(f"{what} failed ({why}): {c.stderr_tail(4) or c.stdout.strip()[-300:]}")
    return c


def build_image(engine: Engine, *, tag: str, base: str | None, timeout: float) -> str:
    c = run(build_argv(engine, tag=tag, base=base), timeout=timeout, env=engine.env)
    _check(c, f"{engine.kind} build of {REPO / 'Dockerfile'}")
    return tag


def run_container(engine: Engine, options: WitnessOptions, *, image: str, timeout: float,
                  say: Callable[[str], None]) -> list[Leg]:
    name = f"sandbox-conformance-{secrets.token_hex(4)}"
    with tempfile.TemporaryDirectory(prefix="sbxc-container.") as tmp:
        inputs, outputs = Path(tmp, "in"), Path(tmp, "out")
        inputs.mkdir()
        outputs.mkdir()
        # The image user writes its reports here (bind mounts keep host ownership and modes).
        os.chmod(outputs, 0o1777)
        os.chmod(inputs, 0o755)
        try:
            _check(run(start_argv(engine, name=name, image=image, repo=REPO, inputs=inputs, outputs=outputs),
                       timeout=120, env=engine.env), f"starting a container from {image}")
            _check(run(exec_argv(engine, name, ["sh", "-c", INSTALL_SCRIPT]), timeout=300, env=engine.env),
                   "installing the project inside the container")
            legs = []
            for label, user in (("root", None), (IMAGE_USER, IMAGE_USER)):
                opts, reports = inside_options(options, label=label, inputs=inputs)
                say(f"container: witness suite as {label}")
                rc = stream(exec_argv(engine, name, [f"{IMAGE_VENV}/bin/sandbox-conformance", "witness",
                                                     *opts.argv()], user=user),
                            timeout=timeout, env=engine.env)
                legs.append(Leg(label, rc))
                say(f"container: as {label}: " + ("timed out" if rc is None else f"exit {rc}"))
                for inside, host in reports.items():
                    produced = outputs / Path(inside).name
                    if produced.exists():
                        shutil.copyfile(produced, host)
            return legs
        finally:
            # --rm removes it once stopped; `rm --force` stops it whatever state it is in.
            run([engine.path, "rm", "--force", name], timeout=60, env=engine.env)
