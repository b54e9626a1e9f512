"""Adapters: sandboxes this project did not write, each as an external-launcher prefix plus a
profile of what that tool promises under the options the prefix uses.

    adapters="python -m sandbox_conformance.conformance.adapters"
    sandbox-conformance witness --profile "$($adapters profile unshare)" \\
        --launcher "$($adapters launcher unshare)" --launcher-spec --launcher-stdin

or `resolve(name)` from Python. An adapter that cannot run here raises `Unavailable` with the one
line a person can act on (the witness command turns it into exit 75; tests skip with it).

A profile promises only what the tool gives under those options; where it is narrower than the
reference profile, the profile says why (the tool never claimed that promise). A promise the tool
claims but does not keep is a red witness, never a narrower profile."""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path

from sandbox_conformance.conformance.adapters._unavailable import Unavailable as Unavailable


@dataclasses.dataclass(frozen=True)
class Resolved:
    name: str
    profile: Path  # a TOML file conformance.profile.load reads
    launcher: str  # the --launcher prefix (placeholders unexpanded)
    # Why the host cannot observe this sandbox's tasks (a user-space kernel), or None: witness's
    # --host-cannot-observe, which the adapter sets.
    host_cannot_observe: str | None = None

    def witness_args(self) -> list[str]:
        # An adapter builds the tool's configuration from the task spec and hands the program on stdin.
        unseen = ["--host-cannot-observe", self.host_cannot_observe] if self.host_cannot_observe else []
        return [
            "--profile", str(self.profile),
            "--launcher", self.launcher,
            "--launcher-spec", "--launcher-stdin",
            *unseen,
        ]


@dataclasses.dataclass(frozen=True)
class Adapter:
    name: str
    summary: str
    profile: str  # file name in conformance/adapters/
    # (as_user, env) -> the launcher prefix; raises Unavailable
    prefix: Callable[[str | None, Mapping[str, str]], str]
    host_cannot_observe: str | None = None


def profile_path(file: str) -> Path:
    """The packaged profile as a real path (package data; an editable or a wheel install alike)."""
    ref = resources.files("sandbox_conformance.conformance.adapters") / file
    return Path(str(ref))


def _python() -> str:
    # The interpreter that has this package installed: the launcher helper modules run under it.
    return sys.executable or "python3"


def _unshare(as_user: str | None, env: Mapping[str, str]) -> str:
    from sandbox_conformance.conformance.adapters import unshare

    return unshare.prefix()


def _oci(runtime: str) -> Callable[[str | None, Mapping[str, str]], str]:
    def build(as_user: str | None, env: Mapping[str, str]) -> str:
        from sandbox_conformance.conformance.adapters import oci

        euid = os.geteuid() if as_user is None else 1  # any non-root uid: --as-user runs it rootless
        why = oci.unavailable(runtime, euid=euid)
        if why:
            raise Unavailable(why)
        return shlex.join([_python(), "-m", "sandbox_conformance.conformance.adapters.oci", "--runtime",
                           runtime,
                           "--"])

    return build


def _systemd_run(as_user: str | None, env: Mapping[str, str]) -> str:
    from sandbox_conformance.conformance.adapters import systemd_run

    return systemd_run.prefix()


def _docker(as_user: str | None, env: Mapping[str, str]) -> str:
    from sandbox_conformance.conformance.adapters import docker

    return docker.prefix(env)


def _podman(as_user: str | None, env: Mapping[str, str]) -> str:
    from sandbox_conformance.conformance.adapters import podman

    why = podman.unavailable(env)
    if why:
        raise Unavailable(why)
    return shlex.join([_python(), "-m", "sandbox_conformance.conformance.adapters.podman", "--"])


def _firejail(as_user: str | None, env: Mapping[str, str]) -> str:
    from sandbox_conformance.conformance.adapters import firejail

    return firejail.prefix(as_user)


def _nspawn(as_user: str | None, env: Mapping[str, str]) -> str:
    # Not root (as a user, or --as-user): the launcher itself exits 75 with the reason, so a run says
    # "did not run" once (docs/launchers.md); only a missing tool stops it here.
    if shutil.which("systemd-nspawn", path=env.get("PATH")) is None:
        raise Unavailable(
            "systemd-nspawn not installed (apt-get install --no-install-recommends systemd-container)"
        )
    return shlex.join([_python(), "-m", "sandbox_conformance.conformance.adapters.nspawn", "--"])


