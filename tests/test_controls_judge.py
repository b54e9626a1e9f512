"""The negative controls' judge and the `controls` command's logic, on synthetic JUnit results.

The XML is shaped like pytest's own junitxml output (a <testcase> with <properties>, then at most a
<failure>, <error> or <skipped>), with the properties conformance/plugin.py attaches."""

from __future__ import annotations

import argparse
import ast
import importlib
import xml.sax.saxutils as sx
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from sandbox_conformance.commands import controls as controls_cmd
from sandbox_conformance.conformance import bwrap_argv, controls, witnesses
from sandbox_conformance.conformance import controls_judge as j
from sandbox_conformance.conformance.controls import Collateral, Control, Needs
from sandbox_conformance.conformance.controls_judge import ControlOutcome, ControlStatus
from sandbox_conformance.processes.children import Completed
from sandbox_conformance.processes.exits import EXIT_FAIL, EXIT_OK, Refusal, UsageError

A, B, C, D = "test_a[x]", "test_b", "test_c", "test_d"


def case(name: str, body: str = "", **props: str) -> str:
    p = "".join(f'<property name="{k}" value={sx.quoteattr(v)} />' for k, v in props.items())
    return (
        f'<testcase classname="witnesses.paths" name={sx.quoteattr(name)} time="0.001">'
        f'<properties><property name="sbxc_family" value="f" />{p}</properties>{body}</testcase>'
    )


def assertion(msg: str = "AssertionError: saw ok, not EROFS") -> str:
    return f"<failure message={sx.quoteattr(msg)}>E   {sx.escape(msg)}</failure>"


HARNESS = (
    '<error message="failed on setup with &quot;conformance.launch.NoObservation: launcher: exited 70&quot;">'
    "NoObservation</error>"
)
SKIP = '<skipped type="pytest.skip" message="the host has no file to hide">skip</skipped>'


def junit(*cases: str) -> str:
    return (
        '<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">'
        f'<testsuite name="pytest" errors="0" failures="0" skipped="0" tests="{len(cases)}">'
        + "".join(cases)
        + "</testsuite></testsuites>"
    )


BASELINE = j.parse_junit(junit(case(A), case(B), case(C), case(D)))


def control(reddens: Sequence[str] = (A,), collateral: Sequence[Collateral] = ()) -> Control:
    return Control(
        "synthetic",
        "one thing",
        reddens=tuple(f"witnesses/paths.py::{t}" for t in reddens),
        perturb="mask_dropped",
        collateral=tuple(collateral),
    )


def verdict(c: Control, *cases: str) -> j.ControlVerdict:
    return j.judge(c, BASELINE, j.parse_junit(junit(*cases)), collateral=[x.test for x in c.collateral])


# ---- classifying one testcase -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "props", "expected"),
    [
        ("", {}, ControlOutcome.passed),
        (assertion(), {}, ControlOutcome.assertion),
        # The plugin's record of what an assertion saw is enough even if the message is reworded.
        (assertion("assert 'ok' == 'EROFS'"), {"sbxc_saw": "saw ok"}, ControlOutcome.assertion),
        (assertion("KeyError: 'interfaces'"), {}, ControlOutcome.crashed),
        (HARNESS, {}, ControlOutcome.error),
        (HARNESS, {"sbxc_harness_error": "launcher: exited 70"}, ControlOutcome.error),
        (SKIP, {}, ControlOutcome.skipped),
        # --sbxc-require turns a skip into a <failure>: still a skip, never an assertion.
        (
            assertion("witness skipped under --sbxc-require"),
            {"sbxc_required_skip": "no file to hide"},
            ControlOutcome.skipped,
        ),
        # A teardown error after a failing body: pytest writes both; the error decides.
        (assertion() + HARNESS, {}, ControlOutcome.error),
    ],
)
def test_each_testcase_is_classified_from_junit_elements_and_plugin_properties(
    body: str, props: Mapping[str, str], expected: ControlOutcome
) -> None:
    assert j.parse_junit(junit(case(A, body, **props)))[A].outcome is expected


