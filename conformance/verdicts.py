"""From pytest's reports to promise verdicts: each witness test is followed through its reports
(Collector), and the witnesses of one promise make its row (promise_lines: kept, BROKEN with what the
task saw, not tested with why; conformance/render.py draws them). `sandbox-conformance witness`
prints them as its table; a plain `pytest` run with the plugin gets the same rows in its terminal
summary (conformance/plugin.py)."""

from __future__ import annotations

from typing import Any, NamedTuple

from sandbox_conformance.conformance.render import Row


class Result(NamedTuple):
    """One witness test as the collector follows it through pytest's reports: the promise it witnesses and
    how it went. Each report that changes how it went replaces it in the collector."""

    nodeid: str
    family: str
    label: str
    # not_run until a report says otherwise: a witness that never ran (`--collect-only`, `-x`) must
    # never count as a kept promise.
    outcome: str = "not_run"  # not_run, passed, failed, error, skipped
    detail: str = ""


class Collector:
    """Sees every witness's reports; turns them into promise verdicts."""

    def __init__(self) -> None:
        self.results: dict[str, Result] = {}
        self.config: Any = None
        self.unavailable: str | None = None  # the launcher's "not here" (exit 75), said once

    def pytest_configure(self, config: Any) -> None:
        self.config = config

    def pytest_collection_finish(self, session: Any) -> None:
        for item in session.items:
            m = item.get_closest_marker("witness")
            if m is None:
                continue
            if not m.args:  # a bare `@pytest.mark.witness`: a user's own witness is a row of its own
                self.results[item.nodeid] = Result(item.nodeid, item.name, item.name)
                continue
            family = str(m.args[0])
            param = next(iter(item.callspec.params.values()), None) if hasattr(item, "callspec") else None
            label = f"{family} {param}" if param is not None else family
            self.results[item.nodeid] = Result(item.nodeid, family, label)

    def pytest_runtest_logreport(self, report: Any) -> None:
        r = self.results.get(report.nodeid)
        if r is None:
            return
        outcome, detail = r.outcome, r.detail
        props = dict(report.user_properties)
        if "sbxc_unavailable" in props and self.unavailable is None:
            self.unavailable = props["sbxc_unavailable"]
        if report.failed:
            if "sbxc_harness_error" in props:
                outcome, detail = "error", "harness error: " + props["sbxc_harness_error"]
            elif "sbxc_required_skip" in props:
                outcome, detail = (
                    "failed",
                    f"not tested: {props['sbxc_required_skip']} (a failure under --require)",
                )
            elif report.when == "call":
                outcome, detail = "failed", props.get("sbxc_saw") or first_line(report)
            elif r.outcome != "failed":
                outcome, detail = "error", f"{report.when} error: {first_line(report)}"
        elif report.passed and report.when == "call" and r.outcome == "not_run":
            outcome = "passed"
            if props.get("sbxc_view") == "task":  # conformance/witnesses/_common.py _task_view
                detail = TASK_VIEW_ONLY
        elif report.skipped and r.outcome in ("not_run", "passed"):
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            outcome, detail = "skipped", reason.removeprefix("Skipped: ")
        if (outcome, detail) != (r.outcome, r.detail):
            self.results[report.nodeid] = r._replace(outcome=outcome, detail=detail)


# A witness judged on what the task showed by its own behaviour alone, where the host was declared unable
# to see it (--host-cannot-observe): kept, but not on the host's reading.
TASK_VIEW_ONLY = "task's view only: the host could not observe the task"


def first_line(report: Any) -> str:
    text = getattr(report, "longreprtext", "") or str(report.longrepr)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("E ")]
    return (lines[0][1:].strip() if lines else text.strip().splitlines()[-1] if text.strip() else "?")[:300]


def promise_lines(results: list[Result]) -> list[Row]:
    """(promise label, verdict, detail) in collection order; one line per promise."""
    by: dict[str, list[Result]] = {}
    for r in results:
        by.setdefault(r.label, []).append(r)
    out = []
    for label, rs in by.items():
        bad = [r for r in rs if r.outcome == "failed" and not r.detail.startswith("not tested")]
        err = [r for r in rs if r.outcome == "error"]
        req = [r for r in rs if r.outcome == "failed" and r.detail.startswith("not tested")]
        skipped = [r for r in rs if r.outcome == "skipped"]
        not_run = [r for r in rs if r.outcome == "not_run"]
        if bad:
            out.append((label, "BROKEN", "; ".join(dict.fromkeys(r.detail for r in bad))))
        elif err:
            out.append((label, "not tested", err[0].detail))
        elif req:
            out.append((label, "not tested", req[0].detail.removeprefix("not tested: ")))
        elif len(skipped) + len(not_run) == len(rs):
            out.append((label, "not tested", skipped[0].detail if skipped else "its witnesses did not run"))
        elif skipped:
            out.append((label, "kept", f"partly: {skipped[0].detail}"))
        elif not_run:
            out.append((label, "kept", f"partly: {len(rs) - len(not_run)} of {len(rs)} witnesses ran"))
        elif any(r.detail == TASK_VIEW_ONLY for r in rs):
            out.append((label, "kept", TASK_VIEW_ONLY))
        else:
            out.append((label, "kept", ""))
    return out
