"""Container mode's cgroup set-up, without an engine: the flags the container is started with, how the
set-up step's exit and output are read, and how its verdict reaches the user, the legs and the reports.
The end-to-end half (a real dockerd) is in test_runner_container.py."""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox_conformance.kernel.cgroupfs import PROMISE_ENV as ENV_ROOT
from sandbox_conformance.processes.children import Completed
from sandbox_conformance.runners import container
from sandbox_conformance.runners.container import CgroupSetup, Engine, read_setup, security_flags
from sandbox_conformance.runners.progress import Progress
from sandbox_conformance.runners.witness_args import WitnessOptions

TMPFS_REASON = ("/sys/fs/cgroup is tmpfs, not cgroup2 (a v1 or hybrid layout cannot delegate memory to a "
                "v2 leaf)")


def completed(rc: int | None, out: str = "", err: str = "", *, timed_out: bool = False) -> Completed:
    return Completed(("docker", "exec"), rc, out, err, 0.1, timed_out=timed_out)


@pytest.mark.parametrize("kind", ["docker", "podman"])
def test_the_container_gets_a_cgroup_namespace_of_its_own_and_never_the_hosts_tree(kind: str) -> None:
    flags = security_flags(kind)
    pairs = list(itertools.pairwise(flags))
    assert "--cgroupns=private" in flags
    assert not any(f.startswith("--cgroupns=") and f != "--cgroupns=private" for f in flags)
    # No bind of the host's hierarchy, in any spelling: the engine mounts the namespace's own.
    assert not any("/sys/fs/cgroup" in f for f in flags), flags
    # The remount the set-up needs and bwrap's mounts both need CAP_SYS_ADMIN; nothing broader.
    assert ("--cap-add", "SYS_ADMIN") in pairs
    assert "--privileged" not in flags
    start = container.start_argv(Engine(kind, f"/usr/bin/{kind}", {}), name="n", image="img",
                                 repo=Path("/co"), inputs=Path("/i"), outputs=Path("/o"))
    assert "--cgroupns=private" in start and not any("/sys/fs/cgroup" in a for a in start)


@pytest.mark.parametrize(("c", "root", "reason_has"), [
    (completed(0, f"{ENV_ROOT}=/sys/fs/cgroup/tasks\n"), "/sys/fs/cgroup/tasks", "memory.max"),
    (completed(75, err=f"sandbox-conformance: cgroup witnesses unavailable: {TMPFS_REASON}\n"),
     None, TMPFS_REASON),
    (completed(75, err="sandbox-conformance: cgroup witnesses unavailable: /sys/fs/cgroup is read-only and "
                       "remount,rw failed (mount: permission denied): the container needs CAP_SYS_ADMIN\n"),
     None, "needs CAP_SYS_ADMIN"),
    (completed(None, timed_out=True), None, "timed out"),
    # Exit 0 but no root line, or a relative one: not a proof, so no promise is passed on.
    (completed(0, "something else\n"), None, "without exporting"),
    (completed(0, f"{ENV_ROOT}=tasks\n"), None, "without exporting"),
    # An image without the module, or a crash: the reason is its last stderr line.
    (completed(1, err="Traceback (most recent call last):\nModuleNotFoundError: No module named 'runners'\n"),
     None, "No module named 'runners'"),
    (completed(126, err='OCI runtime exec failed: exec: "/opt/x/bin/python": no such file\n'),
     None, "exited 126"),
])
def test_the_setup_verdict_is_read_from_its_exit_and_output(c: Completed, root: str | None,
                                                            reason_has: str) -> None:
    got = read_setup(c)
    assert got.root == root
    assert reason_has in got.reason
    assert "\n" not in got.reason


def test_only_a_proved_root_is_passed_to_the_legs() -> None:
    ok = CgroupSetup("/sys/fs/cgroup/tasks", "proved")
    assert ok.env() == {ENV_ROOT: "/sys/fs/cgroup/tasks"}
    assert ok.describe() == f"exported {ENV_ROOT}=/sys/fs/cgroup/tasks"
    lost = CgroupSetup(None, TMPFS_REASON)
    assert lost.env() == {}
    assert lost.describe() == f"cgroup witnesses unavailable: {TMPFS_REASON}"


