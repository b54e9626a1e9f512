#!/usr/bin/python
# Copyright: sandbox-conformance developers. MIT (see the checkout's pyproject.toml).
"""Ansible module: `sandbox-conformance run` on the target; its verdict line, status and JSON report."""

from __future__ import annotations

import json
import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sandbox_conformance.fleet.plugins.module_utils.sbxc_run import resolve, run

DOCUMENTATION = r"""
module: witness
short_description: Run the witness suite where the host allows it, or learn why not
description:
  - Runs C(sandbox-conformance run) (mode auto, native, container or vm) on the target with
    C(--json) and C(--junitxml) into O(report_dir), and returns the verdict line, the exit code as a
    status and the JSON report(s).
  - C(status) is C(passed) (exit 0), C(failed) (1, a promise broken or a harness error; also a
    run killed on timeout or one that crashed), C(refused) (75, with C(reason)) or C(error) (2,
    bad input, with C(reason)).
  - A refusal is not a task failure unless O(fail_on_refusal) says so; C(failed) and C(error) are,
    unless O(fail_on_broken) is false (the role turns it off so the reports are always fetched,
    and lets the fleet table be the gate).
  - Never reports a change (the suite creates its task layout and removes it, whatever happened).
options:
  cli:
    description: The sandbox-conformance command (a name on PATH or an absolute path).
    type: str
    default: sandbox-conformance
  mode:
    description:
      - Where the suite may run (C(--mode)).
      - The module always passes it, so the target's C(SANDBOX_CONFORMANCE_MODE) does not apply.
    type: str
    choices: [auto, native, container, vm]
    default: auto
  profile:
    description: A profile file on the target (C(--profile)).
    type: path
  adapter:
    description: A sandbox tool's adapter (C(--adapter)).
    type: str
  launcher:
    description: An external launcher prefix (C(--launcher)).
    type: str
  as_user:
    description: Launch tasks as this user; native mode, root only (C(--as-user)).
    type: str
  launcher_spec:
    description: Give the launcher the task spec, named by C(SANDBOX_CONFORMANCE_TASK_SPEC)
      (C(--launcher-spec)).
    type: bool
    default: false
  launcher_stdin:
    description: Run C(PREFIX python3 -I -S -) with the witness program on stdin (C(--launcher-stdin)).
    type: bool
    default: false
  launcher_env:
    description: C(NAME=VALUE), or C(NAME) passed from the run's environment, in the launcher's
      environment (C(--launcher-env), once each).
    type: list
    elements: str
    default: []
  layout_root:
    description: Make each task's layout under this directory on the target (C(--layout-root)).
    type: path
  only:
    description: Run only these promises (C(--only), once each).
    type: list
    elements: str
    default: []
  skip:
    description: Leave these promises out (C(--skip), once each).
    type: list
    elements: str
    default: []
  launch_timeout:
    description: Seconds one task launch may take (C(--launch-timeout)).
    type: float
  host_cannot_observe:
    description: Why the target's kernel cannot see the launcher's tasks, a VM or a user-space kernel
      (C(--host-cannot-observe)).
    type: str
  require:
    description: Turn every skip into a failure (C(--require)).
    type: bool
    default: false
  expected_skips:
    description: A file of C(test id | reason) lines on the target (C(--expected-skips)).
    type: path
  image:
    description: Container mode, an image instead of building the Dockerfile (C(--image)).
    type: str
  base_image:
    description: Container mode, the Dockerfile's BASE (C(--base-image)).
    type: str
  environment:
    description: Extra environment for the run (for example DOCKER_HOST, SANDBOX_CONFORMANCE_REQUIRE).
    type: dict
    default: {}
  timeout:
    description:
      - Seconds per witness run (C(--timeout)).
      - The whole run is killed with its process group after 1800 + 2 * timeout + 600 seconds (a
        container build, two legs, set-up).
    type: float
    default: 1800
  report_dir:
    description: Directory on the target for witness.json / witness.xml (or witness-LEG.*) and run.json.
    type: path
    required: true
  fail_on_refusal:
    description: A refusal fails the task.
    type: bool
    default: false
  fail_on_broken:
    description: A red run (C(failed)) or one that erred (C(error)) fails the task.
    type: bool
    default: true
"""

