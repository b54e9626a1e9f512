#!/usr/bin/python
# Copyright: sandbox-conformance developers. MIT (see the checkout's pyproject.toml).
"""Ansible module: `sandbox-conformance probe --json` on the target, its findings as facts."""

from __future__ import annotations

import json

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sandbox_conformance.fleet.plugins.module_utils.sbxc_run import resolve, run

DOCUMENTATION = r"""
module: probe
short_description: What this host offers a bubblewrap-style sandbox, as facts
description:
  - Runs C(sandbox-conformance probe --json) on the target and returns its findings as the fact
    C(sandbox_conformance), so a play can branch on
    C(sandbox_conformance.findings['userns'].verdict).
  - Never reports a change. Fails only when the probe itself could not run (no CLI, a timeout, a
    crash, output that is not the schema-1 document); whatever the host lacks is a finding, not a
    failure.
options:
  cli:
    description: The sandbox-conformance command (a name on PATH or an absolute path).
    type: str
    default: sandbox-conformance
  only:
    description: Probe ids to run (default all).
    type: list
    elements: str
    default: []
  as_user:
    description: Also run the user-namespace ladder as this user (root only).
    type: str
  dest:
    description: Also write the JSON document to this file on the target (for M(ansible.builtin.fetch)).
    type: path
  timeout:
    description: Seconds before the probe is killed, with its process group.
    type: float
    default: 300
"""

EXAMPLES = r"""
- sandbox_conformance.fleet.probe:
- ansible.builtin.debug:
    msg: "{{ sandbox_conformance.findings['userns'].reason }}"
  when: sandbox_conformance.findings['userns'].verdict != 'supported'
"""

RETURN = r"""
findings:
  description: Each finding by probe id, as `probe --json` prints it (verdict, reason, evidence, facts).
  type: dict
  returned: success
context:
  description: The probe's context (euid, kernel, bwrap path and version, ...).
  type: dict
  returned: success
ansible_facts:
  description: C(sandbox_conformance) with C(findings), C(context) and C(schema).
  type: dict
  returned: success
"""


def main():
    module = AnsibleModule(
        argument_spec={
            "cli": {"type": "str", "default": "sandbox-conformance"},
            "only": {"type": "list", "elements": "str", "default": []},
            "as_user": {"type": "str"},
            "dest": {"type": "path"},
            "timeout": {"type": "float", "default": 300.0},
        },
        supports_check_mode=True,  # it only looks: every trial runs in a throwaway child
    )
    p = module.params
    cli = resolve(p["cli"])
    if cli is None:
        module.fail_json(msg=f"no {p['cli']} on this host (PATH or /opt/sandbox-conformance): "
                             "install it first")
    argv = [cli, "probe", "--json"]
    if p["only"]:
        argv += ["--only", ",".join(p["only"])]
    if p["as_user"]:
        argv += ["--as-user", p["as_user"]]
    done = run(argv, p["timeout"])
    if done.timed_out:
        module.fail_json(msg=f"the probe did not finish in {p['timeout']:g}s", argv=argv)
    if done.returncode != 0:
        module.fail_json(msg=f"the probe exited {done.returncode}: {done.stderr_tail() or '(no stderr)'}",
                         argv=argv, rc=done.returncode)
    try:
        doc = json.loads(done.stdout)
        findings = {f["probe"]: f for f in doc["findings"]}
    except (ValueError, KeyError, TypeError) as e:
        module.fail_json(msg=f"the probe's output is not its JSON document ({e})", argv=argv,
                         stdout=done.stdout[-2000:])
    if p["dest"]:
        with open(p["dest"], "w") as f:
            f.write(done.stdout)
    fact = {"schema": doc.get("schema"), "context": doc.get("context", {}), "findings": findings}
    module.exit_json(changed=False, findings=findings, context=fact["context"],
                     ansible_facts={"sandbox_conformance": fact})


if __name__ == "__main__":
    main()