# An engine that records each command line and answers the set-up step as told (FAKE_SETUP): ok,
# refused, or a crash. Everything else succeeds; a leg asked for a JSON report writes one into the
# outputs directory the runner bound at `run`, as the real witness command would from inside.
FAKE_ENGINE = """\
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
state = os.environ["FAKE_LOG"] + ".outputs"
if args[0] == "run":
    bind = next(a for a in args if a.endswith(":" + os.environ["FAKE_INSIDE_OUT"] + ":rw"))
    with open(state, "w") as f:
        f.write(bind.split(":")[0])
if args[0] == "exec" and "sandbox_conformance.runners.cgroup_setup" in args:
    how = os.environ["FAKE_SETUP"]
    if how == "ok":
        print("SANDBOX_CONFORMANCE_CGROUP_ROOT=/sys/fs/cgroup/tasks")
        sys.exit(0)
    if how == "refused":
        why = os.environ["FAKE_REASON"]
        print("sandbox-conformance: cgroup witnesses unavailable: " + why, file=sys.stderr)
        sys.exit(75)
    print("Traceback (most recent call last):\\nRuntimeError: boom", file=sys.stderr)
    sys.exit(1)
if args[0] == "exec" and "witness" in args and "--json" in args:
    inside = args[args.index("--json") + 1]
    with open(os.path.join(open(state).read(), os.path.basename(inside)), "w") as f:
        json.dump({"version": 1, "exit": 0}, f)
sys.exit(0)
"""


@pytest.fixture
def fake_engine(tmp_path: Path) -> Callable[..., tuple[Engine, Path]]:
    script = tmp_path / "fake-docker"
    script.write_text(f"#!{sys.executable}\n{FAKE_ENGINE}")
    script.chmod(0o755)
    log = tmp_path / "engine.log"

    def make(how: str, reason: str = TMPFS_REASON) -> tuple[Engine, Path]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "FAKE_LOG": str(log), "FAKE_SETUP": how,
               "FAKE_REASON": reason, "FAKE_INSIDE_OUT": container.OUTPUTS}
        return Engine("docker", str(script), env), log

    return make


def _run(engine: Engine, tmp_path: Path, *, environ: dict[str, str] | None = None,
         options: WitnessOptions | None = None) -> tuple[list[container.Leg], list[str]]:
    said: list[str] = []
    legs = container.run_container(engine, options or WitnessOptions(), image="img", timeout=60,
                                   say=said.append, environ=environ or {})
    return legs, said