def test_unreadable_or_ambiguous_junit_is_an_error_not_an_empty_result() -> None:
    with pytest.raises(j.UnreadableJUnit, match="not XML"):
        j.parse_junit("<testsuites")
    with pytest.raises(j.UnreadableJUnit, match="root element"):
        j.parse_junit("<html/>")
    with pytest.raises(j.UnreadableJUnit, match="two testcases"):
        j.parse_junit(junit(case(A), case(A)))


# ---- judging one control -------------------------------------------------------------------------


def test_a_control_that_reddens_its_test_by_an_assertion_and_nothing_else_is_ok() -> None:
    v = verdict(control(), case(A, assertion()), case(B), case(C), case(D))
    assert v.status is ControlStatus.ok and v.problems == () and v.reddened == (A,)


def test_a_control_that_leaves_its_test_green_fails_naming_it() -> None:
    v = verdict(control(), case(A), case(B), case(C), case(D))
    assert v.status is ControlStatus.failed
    assert v.problems == (f"{A}: left green",)


def test_a_control_that_reddens_its_test_through_a_harness_error_fails() -> None:
    v = verdict(control(), case(A, HARNESS, sbxc_harness_error="exited 70"), case(B), case(C), case(D))
    assert v.status is ControlStatus.failed and v.reddened == ()
    assert v.problems[0].startswith(f"{A}: red for the wrong reason: error (harness error: exited 70")


def test_a_control_that_reddens_its_test_through_a_skip_fails() -> None:
    v = verdict(control(), case(A, SKIP), case(B), case(C), case(D))
    assert v.status is ControlStatus.failed
    assert v.problems == (f"{A}: red for the wrong reason: skipped (the host has no file to hide)",)


def test_a_control_whose_test_crashes_with_another_exception_fails() -> None:
    v = verdict(control(), case(A, assertion("KeyError: 'tcp'")), case(B), case(C), case(D))
    assert v.status is ControlStatus.failed and "crashed (KeyError: 'tcp')" in v.problems[0]


def test_a_control_with_unexpected_collateral_fails_naming_the_collateral() -> None:
    v = verdict(control(), case(A, assertion()), case(B, assertion()), case(C), case(D, SKIP))
    assert v.status is ControlStatus.failed and v.reddened == (A,)
    assert [p.split(":")[0] for p in v.problems] == [B, D]
    assert "undeclared collateral: passed in the baseline, assertion" in v.problems[0]


def test_a_control_with_declared_collateral_is_ok_and_reports_what_it_saw() -> None:
    c = control(collateral=[Collateral(f"witnesses/paths.py::{B}", "same mount")])
    v = verdict(c, case(A, assertion()), case(B, assertion()), case(C), case(D))
    assert v.status is ControlStatus.ok and v.collateral_seen == (B,)


def test_a_witness_missing_from_the_controls_run_is_a_change() -> None:
    v = verdict(control(), case(A, assertion()), case(B), case(C))
    assert v.status is ControlStatus.failed and v.problems == (
        f"{D}: undeclared collateral: passed in the baseline, did not run here",
    )


def test_a_named_witness_the_baseline_lacks_or_did_not_pass_fails_the_control() -> None:
    baseline = j.parse_junit(junit(case(A, SKIP), case(B)))
    run = j.parse_junit(junit(case(A, assertion()), case(B)))
    v = j.judge(control(reddens=(A, "test_renamed")), baseline, run)
    assert v.status is ControlStatus.failed
    assert v.problems[0].startswith(f"{A}: did not pass in the baseline (skipped")
    assert v.problems[1].startswith("test_renamed: no such witness in the baseline")


def test_a_run_without_junit_results_fails_with_the_reason() -> None:
    v = j.judge(control(), BASELINE, None, run_problem="timed out after 120s")
    assert v.status is ControlStatus.failed and v.problems == (
        "no JUnit results from the witness run: timed out after 120s",
    )


# ---- the baseline and coverage ------------------------------------------------------------------------


