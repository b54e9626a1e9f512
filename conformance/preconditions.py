"""The probe findings witnesses need (handover.PRECONDITION_PROBES), probed for the user the tasks run as
unless `run` handed them down: the reference launcher passes --disable-userns only where
`disable_userns` saw it work, and makes cgroup leaves only under the root `cgroup.delegation` proved.

A module of its own, light to import: the witness command starts these probes as soon as its inputs
are checked, so their trials (a real bwrap launch, ~50 ms) run while the rest of the suite is
imported, instead of delaying the first task's launch (bench/witness_bench.py)."""

from __future__ import annotations

from sandbox_conformance.conformance.handover import PRECONDITION_PROBES
from sandbox_conformance.probes.finding import Finding
from sandbox_conformance.probes.host import Host
from sandbox_conformance.processes.children import Background, settle_fork_hooks


def needed(reference: bool) -> tuple[str, ...]:
    """The precondition probes a launcher needs: our reference launcher reads both; an external launcher
    made its own nesting promise, so only the cgroup root is asked (its trial, a real bwrap launch,
    would be thrown away)."""
    return PRECONDITION_PROBES if reference else ("cgroup.delegation",)


def _probe(as_user: str | None, host: Host | None = None,
           probes: tuple[str, ...] = PRECONDITION_PROBES) -> dict[str, Finding]:
    from sandbox_conformance.probes.collect import (
        collect,  # the probe modules are heavy; only a witness run needs them
    )

    host = host or Host(as_user=as_user)
    return {f.probe: f for f in collect(host, only=list(probes))}


_prefetched: dict[tuple[str | None, tuple[str, ...]], Background[dict[str, Finding]]] = {}


def prefetch(as_user: str | None, probes: tuple[str, ...] = PRECONDITION_PROBES) -> None:
    """Start the precondition probes in the background; findings() then waits for them.

    Their trial forks while this thread goes on importing: the modules whose at-fork handlers come in
    pairs are imported first (processes/children.py settle_fork_hooks)."""
    settle_fork_hooks()

    if (as_user, probes) not in _prefetched:
        _prefetched[as_user, probes] = Background(_probe, as_user, None, probes, name="sbxc-preconditions")


def findings(as_user: str | None, host: Host | None = None,
             probes: tuple[str, ...] = PRECONDITION_PROBES) -> dict[str, Finding]:
    """The probe findings witnesses need, for the user the tasks run as."""
    if host is None and (as_user, probes) in _prefetched:
        return _prefetched[as_user, probes].result()
    return _probe(as_user, host, probes)