def _commands(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def _legs(log: Path) -> list[list[str]]:
    return [c for c in _commands(log) if c[0] == "exec" and "witness" in c]


def test_a_proved_root_is_announced_and_exported_to_both_legs(fake_engine, tmp_path: Path) -> None:
    engine, log = fake_engine("ok")
    legs, said = _run(engine, tmp_path)
    assert [leg.returncode for leg in legs] == [0, 0]
    assert f"container: cgroup set-up: exported {ENV_ROOT}=/sys/fs/cgroup/tasks" in said
    cmds = _commands(log)
    setup_at = next(i for i, c in enumerate(cmds) if "sandbox_conformance.runners.cgroup_setup" in c)
    install_at = next(i for i, c in enumerate(cmds) if c[0] == "exec" and "sh" in c)
    leg_at = [i for i, c in enumerate(cmds) if c[0] == "exec" and "witness" in c]
    # Installed first (the module comes from the checkout), set up once, then both legs.
    assert install_at < setup_at < min(leg_at) and len(leg_at) == 2
    assert "--user" not in cmds[setup_at]  # the remount and the moves need root
    for leg in _legs(log):
        assert f"{ENV_ROOT}=/sys/fs/cgroup/tasks" in leg
        assert "--user" not in leg  # root makes the leaves; see container.LEGS
    root_leg, user_leg = _legs(log)
    assert "--as-user" not in root_leg
    assert user_leg[user_leg.index("--as-user") + 1] == container.IMAGE_USER


def test_a_refused_setup_is_shown_before_and_after_the_legs_and_nothing_is_promised(
        fake_engine, tmp_path: Path) -> None:
    engine, log = fake_engine("refused")
    legs, said = _run(engine, tmp_path)
    assert [leg.returncode for leg in legs] == [0, 0]  # the rest of the suite still runs
    line = f"container: cgroup set-up: cgroup witnesses unavailable: {TMPFS_REASON}"
    assert said[0] == line
    assert said[-1] == f"container: note: cgroup witnesses unavailable: {TMPFS_REASON}"
    for leg in _legs(log):
        assert not any(a.startswith(f"{ENV_ROOT}=") for a in leg), leg


def test_a_crashed_setup_names_its_last_line_and_the_legs_still_run(fake_engine, tmp_path: Path) -> None:
    engine, log = fake_engine("crash")
    legs, said = _run(engine, tmp_path)
    assert len(legs) == 2
    assert said[0] == "container: cgroup set-up: cgroup witnesses unavailable: the set-up step exited 1: " \
                      "Traceback (most recent call last): | RuntimeError: boom"
    for leg in _legs(log):
        assert not any(a.startswith(f"{ENV_ROOT}=") for a in leg)


def test_the_require_switch_reaches_the_legs_and_nothing_else_of_ours_does(fake_engine,
                                                                           tmp_path: Path) -> None:
    engine, log = fake_engine("refused")
    _run(engine, tmp_path, environ={"SANDBOX_CONFORMANCE_REQUIRE": "1", ENV_ROOT: "/sys/fs/cgroup/host",
                                    "SANDBOX_CONFORMANCE_MODE": "container"})
    for leg in _legs(log):
        assert "SANDBOX_CONFORMANCE_REQUIRE=1" in leg
        # An outer promise is the host's, not the container's: only the set-up makes one in here.
        assert f"{ENV_ROOT}=/sys/fs/cgroup/host" not in leg
        assert not any(a.startswith("SANDBOX_CONFORMANCE_MODE") for a in leg)


def test_each_legs_json_report_carries_what_the_setup_said(fake_engine, tmp_path: Path) -> None:
    engine, _ = fake_engine("refused")
    report = tmp_path / "report.json"
    _run(engine, tmp_path, options=WitnessOptions(json=str(report)))
    for label in ("root", container.IMAGE_USER):
        doc = json.loads((tmp_path / f"report-{label}.json").read_text())
        assert doc["version"] == 1  # the leg's own document, with the set-up added
        assert doc["cgroup_setup"] == {"root": None, "reason": TMPFS_REASON}


def test_each_leg_names_its_report_copied_back_for_the_run_verdict(fake_engine, tmp_path: Path) -> None:
    engine, _ = fake_engine("ok")
    legs, _ = _run(engine, tmp_path, options=WitnessOptions(json=str(tmp_path / "report.json")))
    assert [(leg.label, leg.report) for leg in legs] == [
        (label, str(tmp_path / f"report-{label}.json")) for label in ("root", container.IMAGE_USER)]
    bare, _ = _run(engine, tmp_path)  # no --json: no report, so none to name
    assert [leg.report for leg in bare] == [None, None]


PROC_CGROUPS_HYBRID = """#subsys_name\thierarchy\tnum_cgroups\tenabled
cpuset\t3\t4\t1
memory\t4\t9\t1
pids\t8\t9\t1
hugetlb\t0\t12\t1
"""


@pytest.mark.parametrize(("proc_cgroups", "why"), [
    (PROC_CGROUPS_HYBRID, "memory pids bound to a cgroup v1 hierarchy on this kernel (hybrid layout)"),
    (PROC_CGROUPS_HYBRID.replace("pids\t8", "pids\t0"), "memory bound to a cgroup v1 hierarchy"),
    (PROC_CGROUPS_HYBRID.replace("memory\t4", "memory\t0").replace("pids\t8", "pids\t0"),
     "the parent did not delegate them"),
    (None, "the parent did not delegate them"),  # no /proc/cgroups (CONFIG_PROC_FS without it)
])
def test_a_controller_held_by_cgroup_v1_is_named_as_the_reason(tmp_path: Path, proc_cgroups: str | None,
                                                                why: str) -> None:
    """What this host's container really hits: its cgroup2 side offers neither memory nor pids, because
    the kernel bound them to v1 (/proc/cgroups is global, so the container sees the host's bindings)."""
    from sandbox_conformance.runners.cgroup_setup import NoCgroupRoot, Setup, SetupMode

    cgroup, proc = tmp_path / "cg", tmp_path / "proc"
    cgroup.mkdir()
    proc.mkdir()
    (cgroup / "cgroup.controllers").write_text("hugetlb\n")
    (cgroup / "cgroup.subtree_control").write_text("")
    if proc_cgroups is not None:
        (proc / "cgroups").write_text(proc_cgroups)
    with pytest.raises(NoCgroupRoot) as e:
        Setup(SetupMode.container, mount=cgroup, proc=proc, env={}).enable(cgroup)
    assert f"lacks memory pids (has: hugetlb): {why}" in str(e.value)
    assert (cgroup / "cgroup.subtree_control").read_text() == ""  # refused before any write


# ---- an offline machine: the base image, and the script that makes one from a Debian mirror ----------

# An engine with no registry in reach: `info` answers (so the runner picks it), no image is in its store,
# every pull fails with what the docker CLI prints offline. Each command line is logged, in $HOME: the
# one variable of ours both the probe and the runner pass to an engine CLI (they filter the rest).
OFFLINE_ENGINE = """\
import json, os, sys
args = sys.argv[1:]
with open(os.path.join(os.environ["HOME"], "engine.log"), "a") as log:
    log.write(json.dumps(args) + "\\n")
if args[:1] == ["info"]:
    print(json.dumps({"ServerVersion": "99.0-fake", "SecurityOptions": []}))
    sys.exit(0)
if args[:2] == ["image", "inspect"]:
    print("Error: No such image: " + args[-1], file=sys.stderr)
    sys.exit(1)
if args[:1] == ["pull"]:
    print('Error response from daemon: Get "https://registry-1.docker.io/v2/": dial tcp: lookup '
          'registry-1.docker.io: no such host', file=sys.stderr)
    sys.exit(1)
sys.exit(0)
"""


@pytest.fixture
def offline_engine(tmp_path: Path) -> tuple[Engine, Path, Path]:
    """(engine, the directory holding its `docker`, its command log)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "docker"
    script.write_text(f"#!{sys.executable}\n{OFFLINE_ENGINE}")
    script.chmod(0o755)
    log = tmp_path / "engine.log"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
    return Engine("docker", str(script), env), bin_dir, log


def test_an_unpullable_base_is_a_refusal_naming_base_image_and_the_script(offline_engine, tmp_path) -> None:
    engine, _, log = offline_engine
    said: list[str] = []
    with pytest.raises(container.ContainerUnusable) as e:
        container.build_image(engine, base=None, say=said.append)
    default = container.dockerfile_base(container.REPO / "Dockerfile")
    assert default == "debian:bookworm-slim"  # the Dockerfile's own `ARG BASE=`, read, not assumed
    assert str(e.value).startswith(f"the Dockerfile's base image {default} is not on the docker engine and "
                                   "pulling it failed")
    assert "no such host" in str(e.value)  # the engine's own words, as evidence
    ways = e.value.ways_on
    assert ways[0].startswith(f'--base-image "$({container.BASE_SCRIPT} --engine docker)"'), ways
    assert any(w.startswith("--image NAME") for w in ways)
    # Asked, then pulled, and never built: the build would only have failed on the same pull.
    assert [c[:2] for c in _commands(log)] == [["image", "inspect"], ["pull", default]]


def test_a_base_already_on_the_engine_is_built_on_without_a_pull(offline_engine, tmp_path) -> None:
    engine, _, log = offline_engine
    present = Engine(engine.kind, engine.path, {**engine.env})
    # The same engine, except that `image inspect` finds the image: a local import.
    script = Path(engine.path)
    script.write_text(script.read_text().replace('if args[:2] == ["image", "inspect"]:',
                                                 'if args[:2] == ["image", "inspect"] and False:'))
    said: list[str] = []
    assert container.build_image(present, base="bookworm-local", say=said.append) == container.DEFAULT_TAG
    cmds = _commands(log)
    assert [c[0] for c in cmds] == ["image", "build"]
    assert "BASE=bookworm-local" in cmds[1] and not any(c[0] == "pull" for c in cmds)


def test_run_in_container_mode_offline_refuses_with_the_way_on(offline_engine, tmp_path: Path) -> None:
    """End to end through `sandbox-conformance run`: the runner's decision picks the fake engine (its
    `info` answers), and the build step finds the base neither present nor pullable."""
    _, bin_dir, log = offline_engine
    verdict = tmp_path / "verdict.json"
    env = {"PATH": f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "LANG": "C.UTF-8", "HOME": str(tmp_path), "DOCKER_HOST": "tcp://127.0.0.1:9"}
    c = subprocess.run([sys.executable, "-m", "sandbox_conformance", "run", "--mode", "container",
                        "--verdict-json", str(verdict)], cwd=container.REPO, env=env, capture_output=True,
                       text=True, timeout=300)
    lines = c.stderr.strip().splitlines()
    if c.returncode == 75 and "container mode cannot run" in c.stderr and "not reachable" not in c.stderr:
        # Inside a sandbox, say: the decision refuses before any engine is asked to build.
        pytest.skip(f"the runner refuses container mode here before any build: {lines[0]}")
    assert c.returncode == 75, c.stderr[-3000:]
    assert "Traceback" not in c.stderr
    refused = ("sandbox-conformance run: refused: the Dockerfile's base image debian:bookworm-slim is not on "
               "the docker engine and pulling it failed")
    assert any(ln.startswith(refused) for ln in lines), c.stderr
    ways = [ln.split("way on: ", 1)[1] for ln in lines if "way on: " in ln]
    assert any(w.startswith("--base-image \"$(") and "scripts/docker-base-image" in w for w in ways), ways
    assert lines[-1].startswith("sandbox-conformance: REFUSED mode=container exit=75 ")
    assert not any(cmd[0] == "build" for cmd in _commands(log))
    doc = json.loads(verdict.read_text())
    assert (doc["verdict"], doc["exit"], doc["ways_on"]) == ("REFUSED", 75, ways)
    assert doc["reason"].startswith("the Dockerfile's base image debian:bookworm-slim is not on the docker")


# An engine for the script: `version` answers, `image inspect` finds what `import` put there (a state file),
# `build` records its Dockerfile. Commands are logged as above.
SCRIPT_ENGINE = """\
import json, os, sys
args = sys.argv[1:]
log, store = os.environ["FAKE_LOG"], os.environ["FAKE_LOG"] + ".images"
with open(log, "a") as f:
    f.write(json.dumps(args) + "\\n")