def test_a_baseline_that_could_not_run_is_told_apart_from_a_red_one() -> None:
    assert j.baseline_problems(None, "no bwrap").could_not_run  # type: ignore[union-attr]
    errored = j.parse_junit(junit(case(A, HARNESS), case(B, HARNESS)))
    assert j.baseline_problems(errored).could_not_run  # type: ignore[union-attr]
    red = j.baseline_problems(j.parse_junit(junit(case(A, assertion()), case(B), case(C, SKIP))))
    assert red is not None and not red.could_not_run
    assert [line.split(":")[0] for line in red.lines] == [A]
    assert j.baseline_problems(j.parse_junit(junit(case(A), case(B, SKIP)))) is None


def test_coverage_lists_each_witness_as_controlled_justified_or_neither() -> None:
    baseline = j.parse_junit(junit(case(A), case(B), case(C), case(D, SKIP), case("test_e")))
    c1 = control(reddens=(A,))
    c2 = Control("c2", "other", reddens=("witnesses/paths.py::test_e",), perturb="ipc_shared")
    unrun = Control("c3", "not chosen", reddens=("witnesses/paths.py::test_c",), perturb="uts_shared")
    verdicts = {
        "synthetic": j.ControlVerdict("synthetic", ControlStatus.ok, reddened=(A,)),
        "c2": j.ControlVerdict("c2", ControlStatus.failed, ("test_e: left green",)),
    }
    cov = {c.test: c for c in j.coverage(baseline, [c1, c2], verdicts, {B: "cannot be perturbed"}, [unrun])}
    assert (cov[A].status, cov[A].controls) == ("controlled", ("synthetic",))
    assert (cov[B].status, cov[B].detail) == ("justified", "cannot be perturbed")
    assert cov[C].status == "unselected"
    assert cov[D].status == "not_run"
    assert cov["test_e"].status == "NEITHER" and "named by c2" in cov["test_e"].detail


# ---- the catalogue -----------------------------------------------------------------------------------


def test_every_catalogue_control_names_real_witnesses_and_real_perturbations() -> None:
    names = [c.name for c in controls.CONTROLS]
    assert len(names) == len(set(names))
    for c in controls.CONTROLS:
        assert c.reddens, c.name
        assert c.perturb is None or c.perturb in bwrap_argv.PERTURBATIONS, c.name
        for t in (*c.reddens, *(x.test for x in c.collateral)):
            # `witnesses/MODULE.py::test_x[param]`: the module of the suite that defines test_x.
            path, sep, name = t.partition("::")
            assert sep and path.startswith("witnesses/") and path.endswith(".py"), t
            module = importlib.import_module("sandbox_conformance.conformance." + path[:-3].replace("/", "."))
            assert callable(getattr(module, name.split("[")[0], None)), t


def test_the_controls_table_of_the_suite_lists_every_witness_where_it_is_defined() -> None:
    """controls.SUITE against the modules' own source (every `test_` function of each module)."""
    suite = Path(witnesses.__file__).parent
    defined = {
        p.stem: tuple(n.name for n in ast.parse(p.read_text()).body
                      if isinstance(n, ast.FunctionDef) and n.name.startswith("test_"))
        for p in witnesses.PATHS
    }
    assert dict(controls.SUITE) == defined
    modules = sorted(p.name for p in suite.glob("*.py") if not p.name.startswith("_"))
    assert modules == sorted(witnesses.MODULES), "a module of the suite that `witness` would not run"


def test_every_perturbation_of_the_reference_launcher_has_a_control() -> None:
    assert {c.perturb for c in controls.CONTROLS if c.perturb} == set(bwrap_argv.PERTURBATIONS)


def test_the_nested_userns_control_needs_disable_userns_and_external_controls_declare_it() -> None:
    nested = controls.by_name()["nested_userns_enabled"]
    assert nested.needs is Needs.disable_userns
    assert controls.not_applicable(nested, disable_userns=True, disable_userns_reason="") is None
    assert "ENOSPC missing" in (
        controls.not_applicable(nested, disable_userns=False, disable_userns_reason="ENOSPC missing") or ""
    )
    ext = controls.by_name()["workdir_read_only"]
    assert controls.collateral(ext, disable_userns=True) == ()
    assert [x.test for x in controls.collateral(ext, disable_userns=False)] == [controls.NESTED_USERNS]
    assert "--disable-userns" in (controls.launcher_prefix(ext, python="py", disable_userns=True) or "")
    assert "--disable-userns" not in (controls.launcher_prefix(ext, python="py", disable_userns=False) or "")
    assert controls.launcher_prefix(nested, disable_userns=True) is None


