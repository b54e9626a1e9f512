"""Container mode: build the repository's Dockerfile with docker or podman, start one privileged-enough
container with the checkout bound read-only at /src, install the project inside without writing to
the bind, run the cgroup set-up step (runners.cgroup_setup) once, and the witness suite twice: as root, and
with every task launched as the image's unprivileged user, so the user-namespace path a deployment
really takes is exercised here too. Both verdicts count.

The set-up says either which cgroup root it exported (the cgroup witnesses then run in both legs) or
why it could not (they skip with that reason, the rest of the suite runs); the runner prints that
line, so a user sees why. On a hybrid host (memory bound to cgroup v1) the container's
/sys/fs/cgroup is a tmpfs of v1 hierarchies and the set-up refuses before any write."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from sandbox_conformance.kernel.cgroupfs import PROMISE_ENV
from sandbox_conformance.processes import cancel, owner
from sandbox_conformance.processes.children import Completed, run
from sandbox_conformance.processes.exits import EXIT_FAIL, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE, Refusal
from sandbox_conformance.runners.progress import HEARTBEAT, Progress, result_word
from sandbox_conformance.runners.witness_args import WitnessOptions

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TAG = "sandbox-conformance:local"
# Debootstraps a Debian base from the host's apt mirror and imports it into the engine: the way on
# for a machine that reaches a mirror but no container registry.
BASE_SCRIPT = REPO / "scripts" / "docker-base-image"
PULL_TIMEOUT = 600.0
BUILD_TIMEOUT = 1800.0
NAME_PREFIX = "sandbox-conformance-"  # + the owner's stamp (processes/owner.py) + 8 hex
# The Dockerfile's unprivileged user and the venv it prepares (keep in step with the Dockerfile).
IMAGE_USER = "sbxc"
IMAGE_VENV = "/opt/sandbox-conformance"
INPUTS = "/run/sandbox-conformance/in"
OUTPUTS = "/run/sandbox-conformance/out"
# Client-side variables that say which daemon to talk to and where its config lives.
ENGINE_ENV = ("DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH",
              "CONTAINER_HOST", "CONTAINERS_CONF", "XDG_RUNTIME_DIR", "HOME")
# Our own switches that mean the same inside as outside: native mode inherits them with the rest of the
# environment; `docker exec` starts from the image's environment, so they are passed on by name.
FORWARD_ENV = ("SANDBOX_CONFORMANCE_REQUIRE",)
# The set-up step, run as root inside the container once the project is installed there.
SETUP_ARGV = (f"{IMAGE_VENV}/bin/python", "-m", "sandbox_conformance.runners.cgroup_setup", "--in",
              "container")
SETUP_TIMEOUT = 60


class ContainerUnusable(Refusal):
    """The container could not be prepared (build, start, install): nothing was tested. A Refusal
    (processes/exits.py): the message is the reason, with the ways on."""


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
    """What bwrap and the cgroup set-up need from the container, and no more than that (no --privileged)."""
    flags = [
        # bwrap as root sets up mounts and namespaces with CAP_SYS_ADMIN; the cgroup set-up needs it to
        # remount the engine's read-only /sys/fs/cgroup read-write (mount(2) MS_REMOUNT). The network
        # rung brings `lo` up in the new net namespace with CAP_NET_ADMIN.
        "--cap-add", "SYS_ADMIN",
        "--cap-add", "NET_ADMIN",
        # The host-side observer (conformance/observer.py) reads each task's /proc/PID/ns, environ and
        # mountinfo; for a task of another uid (the unprivileged leg) that is a ptrace read access
        # check, PTRACE_MODE_READ_FSCREDS, which root passes only with CAP_SYS_PTRACE (ptrace(2)).
        "--cap-add", "SYS_PTRACE",
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
        # A cgroup namespace of the container's own, rooted at the cgroup the engine made for it
        # (cgroup_namespaces(7)): the /sys/fs/cgroup the engine mounts inside shows that cgroup as
        # its root, so the set-up's moves, mkdirs and subtree_control writes land in the container's
        # own subtree, which the engine removes with the container, and never in the host's tree.
        # Spelled out because it is the default only on a cgroup v2 host (Docker >= 20.10, podman);
        # on a v1 or hybrid host both default to the host's namespace. Nothing of the host's
        # /sys/fs/cgroup is bound in: runners.cgroup_setup refuses in the host's namespace anyway.
        "--cgroupns=private",
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
# --system-site-packages, so Debian's python3-pytest, -pytest-timeout, -psutil, -prctl serve as the
# dependencies). --no-deps: PyPI is not reachable from here, and the dev extra (ruff, jsonschema,
# pytest-randomly) is for the project's own tests, not for a run. pip builds in the copy, never in
# /src.
INSTALL_SCRIPT = f"""set -eu
rm -rf /tmp/sbxc-src && mkdir /tmp/sbxc-src
tar -C /src --exclude=./.venv --exclude=./.git --exclude=./build --exclude='*.egg-info' -cf - . \\
    | tar -C /tmp/sbxc-src -xf -
{IMAGE_VENV}/bin/python -m pip install --quiet --no-deps --no-build-isolation --no-index /tmp/sbxc-src
rm -rf /tmp/sbxc-src
"""


def exec_argv(engine: Engine, name: str, argv: Sequence[str], *, user: str | None = None,
              env: Mapping[str, str] | None = None) -> list[str]:
    out = [engine.path, "exec", "--workdir", "/tmp"]
    if user:
        out += ["--user", user, "--env", f"HOME=/home/{user}"]
    for key, value in (env or {}).items():
        out += ["--env", f"{key}={value}"]
    return [*out, name, *argv]


@dataclasses.dataclass(frozen=True)
class CgroupSetup:
    """What the set-up step said: the cgroup root it exported, or why the cgroup witnesses cannot run."""
    root: str | None
    reason: str  # one line

    def describe(self) -> str:
        if self.root:
            return f"exported {PROMISE_ENV}={self.root}"
        return f"cgroup witnesses unavailable: {self.reason}"

    def env(self) -> dict[str, str]:
        """For the witness legs: the promise, only when the set-up proved it."""
        return {PROMISE_ENV: self.root} if self.root else {}


def read_setup(c: Completed) -> CgroupSetup:
    """The set-up's verdict from its exit and output (runners.cgroup_setup.main): 0 and
    `SANDBOX_CONFORMANCE_CGROUP_ROOT=<path>` on stdout, or 75 and one `cgroup witnesses unavailable: why`
    line on stderr. Anything else (a crash, a timeout, an image without the module) is a reason too:
    the witnesses lose their root, the rest of the suite still runs."""
    if c.timed_out:
        return CgroupSetup(None, f"the set-up step timed out after {SETUP_TIMEOUT}s")
    if c.returncode == 0:
        for line in c.stdout.splitlines():
            key, sep, value = line.strip().partition("=")
            if sep and key == PROMISE_ENV and value.startswith("/"):
                return CgroupSetup(value, f"set-up proved a memory.max write under {value}")
        return CgroupSetup(None, f"the set-up step exited 0 without exporting {PROMISE_ENV}: "
                                 f"{c.stdout.strip()[-200:] or '(no output)'}")
    marker = "cgroup witnesses unavailable: "
    for line in reversed(c.stderr.splitlines()):
        if marker in line:
            return CgroupSetup(None, line.split(marker, 1)[1].strip())
    return CgroupSetup(None, f"the set-up step exited {c.returncode}: {c.stderr_tail(2) or '(no output)'}")


def annotate_report(path: Path, setup: CgroupSetup) -> None:
    """Add what the set-up said to a leg's JSON report, next to the witnesses it explains: a skipped
    cgroup witness names the probe's view from inside; this names the step that made (or could not
    make) the root."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return  # a leg that crashed mid-write: its exit code already says so
    if isinstance(doc, dict):
        doc["cgroup_setup"] = {"root": setup.root, "reason": setup.reason}
        path.write_text(json.dumps(doc, indent=2) + "\n")


