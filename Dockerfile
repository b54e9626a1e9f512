# The container sandbox-conformance's container mode runs the witness suite in.
#
# The base image is a build argument so an offline machine can pass a locally imported one, e.g.
#   debootstrap --variant=minbase bookworm ROOT && tar -C ROOT -c . | docker import - bookworm-local
#   docker build --build-arg BASE=bookworm-local .
# (scripts/docker-base-image does the first step.) Nothing is copied in: the checkout is bound
# read-only at /src when the container runs, and installed into the venv below then.
ARG BASE=debian:bookworm-slim
FROM ${BASE}

# bubblewrap: the reference sandbox under test. python3 + Debian's packaged dependencies (PyPI is
# not assumed reachable from a container): pytest, pytest-timeout, psutil, pyroute2, prctl.
# python3-venv/-setuptools/-wheel: the run installs the checkout into a venv with --no-build-isolation.
# util-linux: setpriv (tasks as another user); mount: `mount -o remount,rw /sys/fs/cgroup` in the
# cgroup set-up step (runners/cgroup_setup.py; essential in Debian, named so no base can drop it);
# iproute2: `ip` for the network witnesses; procps: ps for the process witnesses; ca-certificates
# for any https mirror the base uses.
RUN set -eux; \
    export DEBIAN_FRONTEND=noninteractive; \
    apt-get update; \
    apt-get install -y --no-install-recommends \
        bubblewrap ca-certificates iproute2 mount procps util-linux \
        python3 python3-venv python3-setuptools python3-wheel \
        python3-pytest python3-pytest-timeout python3-psutil python3-prctl; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*

# The venv sees Debian's packages (--system-site-packages); each run pip-installs the checkout into
# it with --no-deps (the run-time dependencies are Debian's packages above; PyPI is not reachable
# from the build).
RUN python3 -m venv --system-site-packages /opt/sandbox-conformance

# The unprivileged user every task of the suite's second pass is launched as (`witness --as-user
# sbxc`, through setpriv, after root has entered the task into its cgroup leaf), so the user-namespace
# path a deployment takes (bwrap without any capability) is exercised in container mode too.
RUN useradd --create-home --uid 10001 --shell /bin/sh sbxc

WORKDIR /tmp
CMD ["sleep", "infinity"]