def test_the_unsandboxed_baseline_requires_every_isolation_witness_that_passed() -> None:
    c = controls.unsandboxed(["test_a_read_only_path_is_readable[/usr]", A, B], {C: "skipped"})
    assert [controls.key(t) for t in c.reddens] == [A, B]  # availability witnesses are not required red
    assert [controls.key(x.test) for x in c.collateral] == [C]
    assert c.prefix == "env"


# ---- the command's logic with a fake witness runner ----------------------------------------------------


class FakeWitness:
    """Maps `witness` arguments to canned JUnit text (None: no results)."""

    def __init__(self, by_extra: Mapping[tuple[str, ...], str | None]) -> None:
        self.by_extra, self.calls = by_extra, []  # type: ignore[var-annotated]

    def __call__(self, extra: Sequence[str]) -> controls_cmd.Run:
        self.calls.append(tuple(extra))
        text = self.by_extra.get(tuple(extra))
        if text is None:
            return controls_cmd.Run(None, "`witness` exited 2: bad")
        return controls_cmd.Run(j.parse_junit(text))


def _execute(witness: FakeWitness, chosen: Sequence[Control], **kw: object) -> controls_cmd.ControlsReport:
    return controls_cmd.execute(
        witness,
        chosen,
        with_unsandboxed=bool(kw.get("unsandboxed", False)),
        disable_userns=(bool(kw.get("disable_userns", True)), "probe said so"),
        jobs=2,
        partial=bool(kw.get("partial", True)),
    )


def test_the_command_exits_0_when_every_control_behaves_and_1_naming_one_that_does_not() -> None:
    good = Control("good", "x", reddens=(f"witnesses/paths.py::{A}",), perturb="ipc_shared")
    bad = Control("bad", "y", reddens=(f"witnesses/paths.py::{B}",), perturb="uts_shared")
    fake = FakeWitness(
        {
            (): junit(case(A), case(B)),
            ("--perturb", "ipc_shared"): junit(case(A, assertion()), case(B)),
            ("--perturb", "uts_shared"): junit(case(A), case(B)),
        }
    )
    report = _execute(fake, [good])
    assert report.exit_code == EXIT_OK
    report = _execute(fake, [good, bad])
    assert report.exit_code == EXIT_FAIL
    assert [(v.control, v.status) for v in report.verdicts] == [("good", ControlStatus.ok), ("bad",
                                                                                             ControlStatus.failed)]
    assert any(
        "control bad: FAILED" in line for line in controls_cmd.human(report, {"good": good, "bad": bad})
    )


def test_the_command_refuses_with_75_when_the_baseline_cannot_run() -> None:
    with pytest.raises(Refusal, match=r"baseline .* could not run"):
        _execute(FakeWitness({(): None}), [controls.by_name()["ipc_shared"]])
    with pytest.raises(Refusal, match="no witness passed"):
        _execute(FakeWitness({(): junit(case(A, HARNESS))}), [controls.by_name()["ipc_shared"]])


def test_a_full_run_fails_when_a_witness_is_neither_controlled_nor_justified() -> None:
    good = Control("good", "x", reddens=(f"witnesses/paths.py::{A}",), perturb="ipc_shared")
    fake = FakeWitness(
        {
            (): junit(case(A), case(B)),
            ("--perturb", "ipc_shared"): junit(case(A, assertion()), case(B)),
            ("--launcher", "env"): junit(case(A, assertion()), case(B, assertion())),
        }
    )
    report = _execute(fake, [good], unsandboxed=True, partial=False)
    assert report.unsandboxed is not None and report.unsandboxed.status is ControlStatus.ok
    assert [c.status for c in report.coverage] == ["controlled", "NEITHER"]
    assert report.exit_code == EXIT_FAIL
    assert _execute(fake, [good], unsandboxed=True, partial=True).exit_code == EXIT_OK