def cgroup_setup(engine: Engine, name: str) -> CgroupSetup:
    """Run the set-up once, as root, in its own exec, before either leg.

    It moves every process of the container's cgroup (the init and `sleep`) into `supervisor/` and
    enables controllers in that cgroup's subtree_control; after that the kernel refuses new processes
    there (EBUSY, the no-internal-process rule), and each later `exec` joins the init's cgroup instead
    (runc since 1.0.0-rc91, opencontainers/runc#2416; crun likewise, containers/crun#365). Both legs then
    share the one root it exported."""
    return read_setup(run(exec_argv(engine, name, SETUP_ARGV), timeout=SETUP_TIMEOUT, env=engine.env))


def inside_options(options: WitnessOptions, *, label: str,
                   inputs: Path) -> tuple[WitnessOptions, dict[str, str]]:
    """The witness options as seen from inside: input files copied into the read-only inputs bind,
    reports written to the outputs bind as NAME-LABEL.EXT. Returns (options, {inside report: host path})."""
    reports: dict[str, str] = {}

    def infile(path: str, key: str) -> str:
        dest = inputs / f"{key}-{Path(path).name}"
        if not dest.exists():
            shutil.copyfile(path, dest)
        return f"{INPUTS}/{dest.name}"

    def outfile(path: str, key: str) -> str:
        p = Path(path)
        host = p.with_name(f"{p.stem}-{label}{p.suffix}")
        inside = f"{OUTPUTS}/{key}-{label}{p.suffix}"
        reports[inside] = str(host)
        return inside

    return options.relocated(infile, outfile), reports


