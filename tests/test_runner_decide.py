"""The mode decision as a table: every refusal and each way on, from hand-built findings."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox_conformance.probes.finding import Finding, Verdict
from sandbox_conformance.runners.decide import NEEDED, Decision, Mode, Request, decide

S, D, U, DET, ND, UNK = (Verdict.supported, Verdict.denied, Verdict.unsupported, Verdict.detected,
                         Verdict.not_detected, Verdict.unknown)


def host(**over: tuple[Verdict, dict[str, Any]] | Verdict) -> dict[str, Finding]:
    """A Linux host where native works, no engine, no signature; `over` replaces findings by id
    (dots in ids spelled as `__`)."""
    base: dict[str, tuple[Verdict, dict[str, Any]]] = {
        "platform": (ND, {"os": "Debian GNU/Linux 12 (bookworm)", "kernel": "6.18.0", "wsl": None,
                            "container": None}),
        "bwrap": (S, {"path": "/usr/bin/bwrap", "version": "0.8.0", "version_tuple": [0, 8, 0]}),
        "userns": (S, {}),
        "userns.map": (S, {}),
        "netns": (S, {}),
        "pidns.proc": (S, {}),
        "disable_userns": (S, {}),
        "sandboxed": (ND, {"signals": []}),
        "deployment": (UNK, {"configured": False, "matches": []}),
        "container_engine": (U, {"cli": None}),
        "systemd_user": (U, {}),
        "cgroup.delegation": (S, {"root": "/sys/fs/cgroup/user.slice/sbxc", "promised": False}),
    }
    for key, value in over.items():
        pid = key.replace("__", ".")
        base[pid] = value if isinstance(value, tuple) else (value, {})
    return {pid: Finding(pid, v, f"{pid} is {v}", {}, facts) for pid, (v, facts) in base.items()}


ENGINE = (S, {"cli": "docker", "socket": "/run/docker.sock"})
SIGNATURE_MATCH = (DET, {"configured": True, "matches": ["unit agentd-agent.service"]})
SIGNATURE_CLEAR = (ND, {"configured": True, "matches": []})
SIGNATURE_FAILED = (UNK, {"configured": True, "arms": {"units": "failed: systemctl exited 1"}})
DARWIN = (UNK, {"os": "Darwin", "system": "Darwin", "kernel": None})
WSL1 = (ND, {"os": "Ubuntu", "kernel": "4.4.0-19041-Microsoft", "wsl": "1"})
MALFORMED = (UNK, {"configured": False, "errors": ["/etc/x.toml: Expected '=' (line 2)"]})
NESTED = (D, {"cause": "nested", "errno": "ENOSPC"})
SANDBOXED = (DET, {"signals": ["uid_map", "nested_userns_refused"]})
# Issue 12's shapes, as the ladder reports them (probes/classify.py causes).
MASKED_PROC = (D, {"cause": "masked_proc", "errno": "EPERM"})
READONLY_PROC = (D, {"cause": "readonly_proc", "errno": "EROFS"})
READONLY_PROC_SYS = (D, {"cause": "readonly_proc_sys", "errno": "EROFS"})
IN_DOCKER = (DET, {"os": "Debian GNU/Linux 12 (bookworm)", "kernel": "6.18.0", "wsl": None,
                   "container": "docker", "signals": ["declared:pid1:container=docker"]})


def case(mode: str, expect: str | None, *, delegate: bool = False, **over: Any) -> Any:
    return pytest.param(Request(Mode(mode), delegate), host(**over), expect,
                        id=f"{mode}{'+delegate' if delegate else ''}-" + ("-".join(over) or "plain"))


TABLE = [
    # auto: each way on
    case("auto", "native"),
    case("auto", "native", deployment=SIGNATURE_CLEAR),
    case("auto", "container", userns=D, container_engine=ENGINE),
    case("auto", "container", netns=D, container_engine=ENGINE),
    case("auto", "container", bwrap=(U, {"path": None}), container_engine=ENGINE),
    case("auto", "container", platform=DARWIN, bwrap=U, userns=UNK, userns__map=UNK,
         netns=UNK, container_engine=ENGINE),
    # Could not tell whether this is inside a sandbox: on Linux auto picks nothing (inside one that hands
    # us an engine's socket, a container would run outside it); on macOS there is no /proc to read.
    case("auto", None, sandboxed=UNK, container_engine=ENGINE),
    case("auto", None, sandboxed=UNK),
    case("auto", "container", platform=DARWIN, bwrap=U, userns=UNK, userns__map=UNK, netns=UNK,
         sandboxed=UNK, container_engine=ENGINE),
    case("native", "native", sandboxed=UNK),
    case("container", "container", sandboxed=UNK, container_engine=ENGINE),
    # auto: every rung the reference launcher needs (issue 12: pidns.proc was not read)
    case("auto", None, pidns__proc=MASKED_PROC),
    case("auto", "container", pidns__proc=MASKED_PROC, container_engine=ENGINE),
    case("auto", None, pidns__proc=UNK),
    case("auto", None, userns__map=READONLY_PROC, netns=READONLY_PROC, pidns__proc=READONLY_PROC),
    case("auto", "native", disable_userns=READONLY_PROC_SYS),  # the launcher drops the option: a skip
    case("auto", "native", platform=IN_DOCKER),
    case("auto", None, platform=IN_DOCKER, pidns__proc=MASKED_PROC),
    # auto: refusals
    case("auto", None, userns=D),
    case("auto", None, userns__map=D),
    case("auto", None, platform=DARWIN, bwrap=U),
    case("auto", None, platform=WSL1),
    case("auto", "container", platform=WSL1, container_engine=ENGINE),
    case("auto", None, deployment=SIGNATURE_MATCH),
    case("auto", None, deployment=SIGNATURE_MATCH, container_engine=ENGINE),
    case("auto", None, deployment=SIGNATURE_FAILED),
    case("auto", None, deployment=(UNK, {})),  # the probe crashed: no facts at all
    case("auto", None, deployment=MALFORMED),
    # explicit modes: the user means it
    case("native", "native", deployment=SIGNATURE_MATCH),
    case("native", "native", deployment=SIGNATURE_FAILED),
    case("native", "native", userns=D),  # the witness suite then says what is missing
    case("native", None, platform=DARWIN),
    case("native", None, platform=WSL1),
    case("container", "container", container_engine=ENGINE),
    case("container", "container", deployment=SIGNATURE_MATCH, container_engine=ENGINE),
    case("container", None),
    case("container", None, container_engine=(D, {"cli": "docker"})),
    case("container", None, container_engine=(UNK, {"cli": "docker"})),
    # vm: only when asked for; auto never picks it
    case("vm", "vm"),
    case("vm", "vm", deployment=SIGNATURE_MATCH),
    case("vm", "vm", userns=D),  # the guest has its own kernel; the suite says what is missing there
    case("vm", None, platform=DARWIN),
    case("auto", "native", cgroup__delegation=U),
    case("auto", "container", userns=D, container_engine=ENGINE, cgroup__delegation=U),
    case("vm", None, delegate=True, systemd_user=S),
    # --delegate
    case("native", None, delegate=True),
    case("auto", None, delegate=True),
    case("native", "native", delegate=True, systemd_user=S),
    case("container", None, delegate=True, container_engine=ENGINE, systemd_user=S),
    # inside a sandbox: no mode opens it
    *[case(m, None, sandboxed=SANDBOXED, userns=NESTED) for m in Mode],
    *[case(m, None, sandboxed=SANDBOXED, userns=NESTED, container_engine=ENGINE) for m in Mode],
    *[case(m, None, sandboxed=SANDBOXED, deployment=SIGNATURE_MATCH) for m in Mode],
]


@pytest.mark.parametrize(("request_", "findings", "expect"), TABLE)
def test_the_decision_table(request_: Request, findings: dict[str, Finding], expect: str | None) -> None:
    d = decide(request_, findings)
    assert isinstance(d, Decision)
    assert d.mode == (Mode(expect) if expect else None), d.reasons
    if d.refused:
        assert d.reason and "\n" not in d.reason
        assert d.ways_on, "every refusal names a way on"
    else:
        assert not d.ways_on


def test_a_deployment_host_under_auto_names_both_ways_on() -> None:
    d = decide(Request(), host(deployment=SIGNATURE_MATCH, container_engine=ENGINE))
    assert d.refused
    assert "deployment host" in d.reason and "agentd-agent.service" in d.reason
    assert any(w.startswith("--mode container") for w in d.ways_on)
    assert any(w.startswith("--mode native") for w in d.ways_on)


def test_a_signature_that_could_not_be_checked_refuses_under_auto_and_says_so() -> None:
    d = decide(Request(), host(deployment=SIGNATURE_FAILED))
    assert d.refused and "could not be checked" in d.reason


def test_no_signature_proceeds_with_a_note_saying_how_to_declare_one() -> None:
    d = decide(Request(), host())
    assert d.mode is Mode.native
    assert any("no deployment signature configured" in n and "deployment.toml" in n for n in d.notes)


def test_the_note_names_where_the_probe_would_read_a_signature() -> None:
    d = decide(Request(), host(deployment=(UNK, {"configured": False, "declare_at": "/root/.config/x.toml"})))
    assert any("/root/.config/x.toml" in n for n in d.notes)


def test_a_checked_clear_signature_adds_no_note() -> None:
    assert decide(Request(), host(deployment=SIGNATURE_CLEAR)).notes == ()


def test_an_explicit_native_run_on_a_deployment_host_says_it_was_meant() -> None:
    d = decide(Request(Mode.native), host(deployment=SIGNATURE_MATCH))
    assert any("--mode native was given" in n for n in d.notes)


@pytest.mark.parametrize("mode", list(Mode))
def test_inside_a_sandbox_the_refusal_names_the_engine_and_nested_userns(mode: Mode) -> None:
    d = decide(Request(mode), host(sandboxed=SANDBOXED, userns=NESTED))
    assert d.refused
    assert "inside a sandbox" in d.reason
    assert "container engine is unreachable" in d.reason
    assert "nested user namespaces are refused" in d.reason
    assert "uid_map" in d.reason  # the signals that fired


def test_inside_a_sandbox_with_a_reachable_engine_names_only_nesting() -> None:
    d = decide(Request(Mode.container), host(sandboxed=SANDBOXED, userns=NESTED, container_engine=ENGINE))
    assert d.refused
    assert "nested user namespaces are refused" in d.reason
    assert "engine is unreachable" not in d.reason


def test_inside_an_old_bwrap_sandbox_the_refusal_does_not_claim_nesting_is_refused() -> None:
    old = (S, {"path": "/usr/bin/bwrap", "version": "0.6.2", "version_tuple": [0, 6, 2]})
    d = decide(Request(Mode.native), host(sandboxed=(DET, {"signals": ["uid_map"]}), bwrap=old))
    assert d.refused
    assert "0.6.2 is older than 0.8" in d.reason
    assert "nested user namespaces are refused" not in d.reason


def test_inside_a_container_under_dockers_seccomp_profile_the_refusal_names_the_filter() -> None:
    """The shape tests/test_host_shape_lab.py proves (a plain `docker run`): the sandboxed probe's
    nesting signal fires, but the probe named the cause, seccomp; the refusal says so, and gives
    the container's own way on beside leaving it."""
    seccomp = (D, {"cause": "seccomp", "errno": "EPERM"})
    d = decide(Request(), host(sandboxed=SANDBOXED, userns=seccomp))
    assert d.refused
    assert "user namespaces are denied here (seccomp)" in d.reason
    assert "nested user namespaces are refused" not in d.reason
    assert d.ways_on[0] == "run sandbox-conformance on the host, outside the sandbox"
    assert any("seccomp=unconfined" in w for w in d.ways_on[1:]), d.ways_on


