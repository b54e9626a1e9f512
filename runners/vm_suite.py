"""Inside the VM: the cgroup set-up step, then the witness suite once per leg; one exit code for all.

    python -m runners.vm_suite --leg root --leg sbxc-test:sbxc-test --summary FILE -- WITNESS ARGS...

Run by runners/vm_mode.py as the guest's command (root, cwd = the checkout, which the guest sees at
the same path through its 9p view of the host's /). A leg is LABEL or LABEL:USER; a leg with a user
passes `--as-user USER` to the witness command (the launcher stays root, the tasks run as the user),
the VM's counterpart of container mode's second leg. Legs run one after another in the same boot:
under TCG a boot is cheap, the suite is not, and both must see the same kernel.

`{label}` in any witness argument is replaced by the leg's label (report file names).

`--controls NAME,...` then runs `sandbox-conformance controls --only NAME,... --json` in the same boot
(as root, with the proven cgroup root promised): negative controls that need what only this kernel
offers (limits_dropped needs a delegated cgroup root) are judged here, without a second boot. Its
JSON goes to `--controls-json`; a control that misbehaves makes the combined exit code red.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

from probes.run import run
from runners.cgroup_setup import ENV_ROOT, Mode, Setup, SetupError


def combine(codes: Sequence[int | None]) -> int:
    """Any red is red (1), then bad input (2), then did-not-run (75); all green is 0. Container mode's
    rule (runners/container.py combine), so both modes read the same."""
    norm = [1 if c is None else c for c in codes]
    for wanted in (1, 2, 75):
        if wanted in norm:
            return wanted
    return 0 if norm and all(c == 0 for c in norm) else 1


def parse_leg(text: str) -> tuple[str, str | None]:
    label, _, user = text.partition(":")
    return label, user or None


def witness_argv(label: str, user: str | None, witness: Sequence[str], *,
                 launch_timeout: float | None, python: str = sys.executable) -> list[str]:
    """One leg's witness command. The launch timeout goes before the witness arguments, which may end
    with `-- PYTEST ARGS`."""
    return [python, "-m", "runners.cli", "witness",
            *(["--timeout", str(launch_timeout)] if launch_timeout is not None else []),
            *(["--as-user", user] if user else []),
            *(a.replace("{label}", label) for a in witness)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runners.vm_suite")
    parser.add_argument("--leg", action="append", required=True, type=parse_leg)
    parser.add_argument("--summary", required=True, help="JSON file for the per-leg results")
    parser.add_argument("--timeout", type=float, default=3600.0, help="per leg")
    parser.add_argument("--launch-timeout", type=float, default=None, metavar="SECONDS",
                        help="per task launch, passed to the witness command (runners/vm_mode.py sizes it "
                        "for the accelerator)")
    parser.add_argument("--controls", metavar="NAME,...", help="negative controls to run after the legs")
    parser.add_argument("--controls-json", metavar="FILE", help="where the controls' JSON goes")
    parser.add_argument("witness", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    witness = [a for a in args.witness]
    if witness[:1] == ["--"]:
        witness = witness[1:]
    legs: list[dict[str, object]] = []
    summary: dict[str, object] = {"kernel": os.uname().release, "legs": legs}
    env = dict(os.environ)
    env.pop(ENV_ROOT, None)  # only a root this step proved is promised to the suite
    try:
        result = Setup(Mode.vm).run()
        env[ENV_ROOT] = str(result.root)
        summary["cgroup_root"] = str(result.root)
        print(f"sandbox-conformance vm: cgroup root {result.root} (moved {len(result.moved)} processes "
              f"into supervisor/)", file=sys.stderr, flush=True)
    except SetupError as e:
        # The rest of the suite still runs; the cgroup witnesses skip with the probe's reason (and
        # fail under the require switch).
        summary["cgroup_error"] = str(e)
        print(f"sandbox-conformance vm: cgroup witnesses unavailable: {e}", file=sys.stderr, flush=True)
    codes: list[int | None] = []
    for label, user in args.leg:
        leg_argv = witness_argv(label, user, witness, launch_timeout=args.launch_timeout)
        print(f"sandbox-conformance vm: witness suite as {label}", file=sys.stderr, flush=True)
        started = time.monotonic()
        # The whole process group goes on timeout (tasks, launchers), not just the witness command.
        rc = run(leg_argv, timeout=args.timeout, env=env, capture=False).returncode
        codes.append(rc)
        legs.append({"label": label, "user": user, "returncode": rc,
                     "seconds": round(time.monotonic() - started, 1)})
        print(f"sandbox-conformance vm: as {label}: " + ("timed out" if rc is None else f"exit {rc}"),
              file=sys.stderr, flush=True)
    if args.controls:
        codes.append(run_controls(args.controls, args.controls_json, env=env, timeout=args.timeout,
                                  summary=summary))
    with open(args.summary, "w") as f:
        json.dump(summary, f)
    return combine(codes)


def run_controls(names: str, out: str | None, *, env: dict[str, str], timeout: float,
                 summary: dict[str, object]) -> int | None:
    argv = [sys.executable, "-m", "runners.cli", "controls", "--only", names, "--json"]
    print(f"sandbox-conformance vm: controls {names}", file=sys.stderr, flush=True)
    started = time.monotonic()
    done = run(argv, timeout=timeout, env=env)
    sys.stderr.write(done.stderr)
    rc = done.returncode
    if out and not done.timed_out:
        with open(out, "w") as f:
            f.write(done.stdout)
    summary["controls"] = {"names": names, "returncode": rc, "seconds": round(time.monotonic() - started, 1)}
    print(f"sandbox-conformance vm: controls {names}: " + ("timed out" if rc is None else f"exit {rc}"),
          file=sys.stderr, flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
