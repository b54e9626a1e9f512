"""How close the witness suite is to its floor: the suite's wall time against
(pytest start-up + number of launches x a bare `bwrap ... python3 -I -S -c pass`), all measured in
this run on this host. Target: ratio <= 2.0.

    .venv/bin/python bench/witness_bench.py [--runs N] [--as-user NAME] [--check]

Each figure is the median of N runs (subprocesses, as a user or CI would run them). --check exits 1
when the ratio is above the target."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from probes.run import minimal_env, run  # noqa: E402

TARGET = 2.0


def timed(argv: Sequence[str], runs: int, *, cwd: str | None = None) -> float:
    times = []
    for _ in range(runs):
        started = time.monotonic()
        done = run(argv, timeout=120, env=minimal_env(), cwd=cwd)
        times.append(time.monotonic() - started)
        if done.returncode not in (0,):
            raise SystemExit(f"bench: {' '.join(argv[:4])}... exited {done.returncode}: {done.stderr_tail()}")
    return statistics.median(times)


def bare_bwrap(as_user: str | None) -> list[str]:
    prefix = ["setpriv", f"--reuid={as_user}", f"--regid={as_user}", "--init-groups", "--inh-caps=-all", "--"]
    argv = [
        *(prefix if as_user else []),
        "bwrap",
        "--unshare-all",
        "--die-with-parent",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for d in ("/bin", "/lib", "/lib64", "/sbin"):
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d), d]
    return [*argv, "--proc", "/proc", "--dev", "/dev", "/usr/bin/python3", "-I", "-S", "-c", "pass"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--as-user", default=None)
    # --check, as in the other benches; --strict kept for old scripts.
    ap.add_argument("--check", "--strict", dest="strict", action="store_true",
                    help="exit 1 when the ratio exceeds the target")
    args = ap.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="sbxc-bench-") as tmp:
        (Path(tmp) / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
        startup = timed(
            [py, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "test_nothing.py"],
            args.runs,
            cwd=tmp,
        )
        bare = timed(bare_bwrap(args.as_user), args.runs)
        report = Path(tmp) / "r.json"
        suite_argv = [py, "-m", "runners.cli", "witness", "--json", str(report)]
        if args.as_user:
            suite_argv += ["--as-user", args.as_user]
        suite = timed(suite_argv, args.runs, cwd=str(REPO))
        launches = len(json.loads(report.read_text())["tasks"])
    floor = startup + launches * bare
    ratio = suite / floor
    print(f"pytest start-up       {startup * 1000:8.1f} ms (median of {args.runs})")
    print(f"bare bwrap launch     {bare * 1000:8.1f} ms")
    print(f"launches in the suite {launches:8d}")
    print(f"floor                 {floor * 1000:8.1f} ms")
    print(f"witness suite         {suite * 1000:8.1f} ms")
    print(f"ratio                 {ratio:8.2f} (target <= {TARGET})")
    return 1 if args.strict and ratio > TARGET else 0


if __name__ == "__main__":
    sys.exit(main())