# The two legs, (label, --as-user). Both run the witness command as root: only root can make a task's
# leaf under the set-up's tasks/ and move the task into it (a migration needs write access to
# cgroup.procs of the common ancestor, here the namespace root: cgroup-v2.rst "Delegation
# Containment"). The image user's leg launches every task as that user through setpriv, entered into
# its leaf first, so bwrap still starts with no capability and makes its own user namespace: the
# path an unprivileged deployment takes, with the cgroup witnesses able to run in it.
LEGS: tuple[tuple[str, str | None], ...] = (("root", None), (IMAGE_USER, IMAGE_USER))


@dataclasses.dataclass(frozen=True)
class Leg:
    label: str  # "root" or the image user
    returncode: int | None
    report: str | None = None  # its --json report, copied back to this host; None: it wrote none


def combine(legs: Sequence[Leg]) -> int:
    """Both verdicts count: any red is red (1), then bad input (2), then did-not-run (75)."""
    codes = [EXIT_FAIL if leg.returncode is None else leg.returncode for leg in legs]
    for wanted in (EXIT_FAIL, EXIT_USAGE, EXIT_UNAVAILABLE):
        if wanted in codes:
            return wanted
    return EXIT_OK if codes and all(c == EXIT_OK for c in codes) else EXIT_FAIL


def _failed(c: Completed) -> str:
    """A failed step's end, for its progress line (the error itself is the ContainerUnusable's)."""
    return "failed: timed out" if c.timed_out else f"failed: exit {c.returncode}"


def _check(c: Completed, what: str) -> Completed:
    if not c.ok:
        why = "timed out" if c.timed_out else f"exit {c.returncode}"
        raise ContainerUnusable(f"{what} failed ({why}): {c.stderr_tail(4) or c.stdout.strip()[-300:]}")
    return c


_ARG_BASE = re.compile(r"^\s*ARG\s+BASE=(\S+)\s*$", re.MULTILINE | re.IGNORECASE)


def dockerfile_base(dockerfile: Path) -> str | None:
    """The Dockerfile's default BASE (`ARG BASE=debian:bookworm-slim`), or None without one."""
    try:
        m = _ARG_BASE.search(dockerfile.read_text())
    except OSError:
        return None
    return m[1] if m else None