def _srt(as_user: str | None, env: Mapping[str, str]) -> str:
    from sandbox_conformance.conformance.adapters import srt

    return srt.prefix(env)


def _codex(as_user: str | None, env: Mapping[str, str]) -> str:
    from sandbox_conformance.conformance.adapters import codex

    return codex.prefix(env)


GVISOR_UNSEEN = (
    "gVisor: the task runs on the Sentry, a user-space kernel; this kernel sees only the Sentry and its "
    "gofer, never a process with the task's tag"
)

ADAPTERS: Mapping[str, Adapter] = {
    a.name: a
    for a in (
        Adapter(
            "unshare", "util-linux unshare(1): user, net, pid, ipc, uts namespaces", "unshare.toml", _unshare
        ),
        Adapter(
            "runc", "runc run of a generated OCI bundle (rootless: needs --as-user)", "oci.toml", _oci("runc")
        ),
        Adapter("crun", "crun run of a generated OCI bundle (as root)", "oci.toml", _oci("crun")),
        Adapter(
            "runsc",
            "gVisor runsc run of the same OCI bundle (as root; rootless where it can)",
            "runsc.toml",
            _oci("runsc"),
            host_cannot_observe=GVISOR_UNSEEN,
        ),
        Adapter(
            "systemd-run",
            "a transient systemd service with sandboxing properties",
            "systemd-run.toml",
            _systemd_run,
        ),
        Adapter("docker", "docker run with chosen flags against $DOCKER_HOST", "docker.toml", _docker),
        Adapter(
            "podman",
            "podman run --rootfs of a per-launch directory (rootful; rootless with --as-user)",
            "podman.toml",
            _podman,
        ),
        Adapter(
            "firejail",
            "firejail (setuid): state read-only, db masked, no network, private ipc/uts, no caps",
            "firejail.toml",
            _firejail,
        ),
        Adapter(
            "nspawn",
            "systemd-nspawn -D / --volatile=yes, as root (a user: did not run, exit 75)",
            "nspawn.toml",
            _nspawn,
        ),
        Adapter(
            "srt",
            "Anthropic sandbox-runtime (srt): bwrap, deny-read tmpfs, network via its proxy",
            "srt.toml",
            _srt,
        ),
        Adapter(
            "codex",
            "OpenAI Codex CLI `codex sandbox` (Linux): bwrap + seccomp, a permissions profile per task",
            "codex.toml",
            _codex,
        ),
    )
}


def resolve(name: str, *, as_user: str | None = None, env: Mapping[str, str] | None = None) -> Resolved:
    """The witness arguments for adapter `name`; KeyError for an unknown name, Unavailable when it
    cannot run here."""
    try:
        adapter = ADAPTERS[name]
    except KeyError:
        raise KeyError(f"no adapter {name!r} (known: {', '.join(ADAPTERS)})") from None
    prefix = adapter.prefix(as_user, os.environ if env is None else env)
    return Resolved(name, profile_path(adapter.profile), prefix, adapter.host_cannot_observe)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m sandbox_conformance.conformance.adapters (list | profile NAME | launcher NAME | args NAME)
    [--as-user U]`."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m sandbox_conformance.conformance.adapters",
                                description=main.__doc__)
    p.add_argument("what", choices=("list", "profile", "launcher", "args"))
    p.add_argument("name", nargs="?")
    p.add_argument("--as-user", metavar="NAME", help="the user the witness will launch tasks as")
    a = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    if a.what == "list":
        for ad in ADAPTERS.values():
            print(f"{ad.name}\t{ad.summary}")
        return 0
    if a.name is None:
        p.error(f"{a.what}: which adapter? ({', '.join(ADAPTERS)})")
    try:
        r = resolve(a.name, as_user=a.as_user)
    except KeyError as e:
        print(f"sandbox-conformance: {e.args[0]}", file=sys.stderr)
        return 2
    except Unavailable as e:
        print(f"sandbox-conformance: adapter {a.name}: not tested: {e}", file=sys.stderr)
        return 75
    args = r.witness_args() + (["--as-user", a.as_user] if a.as_user else [])
    print({"profile": str(r.profile), "launcher": r.launcher, "args": shlex.join(args)}[a.what])
    return 0
