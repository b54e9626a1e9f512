"""`sandbox-conformance mr-check`: say which tier covers a change, run it, or hand it over.

Collects the changed paths (committed since the merge-base with --base, default the repository's
default branch, plus uncommitted and untracked files), matches them against the sandbox-touching
globs declared in `[tool.sandbox-conformance]` (mrcheck/config.py), and runs every touched tier
through the runner (mrcheck/tiers.py).

Every command printed is the one that ran or would run: tier commands from the repository root,
the re-check with every option that changes what is checked (-C, --config, --base, --mode).

Exit: 0 not sandbox-touching, or every touched tier ran green; 1 a tier went red (or gave no
verdict); 2 usage or input error (no configuration, a bad or unknown key, not a repository, unknown
base, a shallow clone without the merge-base), one line;
75 a touched tier could not run here: the handover paragraph names the files, the tier, the exact
command and why. Never 0 for a sandbox-touching change whose tier did not run. Stopped by SIGTERM,
SIGINT or SIGHUP: the tier under way is stopped in order (mrcheck/tiers.py), its runner's own
KILLED line is printed, then ours, and the exit is 143, 130 or 129 (docs/cancellation.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sandbox_conformance.mrcheck.config import InvalidConfig, dead_globs, load, resolve
from sandbox_conformance.mrcheck.git import GitRefused, collect, files_at_head, toplevel
from sandbox_conformance.mrcheck.report import CheckReport, Invocation, ReportFormat, exit_code, plan, render
from sandbox_conformance.mrcheck.tiers import TierResult, display_command, effective_mode, run_tier
from sandbox_conformance.processes.exits import UsageError

MODES = ("auto", "native", "container", "vm")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", metavar="REV",
                   help="compare with the merge-base of REV and HEAD "
                        "(default: origin/HEAD, else main or master)")
    p.add_argument("--format", choices=[str(f) for f in ReportFormat], default=str(ReportFormat.text),
                   help="text (default), markdown (to paste into the merge request) or one JSON document")
    p.add_argument("--config", metavar="FILE", type=Path,
                   help="a TOML file with the tiers (default: [tool.sandbox-conformance] in the repository's "
                        "pyproject.toml)")
    p.add_argument("--mode", choices=MODES,
                   help="passed to the runner for every witness and cgroup tier (default: the runner's, "
                        "i.e. $SANDBOX_CONFORMANCE_MODE or auto); command tiers always run on this host")
    p.add_argument("-C", "--repo", metavar="DIR", type=Path, default=None,
                   help="the repository to check (default: the working directory)")


def _warn(line: str) -> None:
    print(f"sandbox-conformance mr-check: warning: {line}", file=sys.stderr, flush=True)


def main(args: argparse.Namespace) -> int:
    fmt = ReportFormat(args.format)
    cwd = (args.repo or Path.cwd()).absolute()
    try:
        # The configuration first: in a repository that declares nothing, "add this" is the useful line.
        root = toplevel(cwd)
        config = resolve(load(root, args.config), root)
        changes = collect(cwd, args.base)
        for warning in dead_globs(config, files_at_head(root)):
            _warn(warning)
    except (GitRefused, InvalidConfig) as e:
        raise UsageError(str(e)) from None
    # The environment's mode made explicit: a printed command must not depend on a variable the
    # reviewer's shell does not have.
    mode = effective_mode(args.mode, os.environ)
    invocation = Invocation(changes.base, mode, root if args.repo is not None else None,
                            args.config.absolute() if args.config is not None else None)
    plans = plan(config.tiers, changes.changes)
    results: list[TierResult] = []
    for p in plans:
        # Progress on stderr: a tier can take minutes, and stdout is the report (maybe JSON).
        cmd = display_command(p.tier, mode)
        print(f"sandbox-conformance mr-check: running tier {p.tier.name}: {cmd}", file=sys.stderr, flush=True)
        results.append(run_tier(p.tier, changes.root, mode))
    report = CheckReport(changes, config.source, invocation, plans, tuple(results))
    print(render(report, fmt))
    return exit_code(report)