def test_auto_refusal_names_every_missing_piece() -> None:
    d = decide(Request(), host(userns=D, container_engine=(UNK, {"cli": "docker"})))
    text = "\n".join(d.reasons)
    assert "userns: denied" in text and "container engine is not reachable" in text


def test_a_probe_that_did_not_report_is_never_read_as_a_pass() -> None:
    findings = host()
    del findings["netns"]
    assert decide(Request(), findings).refused
    assert set(NEEDED) >= set(host())


def test_print_mode_mentions_the_vm_when_the_cgroup_witnesses_cannot_run_natively() -> None:
    d = decide(Request(), host(cgroup__delegation=(U, {"root": None})))
    assert d.mode is Mode.native
    assert any("--mode vm" in n and "cgroup.delegation: unsupported" in n for n in d.notes)
    assert not any("--mode vm" in n for n in decide(Request(), host()).notes)


# ------------------------------------------------------------------ issue 12: host shapes


def test_a_masked_proc_refuses_auto_naming_pidns_proc_and_its_way_on() -> None:
    """The probe already says pidns.proc denied cause=masked_proc: auto must not pick native (the
    reference launcher's `--proc /proc` would fail every task, a red run of harness errors)."""
    d = decide(Request(), host(pidns__proc=MASKED_PROC))
    assert d.refused
    assert "pidns.proc: denied (masked_proc)" in d.reason
    assert any(r.startswith("native: pidns.proc: denied (masked_proc)") for r in d.reasons[1:])
    assert any("systempaths=unconfined" in w for w in d.ways_on)
    assert not any("install bubblewrap" in w for w in d.ways_on), "bwrap is installed here"
    assert d.ways_on[-1].endswith("so --mode container can run")