images = open(store).read().split() if os.path.exists(store) else []
if args[:1] == ["version"]:
    sys.exit(int(os.environ.get("FAKE_VERSION_EXIT", "0")))
if args[:2] == ["image", "inspect"]:
    sys.exit(0 if args[-1] in images else 1)
if args[:1] == ["import"]:
    open(store, "a").write(args[2] + "\\n")
if args[:1] == ["build"]:
    with open(log + ".dockerfile", "w") as f:
        f.write(open(os.path.join(args[-1], "Dockerfile")).read())
sys.exit(0)
"""
SCRIPT = container.BASE_SCRIPT


@pytest.fixture
def script_env(tmp_path: Path) -> tuple[dict[str, str], Path, Path]:
    """(environment, cache directory holding today's tarball, the engine's log). The tarball is a stand-in:
    cached, so the script skips debootstrap (and needs no root), as it does on a second run the same day."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(f"#!{sys.executable}\n{SCRIPT_ENGINE}")
    (bin_dir / "docker").chmod(0o755)
    cache = tmp_path / "cache"
    cache.mkdir()
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, timeout=30,
                          check=True).stdout.strip()
    today = time.strftime("%Y%m%d", time.gmtime())
    (cache / f"bookworm-minbase-{today}-{arch}.tar").write_bytes(b"not really a tarball\n")
    log = tmp_path / "engine.log"
    # The system's commands but the engines: podman (installed for its adapter) would be a real one.
    system = tmp_path / "system"
    system.mkdir()
    for d in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else ():
            if name not in ("podman", "docker") and not (system / name).exists():
                (system / name).symlink_to(os.path.join(d, name))
    env = {"PATH": f"{bin_dir}:{system}", "LANG": "C.UTF-8", "FAKE_LOG": str(log)}
    return env, cache, log