RETURN = r"""
status:
  description: passed, failed, refused or error.
  type: str
  returned: always
exit_code:
  description:
    - The run's exit code (null when it was killed on timeout).
    - Not C(rc), which Ansible reads as a failure whenever it is not 0.
  type: int
  returned: always
verdict_line:
  description: "The run's last word, e.g. C(sandbox-conformance: PASS mode=native exit=0 time=3.1s)."
  type: str
  returned: always
mode:
  description: The mode the run ended in (the requested one when it was refused).
  type: str
  returned: always
reason:
  description: Why it was refused, or why it erred (empty on a pass).
  type: str
  returned: always
ways_on:
  description: What the refusal says would make it run.
  type: list
  returned: always
report:
  description: The JSON report of a single-leg run (native), else null.
  type: dict
  returned: always
reports:
  description: Every JSON report by leg (C(main) for one leg; C(root) and C(sbxc) in container mode).
  type: dict
  returned: always
"""


STATUS = {0: "passed", 1: "failed", 75: "refused", 2: "error"}
# commands/run.py: every run ends with this line on stderr, whatever path it left by.
# The word is PASS, FAIL, REFUSED, ERROR, or KILLED-SIGTERM (and -SIGINT, -SIGHUP) for a cancelled run.
VERDICT = re.compile(
    r"^sandbox-conformance: (?P<word>[A-Z]+(?:-[A-Z]+)?) mode=(?P<mode>\S+) exit=(?P<exit>\d+)"
)
# `sandbox-conformance run: refused: ...` (the decision or container mode) or the witness command's
# own `sandbox-conformance witness: refused: ...`, then `  way on: ...` lines.
REFUSED = re.compile(r"^sandbox-conformance(?: [a-z-]+)?: refused: (?P<reason>.+)$")
WAY_ON = re.compile(r"^(?:sandbox-conformance run: )?\s*way on: (?P<way>.+)$")
# A run that starts and ends a container build gets 1800 s for the build (commands/run.py), two
# legs of `timeout` each, and set-up: the whole run is given that much before its group is killed.
BUILD_SECONDS = 1800
SETUP_SECONDS = 600


# Every option that stands for a `run` flag, and the flag. tests/test_fleet_options.py checks each
# against `run`'s own parser (its options come from conformance/options.py's table): the flag, its type,
# default and choices, and that DOCUMENTATION and argument_spec below say the same. This file is copied
# to the target alone, so it cannot read the table itself.
FLAGS = (
    ("mode", "--mode"), ("timeout", "--timeout"), ("profile", "--profile"), ("adapter", "--adapter"),
    ("launcher", "--launcher"), ("launcher_spec", "--launcher-spec"), ("launcher_stdin", "--launcher-stdin"),
    ("launcher_env", "--launcher-env"), ("layout_root", "--layout-root"), ("only", "--only"),
    ("skip", "--skip"), ("as_user", "--as-user"), ("require", "--require"),
    ("expected_skips", "--expected-skips"), ("launch_timeout", "--launch-timeout"),
    ("host_cannot_observe", "--host-cannot-observe"), ("image", "--image"), ("base_image", "--base-image"),
)


def run_argv(cli, p):
    argv = [cli, "run"]
    for key, flag in FLAGS:
        value = p[key]
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, list):
            for item in value:
                argv += [flag, str(item)]
        elif isinstance(value, float):
            argv += [flag, f"{value:g}"]
        elif value != "":
            argv += [flag, value]
    return [*argv,
            "--json", os.path.join(p["report_dir"], "witness.json"),
            "--junitxml", os.path.join(p["report_dir"], "witness.xml")]


def read_reports(report_dir):
    """witness.json (one leg) or witness-LEG.json (container and VM modes: one per leg)."""
    reports = {}
    for name in sorted(os.listdir(report_dir)):
        m = re.fullmatch(r"witness(?:-(?P<leg>[\w.-]+))?\.json", name)
        if not m:
            continue
        try:
            with open(os.path.join(report_dir, name)) as f:
                reports[m.group("leg") or "main"] = json.load(f)
        except (OSError, ValueError):
            reports[m.group("leg") or "main"] = None  # a leg that crashed mid-write: its code says so
    return reports