def test_a_masked_proc_with_a_reachable_engine_picks_container_and_says_why() -> None:
    d = decide(Request(), host(pidns__proc=MASKED_PROC, container_engine=ENGINE))
    assert d.mode is Mode.container
    assert any("pidns.proc: denied (masked_proc)" in r for r in d.reasons)


@pytest.mark.parametrize("rung", ["userns", "userns.map", "netns", "pidns.proc"])
def test_every_rung_the_reference_launcher_needs_blocks_native(rung: str) -> None:
    assert rung in NEEDED
    d = decide(Request(), host(**{rung.replace(".", "__"): D}))
    assert d.refused and f"{rung}: denied" in d.reason


def test_a_read_only_proc_refusal_names_it_not_install_bubblewrap() -> None:
    """Both of the old generic ways on were already true here: bwrap is installed and user namespaces
    are allowed. The way on is the read-only /proc."""
    d = decide(Request(), host(userns__map=READONLY_PROC, netns=READONLY_PROC, pidns__proc=READONLY_PROC))
    assert d.refused
    assert "userns.map: denied (readonly_proc)" in d.reason
    assert any("/proc read-write" in w for w in d.ways_on)
    assert not any("install bubblewrap" in w or "allow unprivileged" in w for w in d.ways_on)
    assert len([w for w in d.ways_on if "/proc read-write" in w]) == 1, "each way on once"