def _script(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120)


def test_the_base_image_script_imports_once_and_prints_the_name_to_pass(script_env) -> None:
    env, cache, log = script_env
    [tarball] = cache.glob("bookworm-minbase-*.tar")
    first = _script(env, str(cache))
    assert first.returncode == 0, first.stderr
    name = first.stdout.strip()
    assert name == "sandbox-conformance-base:" + tarball.stem.replace("minbase-", "")  # bookworm-DATE-ARCH
    assert first.stdout == name + "\n"  # one line: `--base-image "$(scripts/docker-base-image)"`
    assert ["import", str(tarball), name] in _commands(log)
    again = _script(env, str(cache))
    assert (again.returncode, again.stdout) == (0, first.stdout)
    assert sum(c[0] == "import" for c in _commands(log)) == 1  # already on the engine: not imported again
    assert _script(env, "--tarball", str(cache)).stdout == f"{tarball}\n"


def test_the_base_image_script_builds_the_docker_adapters_python3_image(script_env) -> None:
    from sandbox_conformance.conformance.adapters import docker

    env, cache, log = script_env
    done = _script(env, "--python3", str(cache))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "debian-with-python3\n"
    [build] = [c for c in _commands(log) if c[0] == "build"]
    base = next(c[2] for c in _commands(log) if c[0] == "import")
    assert ("--build-arg", f"BASE={base}") in list(itertools.pairwise(build))
    assert ("--tag", "debian-with-python3") in list(itertools.pairwise(build))
    dockerfile = Path(f"{log}.dockerfile").read_text()
    assert "FROM ${BASE}" in dockerfile and "apt-get install -y --no-install-recommends python3" in dockerfile
    # The README's recipe names the image the adapter reads, and the variable it reads it from.
    assert docker.IMAGE_ENV == "SANDBOX_CONFORMANCE_DOCKER_IMAGE"
    readme = (container.REPO / "README.md").read_text()
    assert f'{docker.IMAGE_ENV}="$(scripts/docker-base-image --python3)"' in readme