def has_image(engine: Engine, name: str) -> bool:
    """`image inspect` exits 0 only for an image in the engine's local store (docker and podman alike):
    asked before a build, so an offline machine learns what is missing before a build fails on it."""
    return run([engine.path, "image", "inspect", "--format", "{{.Id}}", name], timeout=60,
               env=engine.env).ok


def base_ways_on(engine: Engine) -> tuple[str, ...]:
    return (f'--base-image "$({BASE_SCRIPT} --engine {engine.kind})": debootstrap a Debian bookworm base '
            f"from this host's apt mirror and import it into {engine.kind} (no registry needed; root)",
            f"--base-image NAME: a Debian-based image already on the engine (`{engine.kind} images`)",
            "--image NAME: an image already built from this Dockerfile")


def ensure_base(engine: Engine, base: str | None, *, say: Callable[[str], None],
                dockerfile: Path = REPO / "Dockerfile", progress: Progress | None = None) -> None:
    """The build's base image on the engine, pulled first if it is not there: a pull that fails
    (no registry reachable) is a refusal naming `--base-image` and the script that makes one offline,
    instead of a build failing with the registry's error."""
    name = base or dockerfile_base(dockerfile)
    if name is None or has_image(engine, name):
        return
    say(f"container: pulling {name} (not on the {engine.kind} engine yet)")
    with (progress or Progress.off()).stage("container base image pull", heartbeat=HEARTBEAT) as st:
        c = run([engine.path, "pull", name], timeout=PULL_TIMEOUT, env=engine.env)
        st.result = name if c.ok else _failed(c)
    if c.ok:
        return
    why = (f"timed out after {PULL_TIMEOUT:.0f}s" if c.timed_out
           else c.stderr_tail(1) or f"exit {c.returncode}")
    which = "the base image" if base else "the Dockerfile's base image"
    raise ContainerUnusable(f"{which} {name} is not on the {engine.kind} engine and pulling it failed "
                         f"(is a registry reachable from here?): {why}", base_ways_on(engine))


def build_image(engine: Engine, *, base: str | None, say: Callable[[str], None], tag: str = DEFAULT_TAG,
                timeout: float = BUILD_TIMEOUT, repo: Path = REPO, progress: Progress | None = None) -> str:
    """The repository's Dockerfile built as `tag` on `base` (None: the Dockerfile's default). On a
    terminal the pull and the build are progress stages, the build with a heartbeat: a first build
    (apt-get in the image) takes minutes with nothing on the screen, since its output is captured."""
    progress = progress or Progress.off()
    dockerfile = repo / "Dockerfile"
    if not dockerfile.is_file():
        raise ContainerUnusable(f"no Dockerfile at {repo}: container mode needs the checkout",
                             ("--image NAME: an image already built from the project's Dockerfile",))
    ensure_base(engine, base, say=say, dockerfile=dockerfile, progress=progress)
    shown = base or dockerfile_base(dockerfile) or "the Dockerfile's default"
    say(f"container: building {tag} with {engine.kind} (BASE={shown})")
    with progress.stage("container image build", heartbeat=HEARTBEAT) as st:
        c = run(build_argv(engine, tag=tag, base=base, repo=repo), timeout=timeout, env=engine.env)
        st.result = tag if c.ok else _failed(c)
    _check(c, f"{engine.kind} build of {dockerfile}")
    return tag