def test_the_limits_control_needs_a_cgroup_root_and_names_exactly_the_limit_witnesses() -> None:
    dropped = controls.by_name()["limits_dropped"]
    assert dropped.needs is Needs.cgroup_root and dropped.perturb == "limits_dropped"
    assert {controls.key(t) for t in dropped.reddens} == {
        "test_an_allocation_past_memory_max_is_oom_killed",
        "test_forking_past_pids_max_fails_with_eagain",
    }
    assert controls.not_applicable(
        dropped, disable_userns=True, disable_userns_reason="", cgroup_root=True, cgroup_root_reason=""
    ) is None
    why = controls.not_applicable(
        dropped, disable_userns=True, disable_userns_reason="", cgroup_root_reason="hybrid layout"
    )
    assert why is not None and "hybrid layout" in why
    # Where there is no root the control is not run: nothing to drop, the witnesses only skip.
    fake = FakeWitness({(): junit(case(A))})
    report = controls_cmd.execute(
        fake, [dropped], with_unsandboxed=False, disable_userns=(True, ""), jobs=1, partial=True,
        cgroup_root=(False, "cgroup.delegation: unsupported: hybrid layout"),
    )
    assert fake.calls == [()]
    assert report.verdicts[0].status is ControlStatus.not_applicable
    assert "hybrid layout" in report.verdicts[0].reason
    fake = FakeWitness({(): junit(case(A)), ("--perturb", "limits_dropped"): junit(case(A))})
    controls_cmd.execute(
        fake, [dropped], with_unsandboxed=False, disable_userns=(True, ""), jobs=1, partial=True,
        cgroup_root=(True, "delegated root /sys/fs/cgroup/tasks"),
    )
    assert ("--perturb", "limits_dropped") in fake.calls


def test_the_leaf_not_entered_control_reddens_every_cgroup_witness_but_the_neighbours() -> None:
    c = controls.by_name()["leaf_not_entered"]
    assert c.needs is Needs.cgroup_root and c.perturb in bwrap_argv.PERTURBATIONS
    assert {controls.key(t) for t in c.reddens} == controls.HARNESS_ENFORCED - {
        "test_a_neighbour_tasks_leaf_is_not_writable_from_inside"
    }


def test_the_cgroup_tree_control_needs_a_root_and_root_tasks() -> None:
    c = controls.by_name()["cgroup_tree_bound"]
    assert [controls.key(t) for t in c.reddens] == [
        "test_a_neighbour_tasks_leaf_is_not_writable_from_inside",
        "test_the_hosts_kernel_settings_cannot_be_opened_for_writing",  # the tree's root comes with it
    ]
    kw = {"disable_userns": True, "disable_userns_reason": "", "cgroup_root_reason": "hybrid"}
    assert "hybrid" in (controls.not_applicable(c, cgroup_root=False, **kw) or "")
    assert "unprivileged" in (controls.not_applicable(c, cgroup_root=True, as_root=False, **kw) or "")
    assert controls.not_applicable(c, cgroup_root=True, as_root=True, **kw) is None


def test_the_binfmt_control_needs_root_tasks_and_binfmt_misc(monkeypatch: pytest.MonkeyPatch) -> None:
    c = controls.by_name()["binfmt_bound"]
    assert [controls.key(t) for t in c.reddens] == [controls.key(controls.KERNEL_INTERFACES)]
    kw = {"disable_userns": True, "disable_userns_reason": ""}
    assert "0200" in (controls.not_applicable(c, as_root=False, **kw) or "")
    monkeypatch.setattr(controls, "_kernel_has", lambda fstype: fstype != "binfmt_misc")
    assert "/proc/filesystems" in (controls.not_applicable(c, as_root=True, **kw) or "")
    monkeypatch.setattr(controls, "_kernel_has", lambda fstype: True)
    assert controls.not_applicable(c, as_root=True, **kw) is None


