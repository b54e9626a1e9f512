"""Inside one VM guest (root, PID 1 is runners/vm/stage2.py, a pure cgroup v2 hierarchy): container mode
on the host shape of Docker Desktop's Linux VM. Prints one JSON document that
tests/test_host_shape_lab.py asserts; the runs' reports go to --out.

    python3 -I -S container_host.py --cli REPO/.venv/bin/sandbox-conformance --repo REPO \
        --image-tar DIR/image.tar --image NAME --out DIR/out

Why stage 2 as PID 1 and not systemd: Docker Desktop's VM (LinuxKit) has no systemd either; its
dockerd uses the cgroupfs driver on a cgroup2-only kernel, which is what this guest is
(`cgroup_no_v1=all`, one cgroup2 mount, runners/vm/image.py). It also boots in seconds instead of
the systemd guest's 20-40 s.

In order, in one boot:
  dockerd     the host's docker.io binaries, a private socket and exec root under /run (a tmpfs in
              this guest), the data root on a tmpfs of its own (overlay2 refuses an overlayfs as its
              backing filesystem, and the guest's / is one); `--bridge none --iptables=false`: the
              guest has no NIC and its initramfs loads no bridge, veth or netfilter modules, and
              container mode runs its container with `--network none` anyway;
  load        `docker load` of the image the host built from the Dockerfile and saved into the
              share (the guest has no network, so the Dockerfile's apt-get cannot run here);
  run         `run --mode container --image NAME --require`: the cgroup set-up step, then both legs
              (root, and every task as the image's user), reports in --out;
  seccomp     a plain `docker run` of the image, as users meet it (Docker's default seccomp profile,
              capabilities, masked /proc): the probe, `run`, and bwrap's own words, from /src.
Stdlib only (`python3 -I -S`): it records what it saw, never a verdict."""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time

# -I leaves this program's own directory off sys.path: put it back for the shared helpers.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import guest

TIMEOUT = 900  # the container run: install + two legs of the suite under TCG on a loaded 2-core host
sh = functools.partial(guest.run, timeout=240, log=True)  # the run itself passes TIMEOUT
read = guest.read
DATA_ROOT = "/var/lib/sbxc-lab-docker"
EXEC_ROOT = "/run/sbxc-lab-docker"
SOCKET = f"{EXEC_ROOT}/docker.sock"
LADDER = "bwrap,userns,userns.map,netns,pidns.proc,disable_userns"
# Run inside the plain container (python3 only, the image has no project installed until container
# mode installs it): each command with a timeout, one JSON document on stdout.
IN_CONTAINER = r"""
import json, subprocess, sys

out = {}
for key, argv in json.loads(sys.argv[1]).items():
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
        out[key] = {"argv": argv, "rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr}
    except subprocess.TimeoutExpired as e:
        out[key] = {"argv": argv, "rc": None, "stdout": str(e.stdout or ""), "stderr": str(e.stderr or "")}
print(json.dumps(out))
"""




