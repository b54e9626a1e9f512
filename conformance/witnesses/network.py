"""The network promises: no way out (only lo, nothing of the host reachable, a network namespace of
its own), and with [network] mode = "proxy", out only through the sandbox's proxy to the allowed
names."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox_conformance.conformance.plan import Task
from sandbox_conformance.conformance.plugin import Settings
from sandbox_conformance.conformance.profile import NetworkMode

# The autouse fixture that names the running witness for _task_view: pytest finds a fixture among a
# module's own names, so every module of the suite imports it.
from sandbox_conformance.conformance.witnesses._common import _current as _current
from sandbox_conformance.conformance.witnesses._common import (
    _host_ns,
    witness,
)

# ---- network -----------------------------------------------------------------------------------------


def _socket_refused(task: Task) -> bool:
    """Every TCP attempt the task made was refused at socket(2) itself, with EPERM: a seccomp filter
    leaves it no network at all (codex)."""
    tcp = task.get("tcp") or []
    return bool(tcp) and all(
        c["result"].get("stage") == "socket" and c["result"].get("errno") == "EPERM" for c in tcp
    )


@witness("network")
def test_the_task_sees_only_the_loopback_interface(sbxc_task: Task) -> None:
    interfaces = sbxc_task.get("interfaces")
    if isinstance(interfaces, dict) and interfaces.get("errno") == "EPERM" and _socket_refused(sbxc_task):
        # if_nameindex(3) needs a socket too: no interface can be listed because no socket can be made,
        # which the refused connects prove (not the listing).
        return
    assert interfaces == ["lo"], f"interfaces inside: {interfaces}"


def _proxies(task: Task) -> list[dict[str, Any]]:
    """The proxies the task's environment offered it, with what each one did (inside.proxy_trials)."""
    trials = task.get("proxies")
    if trials is None:
        return []
    assert isinstance(trials, dict) and "error" not in trials, f"the task could not try its proxies: {trials}"
    return list(trials.get("offered", []))


def _through(entry: dict[str, Any], kinds: tuple[str, ...]) -> list[str]:
    """Targets of these kinds the proxy tunnelled to (and, for the echo listener, back from)."""
    out = []
    for t in entry.get("tunnels", []):
        r = t["result"]
        if t["kind"] in kinds and r.get("established") and r.get("echoed") is not False:
            out.append(f"{t['host']}:{t['port']} ({t['kind']}, {r.get('status')})")
    return out


@witness("network")
def test_the_task_cannot_reach_the_hosts_tcp_listener(sbxc_task: Task, sbxc_settings: Settings) -> None:
    reached = [c["target"] for c in sbxc_task.get("tcp") or [] if c["result"].get("ok")]
    assert sbxc_task.get("tcp"), "the task made no TCP connect attempt"
    assert not reached, f"the task connected to the host's TCP listener at {reached}"
    proxies = _proxies(sbxc_task)
    for p in proxies:
        through = _through(p, ("loopback", "host"))
        assert not through, (
            f"through the proxy {p['proxy']} (from {', '.join(p['vars'])}) the task reached {through}"
        )
    if sbxc_settings.profile.network is NetworkMode.none:
        # No proxy at all: one that answers is a way out whatever it lets through (srt's, with even one
        # name allowed, carries the task to it). That sandbox keeps network = "proxy", never "none".
        open_ = [
            f"{p['proxy']} (from {', '.join(p['vars'])})"
            + (
                f", through which it reached {_through(p, ('listed', 'unlisted'))}"
                if _through(p, ("listed", "unlisted"))
                else ""
            )
            for p in proxies
            if p["connect"].get("ok")
        ]
        assert not open_, f"network none, but the task is offered a proxy it can reach: {open_}"


@witness("network")
def test_the_task_cannot_reach_the_hosts_abstract_unix_socket(sbxc_task: Task) -> None:
    attempts = sbxc_task.get("unix_abstract") or []
    assert attempts, "the task made no abstract unix socket connect attempt"
    reached = [c["target"] for c in attempts if c["result"].get("ok")]
    assert not reached, (
        f"the task connected to the host's abstract unix socket @{reached[0] if reached else ''}"
    )


@witness("network")
def test_the_task_has_a_network_namespace_of_its_own(sbxc_task: Task) -> None:
    host = sbxc_task.host.namespaces.get("net")
    assert _host_ns(sbxc_task, "net") != host, f"the task shares the host's network namespace {host}"


# ---- network through a proxy: [network] mode = "proxy", allowed = [...] ------------------------------


def _proxy_plan(task: Task) -> dict[str, Any]:
    assert task.plan.proxy is not None
    return dict(task.plan.proxy)


@witness("network_proxy")
def test_a_listed_name_is_reachable_through_the_proxy(sbxc_task: Task, sbxc_settings: Settings) -> None:
    plan = _proxy_plan(sbxc_task)
    if not sbxc_settings.profile.network_allowed:
        pytest.skip("[network] allowed lists no name: nothing must come through")
    if plan["unserved"]:
        pytest.skip(f"the suite cannot serve every allowed name here: {plan['unserved']}")
    proxies = _proxies(sbxc_task)
    assert proxies, "network proxy, but the task's environment names no proxy (no *_proxy variable)"
    for name in sbxc_settings.profile.network_allowed:
        came_back = {
            p["proxy"]: [
                t["result"] for t in p.get("tunnels", []) if t["kind"] == "listed" and t["host"] == name
            ]
            for p in proxies
        }
        ok = [proxy for proxy, rs in came_back.items() if any(r.get("echoed") for r in rs)]
        assert ok, f"{name} (allowed) did not come back through any proxy offered: {came_back}"
    direct = [d for d in ((sbxc_task.get("proxies") or {}).get("direct") or []) if d["result"].get("ok")]
    assert not direct, f"the task reached {direct} directly, not through the proxy"


@witness("network_proxy")
def test_the_proxy_refuses_unlisted_names_loopback_and_the_hosts_addresses(sbxc_task: Task) -> None:
    plan = _proxy_plan(sbxc_task)
    proxies = _proxies(sbxc_task)
    assert proxies, "network proxy, but the task's environment names no proxy (no *_proxy variable)"
    kinds = sorted({t["kind"] for t in plan["targets"] if t["kind"] != "listed"})
    tried = [p for p in proxies if p.get("tunnels")]
    assert tried, f"no proxy offered could be tried: {[(p['proxy'], p['connect']) for p in proxies]}"
    # Every proxy the task can connect to is a way out, each asked on its own (srt offers an HTTP one and
    # a SOCKS one): one this suite cannot speak to (an https:// proxy) is untried, never a refusal.
    untried = [p["proxy"] for p in proxies if p.get("connect", {}).get("ok") and not p.get("tunnels")]
    assert not untried, f"proxies offered that the task could connect to but not try (by scheme): {untried}"
    through = {p["proxy"]: _through(p, ("unlisted", "loopback", "host")) for p in proxies}
    through = {k: v for k, v in through.items() if v}
    assert not through, f"the proxy let through what is not allowed ({', '.join(kinds)}): {through}"
