"""Run the probes concurrently and return their findings in a stable order."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterable

from sandbox_conformance.probes.finding import Finding, Verdict
from sandbox_conformance.probes.host import Host
from sandbox_conformance.processes.children import Background

# probe module -> the probe ids it reports, in display order. The runner and the witness suite
# depend on these ids.
MODULES: dict[str, tuple[str, ...]] = {
    "sandbox_conformance.probes.platform": ("platform",),
    "sandbox_conformance.probes.bwrap": ("bwrap",),
    "sandbox_conformance.probes.ladder": ("userns", "userns.map", "netns", "pidns.proc", "disable_userns"),
    "sandbox_conformance.probes.cgroup": ("cgroup", "cgroup.delegation"),
    "sandbox_conformance.probes.sandboxed": ("sandboxed",),
    "sandbox_conformance.probes.deployment": ("deployment",),
    "sandbox_conformance.probes.container_engine": ("container_engine",),
    "sandbox_conformance.probes.systemd_user": ("systemd_user",),
}
PROBE_IDS: tuple[str, ...] = tuple(i for ids in MODULES.values() for i in ids)
# Started first, in this order: the modules that wait on children (the ladder's combined trial, the
# sandboxed probe's nested unshare, `bwrap --version`), so the others' imports overlap their launches.
# The longest first: the combined trial (bwrap and a python3 in it) is a run's critical path, and
# started before `bwrap --version` instead of after it, `probe --json` took ~4% less (bench/).
LAUNCHES_FIRST = ("sandbox_conformance.probes.ladder", "sandbox_conformance.probes.sandboxed",
                  "sandbox_conformance.probes.bwrap")


# No probe may hold a run for ever. Each bounds its children (Host.trial: 10 s, once more at 30 s), but
# a probe's own file operations have no timeout: stat(2) or open(2) under a hard-mounted NFS home whose
# server is gone sleeps in the kernel until the server answers. Past this deadline a module's findings
# are unknown (never a pass), naming where its thread stood, and the thread is left behind as a daemon
# (the interpreter does not wait for it at exit). Far past the longest honest sum: the ladder's combined
# trial then its rungs in parallel, each 10 s and once more at 30 s, is 80 s; the deployment probe runs
# up to four commands of 10 s one after another (two managers, two engines).
DEADLINE = 300.0


_PROBE_FILES = {f"{m.rsplit('.', 1)[1]}.py" for m in MODULES}


def _module_probe(name: str) -> Callable[[Host], list[Finding]]:
    probe: Callable[[Host], list[Finding]] = importlib.import_module(name).probe  # each module's contract
    return probe


def collect(host: Host | None = None, only: Iterable[str] | None = None) -> list[Finding]:
    """Findings for the requested probe ids (all when `only` is None), probes run concurrently.

    A probe that raises is a bug in the probe; it is reported as `unknown` with the exception, so one
    broken probe cannot hide the others, and it is never read as a pass."""
    host = host or Host()
    wanted = set(PROBE_IDS if only is None else only)
    unknown_ids = wanted - set(PROBE_IDS)
    if unknown_ids:
        raise ValueError(f"unknown probe id(s): {', '.join(sorted(unknown_ids))}")
    first = [m for m in LAUNCHES_FIRST if wanted & set(MODULES[m])]
    modules = first + [m for m, ids in MODULES.items() if wanted & set(ids) and m not in first]
    results: dict[str, Finding] = {}
    # One thread per module, all started before any is waited for: the ladder's trials, the sandboxed
    # probe's child and `bwrap --version` overlap (most of a probe run is waiting for children).
    running = {m: Background(_module_probe(m), host, name=f"sbxc-{m}", daemon=True) for m in modules}
    deadline = time.monotonic() + DEADLINE
    try:
        _gather(running, deadline, results)
    except BaseException:
        # Stopped (a signal, ^C) while waiting: a probe's own clean-up (container_engine's scratch
        # directory and podman's pause process) runs in its thread, which the interpreter would drop at
        # exit, a daemon. Their children are stopped by processes/cancel.py or the same ^C, so they end
        # promptly; waited for, never past the deadline.
        for task in running.values():
            task.wait(deadline - time.monotonic())
        raise
    return [results[i] for i in PROBE_IDS if i in wanted and i in results]


def _gather(running: dict[str, Background[list[Finding]]], deadline: float,
            results: dict[str, Finding]) -> None:
    """Each module's findings into `results`, in order; unknown for a module that raised or that had not
    ended by `deadline`."""
    for m, task in running.items():
        if not task.wait(deadline - time.monotonic()):
            where = task.where(depth=8)
            # The innermost frame of a probe names the operation better than the library call under it.
            ours = next((w for w in where if w.split(":")[0] in _PROBE_FILES),
                        where[0] if where else "its end")
            for pid in MODULES[m]:
                results[pid] = Finding(
                    pid, Verdict.unknown,
                    f"probe did not finish within {DEADLINE:g} s (still at {ours}): "
                    "a file operation that never returns, such as one under a network filesystem whose "
                    "server is gone?", {"deadline_seconds": f"{DEADLINE:g}", "where": " < ".join(where)})
            continue
        try:
            for f in task.result():
                results[f.probe] = f
        except Exception as e:
            for pid in MODULES[m]:
                results[pid] = Finding(pid, Verdict.unknown, f"probe crashed: {type(e).__name__}: {e}",
                                       {"exception": repr(e)})