def test_disable_userns_that_does_not_work_is_a_note_not_a_blocker() -> None:
    d = decide(Request(), host(disable_userns=(D, {"cause": "readonly_proc_sys"})))
    assert d.mode is Mode.native
    note = next(n for n in d.notes if n.startswith("disable_userns"))
    assert "readonly_proc_sys" in note and "not tested" in note and "/proc/sys writable" in note


def test_an_explicit_native_run_names_the_known_limitation_it_will_meet() -> None:
    d = decide(Request(Mode.native), host(pidns__proc=MASKED_PROC))
    assert d.mode is Mode.native
    assert any("pidns.proc: denied (masked_proc)" in n and "cannot start" in n for n in d.notes)


def test_a_bwrap_that_is_not_executable_is_named_with_its_way_on() -> None:
    broken = (D, {"path": "/usr/bin/bwrap", "executable": False})
    untried = (U, {"cause": "no_bwrap"})
    d = decide(Request(), host(bwrap=broken, netns=untried, pidns__proc=untried))
    assert d.refused
    assert any("chmod 0755 /usr/bin/bwrap" in w for w in d.ways_on)
    assert not any("apt-get install" in w for w in d.ways_on), "it is installed"


def test_no_bwrap_at_all_still_says_install_it() -> None:
    d = decide(Request(), host(bwrap=(U, {"path": None}), userns__map=S))
    assert any("apt-get install bubblewrap" in w for w in d.ways_on)


@pytest.mark.parametrize(("engine", "said"), [
    ((D, {"cli": "docker", "socket": "unix:///var/run/docker.sock"}), "socket refuses us"),
    ((UNK, {"cli": "docker"}), "could not be told"),
    (ENGINE, "docker is reachable from here"),
])
def test_inside_a_sandbox_the_engine_is_never_called_unreachable_unless_it_is(
        engine: tuple[Verdict, dict[str, Any]], said: str) -> None:
    d = decide(Request(), host(sandboxed=SANDBOXED, userns=NESTED, container_engine=engine))
    assert d.refused
    assert said in d.reason
    assert "unreachable" not in d.reason
    # The boundary that decided it: the sandboxed probe, with the signals that fired.
    assert "decided by the sandboxed probe: uid_map, nested_userns_refused" in d.reason