@pytest.mark.parametrize(("args", "version_exit", "code", "says"), [
    ((), "1", 75, "no container engine answers here"),
    (("--engine", "docker"), "1", 75, "docker is installed but no engine answers"),
    (("--engine", "podman"), "0", 75, "podman is not installed"),
    (("--engine", "lxc"), "0", 2, "--engine: docker or podman"),
    (("--tarball", "--python3"), "0", 2, "exclude each other"),
])
def test_the_base_image_script_says_what_is_missing(script_env, args: tuple[str, ...], version_exit: str,
                                                    code: int, says: str) -> None:
    env, cache, log = script_env
    done = _script({**env, "FAKE_VERSION_EXIT": version_exit}, *args, str(cache))
    assert (done.returncode, done.stdout) == (code, ""), done.stderr
    assert says in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not any(c[0] == "import" for c in (_commands(log) if log.exists() else []))


# ---- progress on a terminal (issue 15): the long steps as stages, in order, each with its result ----


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _stages(text: str) -> list[tuple[str, str, str]]:
    """(stage, started|done|stopped, result) for each line of a Progress named "p"; heartbeats dropped."""
    out = []
    for line in text.splitlines():
        m = re.fullmatch(r"p: (.+?): (?:(started)|(done|stopped) (?:in|after) \d+\.\ds(?: \((.*)\))?)", line)
        assert m or line.endswith(" so far"), line
        if m:
            out.append((m[1], m[2] or m[3], m[4] or ""))
    return out


def _progress(stream: io.StringIO) -> Progress:
    return Progress("p", stream=stream, clock=itertools.count(0, 0.5).__next__)


def test_on_a_terminal_the_start_the_setup_and_each_leg_are_stages_with_their_result(
        fake_engine, tmp_path: Path) -> None:
    engine, _ = fake_engine("refused")
    loud = _Tty()
    legs = container.run_container(engine, WitnessOptions(), image="img", timeout=60, say=lambda s: None,
                                   environ={}, progress=_progress(loud))
    assert [leg.returncode for leg in legs] == [0, 0]
    assert _stages(loud.getvalue()) == [
        ("container start", "started", ""), ("container start", "done", "img, project installed"),
        ("container cgroup set-up", "started", ""),
        ("container cgroup set-up", "done", "cgroup witnesses unavailable"),
        ("container as root", "started", ""), ("container as root", "done", "PASS"),
        (f"container as {container.IMAGE_USER}", "started", ""),
        (f"container as {container.IMAGE_USER}", "done", "PASS"),
    ]
    # The same run with no Progress given, or one on a pipe, prints none of it.
    quiet = io.StringIO()
    container.run_container(engine, WitnessOptions(), image="img", timeout=60, say=lambda s: None,
                            environ={}, progress=Progress("p", stream=quiet))
    assert quiet.getvalue() == ""


def test_the_image_build_and_a_failed_pull_are_stages_too(offline_engine, tmp_path: Path) -> None:
    engine, _, _ = offline_engine
    loud = _Tty()
    with pytest.raises(container.ContainerUnusable):
        container.build_image(engine, base=None, say=lambda s: None, progress=_progress(loud))
    assert _stages(loud.getvalue()) == [("container base image pull", "started", ""),
                                        ("container base image pull", "done", "failed: exit 1")]
    script = Path(engine.path)  # the base is on the engine now: no pull, a build
    script.write_text(script.read_text().replace('if args[:2] == ["image", "inspect"]:',
                                                 'if args[:2] == ["image", "inspect"] and False:'))
    loud = _Tty()
    container.build_image(engine, base="bookworm-local", say=lambda s: None, progress=_progress(loud))
    assert _stages(loud.getvalue()) == [("container image build", "started", ""),
                                        ("container image build", "done", container.DEFAULT_TAG)]
