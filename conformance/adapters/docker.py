"""Docker as a sandbox: `docker run` of an image with python3, with chosen flags, against the engine
named by $DOCKER_HOST (the client's own default otherwise).

The flags and what each one promises (docker-run(1), docs.docker.com/engine/security):
  --network none                 a network namespace with only lo
  --read-only                    the image's root filesystem is mounted read-only
  --cap-drop ALL                 no capabilities in any set (the bounding set included)
  --security-opt no-new-privileges
  --ipc private; a private pid namespace (the default without --pid)
  --hostname sbxc-task           a private uts namespace
  -v {state}:{state}:ro, a read-only tmpfs over {state}/db (the mask) and over {state}/users (hides
  the other tasks and users), then this task's control dir (ro), workdir and per-user temp (rw)
  bound back on top (the engine sorts mounts parent-first)
  --env for PATH HOME LANG TASK_ID only: the client's environment never reaches the container
  the default seccomp profile: unshare(CLONE_NEWUSER) is refused without CAP_SYS_ADMIN

The image is $SANDBOX_CONFORMANCE_DOCKER_IMAGE: it must have python3 (the witness program runs in
the image's interpreter, not ours)."""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Mapping

from sandbox_conformance.conformance.adapters._unavailable import Unavailable

IMAGE_ENV = "SANDBOX_CONFORMANCE_DOCKER_IMAGE"
HOSTNAME = "sbxc-task"


def run_flags(image: str) -> list[str]:
    def ro_tmpfs(dest: str) -> list[str]:
        return ["--mount", f"type=tmpfs,destination={dest},tmpfs-mode=0755,readonly"]

    return [
        "run",
        "--rm",
        "--interactive",  # -i without -t: stdin is the witness program, a pipe
        "--network",
        "none",
        "--read-only",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--ipc",
        "private",
        "--hostname",
        HOSTNAME,
        "--tmpfs",
        "/tmp",
        "--volume",
        "{state}:{state}:ro",
        *ro_tmpfs("{state}/db"),
        *ro_tmpfs("{state}/users"),
        "--volume",
        "{control}:{control}:ro",
        "--volume",
        "{workdir}:{workdir}:rw",
        "--volume",
        "{user_tmp}:{user_tmp}:rw",
        "--workdir",
        "{workdir}",
        "--env",
        "PATH=/usr/bin:/bin",
        "--env",
        "HOME={workdir}",
        "--env",
        "LANG=C.UTF-8",
        "--env",
        "TASK_ID={task_id}",
        image,
    ]


def prefix(env: Mapping[str, str]) -> str:
    exe = shutil.which("docker", path=env.get("PATH"))
    if exe is None:
        raise Unavailable("docker client not installed (apt-get install docker.io)")
    image = env.get(IMAGE_ENV)
    if not image:
        raise Unavailable(f"no image: set {IMAGE_ENV} to an image with python3 on the engine")
    host = ["--host", env["DOCKER_HOST"]] if env.get("DOCKER_HOST") else []
    return shlex.join([exe, *host, *run_flags(image)])