def start_dockerd(env: dict[str, str], log: str) -> tuple[subprocess.Popen[bytes], dict[str, object]]:
    os.makedirs(DATA_ROOT, exist_ok=True)
    os.makedirs(EXEC_ROOT, mode=0o711, exist_ok=True)
    mounted = sh(["mount", "-t", "tmpfs", "-o", "mode=0711", "tmpfs", DATA_ROOT], timeout=30)
    config = f"{EXEC_ROOT}/daemon.json"
    with open(config, "w") as f:
        f.write("{}\n")  # never the host's /etc/docker/daemon.json
    started = time.monotonic()
    with open(log, "wb") as out:
        daemon = subprocess.Popen(
            ["dockerd", "--host", f"unix://{SOCKET}", "--data-root", DATA_ROOT, "--exec-root", EXEC_ROOT,
             "--pidfile", f"{EXEC_ROOT}/dockerd.pid", "--config-file", config,
             "--storage-driver", "overlay2",
             "--bridge", "none", "--iptables=false", "--ip-masq=false",
             # Docker Desktop's VM has no systemd: dockerd files containers with the cgroupfs driver.
             "--exec-opt", "native.cgroupdriver=cgroupfs"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    deadline = time.monotonic() + 180
    up = False
    while time.monotonic() < deadline and daemon.poll() is None:
        if sh(["docker", "version", "--format", "{{.Server.Version}}"], timeout=30, env=env)["rc"] == 0:
            up = True
            break
        time.sleep(1)
    return daemon, {"mount": mounted, "up": up, "seconds": round(time.monotonic() - started, 1),
                    "exited": daemon.poll()}


def stop_dockerd(daemon: subprocess.Popen[bytes]) -> None:
    if daemon.poll() is None:
        daemon.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            daemon.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(daemon.pid, signal.SIGKILL)
    daemon.wait()


def seccomp_shape(env: dict[str, str], repo: str, image: str) -> dict[str, object]:
    """A plain `docker run` (default seccomp profile, capabilities and masked paths), the project run
    from the read-only checkout: the probe as root and --as-user the image's user, `run` (auto) as
    root and as that user, and bwrap's own words for each."""
    cli = ["python3", "-m", "sandbox_conformance"]
    bwrap = ["bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/",
             "--proc", "/proc", "true"]
    as_user = ["setpriv", "--reuid=sbxc", "--regid=sbxc", "--init-groups", "--reset-env", "--"]
    commands = {
        "probe": [*cli, "probe", "--json", "--only", f"platform,sandboxed,container_engine,{LADDER}",
                  "--as-user", "sbxc"],
        "run_root": [*cli, "run"],
        "run_user": [*as_user, "env", f"PYTHONPATH={repo}", "PYTHONDONTWRITEBYTECODE=1", *cli, "run"],
        "bwrap_root": bwrap,
        "bwrap_user": [*as_user, *bwrap],
        "status": ["grep", "-E", "^(Seccomp|CapEff|NoNewPrivs):", "/proc/self/status"],
    }
    return sh(["docker", "run", "--rm", "--pull", "never", "--network", "none",
               "--volume", f"{repo}:{repo}:ro", "--workdir", repo,
               "--env", f"PYTHONPATH={repo}", "--env", "PYTHONDONTWRITEBYTECODE=1",
               image, "python3", "-c", IN_CONTAINER, json.dumps(commands)], timeout=600, env=env)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli", required=True)
    parser.add_argument("--repo", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--image-tar", required=True, help="`docker save` of the image, in the share")
    parser.add_argument("--image", required=True, help="its name")
    parser.add_argument("--skip", default="", help="comma-separated steps to skip: run, seccomp")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    os.makedirs(args.out, exist_ok=True)
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
           "LANG": "C.UTF-8", "DOCKER_HOST": f"unix://{SOCKET}"}
    report: dict[str, object] = {
        "kernel": os.uname().release,
        "pid1": read("/proc/1/comm"),
        # The shape: cgroup2 is the only hierarchy (no v1 one is bound to any controller).
        "cgroup_mounts": [ln for ln in (read("/proc/self/mountinfo") or "").splitlines() if "cgroup" in ln],
        "root_controllers": read("/sys/fs/cgroup/cgroup.controllers"),
        "proc_cgroups": read("/proc/cgroups"),
    }
    daemon, started = start_dockerd(env, os.path.join(args.out, "dockerd.log"))
    report["dockerd"] = started
    try:
        if started["up"]:
            report["info"] = sh(["docker", "info", "--format",
                                 "{{.CgroupVersion}} {{.CgroupDriver}} {{.Driver}} {{.SecurityOptions}}"],
                                timeout=60, env=env)
            report["load"] = sh(["docker", "load", "--input", args.image_tar], timeout=600, env=env)
            # The two share the guest's 2 vCPUs: a leg of the suite is one pytest process and its
            # tasks, mostly on one vCPU; the plain container's probe takes the other (~30 s apart).
            with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
                futures = {}
                if "run" not in skip:
                    futures["run"] = pool.submit(
                        sh, [args.cli, "run", "--mode", "container", "--image", args.image, "--require",
                             "--json", f"{args.out}/run.json", "--junitxml", f"{args.out}/run.xml",
                             "--verdict-json", f"{args.out}/verdict.json"],
                        timeout=TIMEOUT, env=env, cwd=args.repo)
                if "seccomp" not in skip:
                    futures["seccomp"] = pool.submit(seccomp_shape, env, args.repo, args.image)
                for key, fut in futures.items():
                    report[key] = fut.result()
            report["containers_left"] = sh(["docker", "ps", "--all", "--quiet"], timeout=60, env=env)
    finally:
        stop_dockerd(daemon)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