def summarise(done, limit):
    lines = done.stderr.splitlines()
    verdict = next((line for line in reversed(lines) if VERDICT.match(line)), "")
    m = VERDICT.match(verdict)
    refused = [REFUSED.match(line).group("reason") for line in lines if REFUSED.match(line)]
    ways_on = [WAY_ON.match(line).group("way") for line in lines if WAY_ON.match(line)]
    if done.timed_out:
        # As commands/run.py reads its witness child: a timeout or a crash is red, never a pass.
        status, reason = "failed", f"the run did not finish in {limit:g}s and was killed"
    elif done.returncode not in STATUS:
        status, reason = "failed", f"the run exited {done.returncode}: {done.stderr_tail(2)}"
    else:
        status = STATUS[done.returncode]
        if status == "refused":
            reason = refused[0] if refused else done.stderr_tail(2)
        elif status == "passed":
            reason = ""
        else:
            reason = done.stderr_tail(2)
    return {"status": status, "exit_code": done.returncode, "verdict_line": verdict,
            "mode": m.group("mode") if m else "", "reason": reason, "ways_on": ways_on}


def main():
    module = AnsibleModule(
        argument_spec={
            "cli": {"type": "str", "default": "sandbox-conformance"},
            "mode": {"type": "str", "default": "auto", "choices": ["auto", "native", "container", "vm"]},
            "profile": {"type": "path"},
            "adapter": {"type": "str"},
            "launcher": {"type": "str"},
            "launcher_spec": {"type": "bool", "default": False},
            "launcher_stdin": {"type": "bool", "default": False},
            "launcher_env": {"type": "list", "elements": "str", "default": []},
            "layout_root": {"type": "path"},
            "only": {"type": "list", "elements": "str", "default": []},
            "skip": {"type": "list", "elements": "str", "default": []},
            "launch_timeout": {"type": "float"},
            "host_cannot_observe": {"type": "str"},
            "as_user": {"type": "str"},
            "require": {"type": "bool", "default": False},
            "expected_skips": {"type": "path"},
            "image": {"type": "str"},
            "base_image": {"type": "str"},
            "environment": {"type": "dict", "default": {}},
            "timeout": {"type": "float", "default": 1800.0},
            "report_dir": {"type": "path", "required": True},
            "fail_on_refusal": {"type": "bool", "default": False},
            "fail_on_broken": {"type": "bool", "default": True},
        },
    )
    p = module.params
    cli = resolve(p["cli"])
    if cli is None:
        module.fail_json(msg=f"no {p['cli']} on this host (PATH or /opt/sandbox-conformance): "
                             "install it first")
    os.makedirs(p["report_dir"], exist_ok=True)
    for name in os.listdir(p["report_dir"]):  # a stale leg's report must not pass for this run's
        if re.fullmatch(r"(witness(-[\w.-]+)?\.(json|xml)|run\.json)", name):
            os.unlink(os.path.join(p["report_dir"], name))
    argv = run_argv(cli, p)
    limit = BUILD_SECONDS + 2 * p["timeout"] + SETUP_SECONDS
    env = {str(k): str(v) for k, v in p["environment"].items()}
    done = run(argv, limit, env=env)
    result = summarise(done, limit)
    reports = read_reports(p["report_dir"])
    # run.json: the outcome beside the reports, so a fetched directory says how the run went even
    # where it wrote no report (a refusal, a timeout).
    with open(os.path.join(p["report_dir"], "run.json"), "w") as f:
        json.dump({"schema": 1, "argv": argv, **result, "legs": sorted(reports)}, f, indent=2)
    result.update(changed=False, argv=argv, reports=reports,
                  report=reports["main"] if list(reports) == ["main"] else None,
                  stderr_tail=done.stderr.strip().splitlines()[-20:])
    if (result["status"] == "refused" and p["fail_on_refusal"]) or (
            result["status"] in ("failed", "error") and p["fail_on_broken"]):
        module.fail_json(msg=f"{result['status']}: {result['reason'] or result['verdict_line']}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