def test_the_unsandboxed_baseline_does_not_require_the_harness_enforced_cgroup_witnesses_red() -> None:
    leaf = "test_the_task_runs_in_its_own_cgroup_leaf"
    assert leaf in controls.HARNESS_ENFORCED
    c = controls.unsandboxed([f"witnesses/limits.py::{leaf}", f"witnesses/paths.py::{A}"], {})
    assert [controls.key(t) for t in c.reddens] == [A]
    assert [x.test for x in c.collateral] == [f"witnesses/limits.py::{leaf}"]  # named where it lives


def test_the_unsandboxed_baseline_may_see_the_hosts_mounts_change_under_it() -> None:
    # A task in the host's mount namespace sees every mount the host's other workloads make: `unchanged`
    # is neither required red nor an undeclared change there.
    unchanged = controls.key(controls.UNCHANGED)
    c = controls.unsandboxed([f"witnesses/lifecycle.py::{unchanged}", f"witnesses/paths.py::{A}"], {})
    assert [controls.key(t) for t in c.reddens] == [A]
    [declared] = c.collateral
    assert controls.key(declared.test) == unchanged and "mount namespace" in declared.reason


def test_a_not_applicable_control_is_not_run() -> None:
    nested = controls.by_name()["nested_userns_enabled"]
    fake = FakeWitness({(): junit(case(A))})
    report = _execute(fake, [nested], disable_userns=False)
    assert fake.calls == [()]
    assert report.verdicts[0].status is ControlStatus.not_applicable and report.exit_code == EXIT_OK


@pytest.mark.parametrize("only", ["nope", "ipc_shared,nope", ","])
def test_only_with_an_unknown_name_is_a_usage_error(only: str) -> None:
    with pytest.raises(UsageError, match="--only: unknown control"):
        controls_cmd._choose(only)


def test_only_selects_controls_and_the_unsandboxed_baseline() -> None:
    chosen, unsb = controls_cmd._choose(f"uts_shared,{controls.UNSANDBOXED}")
    assert [c.name for c in chosen] == ["uts_shared"] and unsb
    assert controls_cmd._choose(None) == (list(controls.CONTROLS), True)


def test_bad_jobs_is_a_usage_error() -> None:
    args = argparse.Namespace(jobs=0, timeout=10.0, launch_timeout=5.0, as_user=None)
    with pytest.raises(UsageError, match="--jobs"):
        controls_cmd._validate(args)


@pytest.mark.parametrize("launch", [0.0, 10.0, 30.0])
def test_a_launch_timeout_not_below_the_run_timeout_is_a_usage_error(launch: float) -> None:
    args = argparse.Namespace(jobs=2, timeout=10.0, launch_timeout=launch, as_user=None)
    with pytest.raises(UsageError, match="--launch-timeout"):
        controls_cmd._validate(args)


def test_each_witness_run_gets_the_launch_timeout(tmp_path: Path) -> None:
    seen: list[list[str]] = []

    def runner(argv, *, timeout, env, cwd):  # type: ignore[no-untyped-def]
        seen.append(list(argv))
        return Completed(tuple(argv), 1, "", "boom", 0.0)

    go = controls_cmd.witness_runner(as_user=None, timeout=400.0, workdir=tmp_path, launch_timeout=120.0,
                                     runner=runner)
    go([])
    argv = seen[0]
    assert argv[argv.index("--launch-timeout") + 1] == "120.0"


def test_the_syscall_doors_are_kept_with_no_sandbox_where_yama_refuses_every_attach(tmp_path) -> None:
    from sandbox_conformance.conformance import controls as c

    (tmp_path / "sys/kernel/yama").mkdir(parents=True)
    for scope, kept in (("1", False), ("2", True), ("3", True)):
        (tmp_path / "sys/kernel/yama/ptrace_scope").write_text(scope + "\n")
        assert (c.key(c.SYSCALLS) in c.mode_kept(str(tmp_path))) is kept
    assert c.mode_kept(str(tmp_path / "none")) == c.MODE_KEPT  # no Yama