def test_inside_a_sandbox_an_absent_engine_is_unreachable_from_here() -> None:
    d = decide(Request(), host(sandboxed=SANDBOXED, userns=NESTED))
    assert "the container engine is unreachable from here" in d.reason


def test_the_platform_probes_container_is_read_by_the_decision() -> None:
    """Issue 12: the platform probe's container detection was never read."""
    native = decide(Request(), host(platform=IN_DOCKER))
    assert native.mode is Mode.native
    assert any("inside a docker container" in r for r in native.reasons)
    refused = decide(Request(), host(platform=IN_DOCKER, pidns__proc=MASKED_PROC))
    assert "inside a docker container" in refused.reason
    sandboxed = decide(Request(), host(platform=IN_DOCKER, sandboxed=SANDBOXED, userns=NESTED))
    assert "platform probe: a docker container" in sandboxed.reason
    explicit = decide(Request(Mode.native), host(platform=IN_DOCKER))
    assert any("inside a docker container" in r for r in explicit.reasons)


def test_a_stray_marker_is_no_container_for_the_decision() -> None:
    """The platform probe's own weighing stands: a conflict (not_detected) names no container."""
    stray = (ND, {"os": "Debian", "kernel": "6.18.0", "wsl": None, "container": None, "conflict": True})
    d = decide(Request(), host(platform=stray))
    assert d.mode is Mode.native and not any("container" in r for r in d.reasons)


def test_a_refused_decision_leaves_as_the_one_refusal_with_its_reasons_and_ways_on() -> None:
    """Issue 30: one shape for "did not run": the decision stays data, its boundary raises Refusal."""
    from sandbox_conformance.processes.exits import Refusal

    d = Decision(None, ("the reason", "a further one"), ("a way on",))
    with pytest.raises(Refusal) as e:
        d.chosen()
    assert e.value.reason == "the reason"
    assert (e.value.because, e.value.ways_on) == (("a further one",), ("a way on",))
    assert Decision(Mode.native, ("why",)).chosen() is Mode.native


def test_every_mode_a_decision_can_choose_is_behind_the_one_interface() -> None:
    from sandbox_conformance.runners.modes import MODES

    assert set(MODES) == set(Mode) - {Mode.auto}


def test_a_mode_that_cannot_be_used_is_a_refusal() -> None:
    from sandbox_conformance.processes.exits import Refusal
    from sandbox_conformance.runners.container import ContainerUnusable
    from sandbox_conformance.runners.vm.qemu import VmUnusable

    assert issubclass(ContainerUnusable, Refusal) and issubclass(VmUnusable, Refusal)
    assert ContainerUnusable("no image", ("build it",)).ways_on == ("build it",)


def test_an_unknown_sandboxed_verdict_is_said_where_a_mode_asked_for_runs_anyway() -> None:
    refused = decide(Request(Mode.auto), host(sandboxed=UNK, container_engine=ENGINE))
    assert refused.mode is None and "could not tell whether this runs inside a sandbox" in refused.reasons[0]
    assert any("--mode native" in w for w in refused.ways_on)
    ran = decide(Request(Mode.container), host(sandboxed=UNK, container_engine=ENGINE))
    assert ran.mode is Mode.container
    assert any("could not tell whether this runs inside a sandbox" in n and "--mode container" in n
               for n in ran.notes), ran.notes


def test_a_platform_probe_that_could_not_tell_is_no_reason_to_trust_an_unknown_sandboxed() -> None:
    # A platform finding with no facts (crashed, or past the probes' deadline: probes/collect.py) says
    # nothing about the kernel: auto must still refuse to pick a mode over a sandboxed unknown.
    for platform in ((UNK, {}), (UNK, {"system": "Linux", "kernel": None})):
        refused = decide(Request(Mode.auto), host(platform=platform, sandboxed=UNK, container_engine=ENGINE))
        assert refused.mode is None, (platform, refused)
        assert "could not tell whether this runs inside a sandbox" in refused.reasons[0]
    # Where the probe knows the kernel is not Linux's, the unknown is the platform's, as before.
    ran = decide(Request(Mode.auto), host(platform=DARWIN, bwrap=U, userns=UNK, userns__map=UNK, netns=UNK,
                                          pidns__proc=UNK, disable_userns=UNK, sandboxed=UNK,
                                          container_engine=ENGINE))
    assert ran.mode is Mode.container, ran