def run_container(engine: Engine, options: WitnessOptions, *, image: str, timeout: float,
                  say: Callable[[str], None], environ: Mapping[str, str] | None = None,
                  progress: Progress | None = None) -> list[Leg]:
    """On a terminal (`progress`): the start and install, the set-up and each leg are stages, each
    leg's ending with its verdict word."""
    environ = os.environ if environ is None else environ
    progress = progress or Progress.off()
    forward = {k: environ[k] for k in FORWARD_ENV if k in environ}
    owner.sweep_once()
    sweep_containers(engine, say)
    # The owner's stamp in both names: what a SIGKILL leaves is swept by the next run (the directory
    # by any, the container by the next container-mode run with this engine: processes/owner.py).
    name = f"{NAME_PREFIX}{owner.stamp()}-{secrets.token_hex(4)}"
    rm_argv = [engine.path, "rm", "--force", name]
    with tempfile.TemporaryDirectory(prefix=f"sbxc-container.{owner.stamp()}.") as tmp:
        inputs, outputs = Path(tmp, "in"), Path(tmp, "out")
        inputs.mkdir()
        outputs.mkdir()
        # The image user writes its reports here (bind mounts keep host ownership and modes).
        os.chmod(outputs, 0o1777)
        os.chmod(inputs, 0o755)
        # Removed on the way out (below), or by the guardian if we are SIGKILLed: a container is the
        # engine's child, not ours, so no parent-death signal or group kill of ours reaches it.
        undo = cancel.undo_on_death(rm_argv, env=engine.env, timeout=60)
        try:
            with progress.stage("container start") as st:
                _check(run(start_argv(engine, name=name, image=image, repo=REPO, inputs=inputs,
                                      outputs=outputs),
                           timeout=120, env=engine.env), f"starting a container from {image}")
                _check(run(exec_argv(engine, name, ["sh", "-c", INSTALL_SCRIPT]), timeout=300,
                           env=engine.env), "installing the project inside the container")
                st.result = f"{image}, project installed"
            with progress.stage("container cgroup set-up") as st:
                setup = cgroup_setup(engine, name)
                st.result = f"root {setup.root}" if setup.root else "cgroup witnesses unavailable"
            say(f"container: cgroup set-up: {setup.describe()}")
            legs = []
            for label, as_user in LEGS:
                opts, reports = inside_options(options, label=label, inputs=inputs)
                opts = opts._replace(as_user=as_user)
                say(f"container: witness suite as {label}"
                    + (f" (harness as root, every task launched as {as_user})" if as_user else ""))
                with progress.stage(f"container as {label}", heartbeat=HEARTBEAT) as st:
                    rc = run(exec_argv(engine, name, [f"{IMAGE_VENV}/bin/sandbox-conformance", "witness",
                                                      *opts.argv()], env={**forward, **setup.env()}),
                             timeout=timeout, env=engine.env, capture=False).returncode
                    st.result = result_word(rc)
                say(f"container: as {label}: " + ("timed out" if rc is None else f"exit {rc}"))
                report = None
                for inside, host in reports.items():
                    produced = outputs / Path(inside).name
                    if produced.exists():
                        shutil.copyfile(produced, host)
                        if inside == opts.json:
                            annotate_report(Path(host), setup)
                            report = host
                legs.append(Leg(label, rc, report))
            if setup.root is None:
                # Again after the legs' long output, next to the verdict: why the cgroup witnesses skipped.
                say(f"container: note: {setup.describe()}")
            return legs
        finally:
            # --rm removes it once stopped; `rm --force` stops it whatever state it is in. A
            # cancelled run comes through here too, and everything in the container goes with it.
            run(rm_argv, timeout=60, env=engine.env)
            cancel.done(undo)


def sweep_containers(engine: Engine, say: Callable[[str], None]) -> None:
    """Remove our containers whose run is gone (SIGKILLed, with its guardian): never another live
    run's, nor a container we did not name."""
    listed = run([engine.path, "ps", "--all", "--filter", f"name={NAME_PREFIX}o", "--format", "{{.Names}}"],
                 timeout=30, env=engine.env)
    for name in listed.stdout.split() if listed.ok else []:
        found = owner.find(name.removeprefix(NAME_PREFIX))
        if name.startswith(NAME_PREFIX) and found is not None and owner.gone(found):
            done = run([engine.path, "rm", "--force", name], timeout=60, env=engine.env)
            say(f"container: swept {name}: its run (pid {found.pid}) is gone"
                + ("" if done.ok else f" (rm failed: {done.stderr_tail(1)})"))
