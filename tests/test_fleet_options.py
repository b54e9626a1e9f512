"""The Ansible module's options (fleet/plugins/modules/witness.py) against `run`'s own (issue 30: one
option, declared once). The module is a file Ansible copies to the target alone, so it cannot read the
option table (conformance/options.py); this reads the module instead: its DOCUMENTATION, its
argument_spec and its FLAGS, as literals, without importing Ansible."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandbox_conformance.commands import cli
from sandbox_conformance.conformance import options

MODULE = Path(__file__).resolve().parent.parent / "fleet" / "plugins" / "modules" / "witness.py"
# The module's own options: what runs `run`, where its reports go, and how the task ends.
MODULE_ONLY = {"cli", "environment", "report_dir", "fail_on_refusal", "fail_on_broken"}
# `run` flags the module sets itself or leaves out, and why.
NOT_OFFERED = {
    "--json": "the module writes it into report_dir",
    "--junitxml": "the module writes it into report_dir",
    "--verdict-json": "the module's run.json says how the run went",
    "--log": "the module returns stderr's tail; the log stays on the target",
    "--format": "the module reads the JSON report, not the table",
    "--verbose": "the module reads the JSON report, not the table",
    "--print-mode": "a question, not a run",
    "--delegate": "needs a systemd user session on the target, which Ansible's become does not give",
}
ANSIBLE_TYPES = {"str": (None,), "path": (None,), "float": (float,)}
# Defaults that differ, and why.
OWN_DEFAULTS = {"mode": "run's is $SANDBOX_CONFORMANCE_MODE or auto; the module always passes one"}


def _literals() -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    tree = ast.parse(MODULE.read_text())
    doc = flags = spec = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id == "DOCUMENTATION":
                doc = yaml.safe_load(ast.literal_eval(node.value))
            elif node.targets[0].id == "FLAGS":
                flags = dict(ast.literal_eval(node.value))
        elif isinstance(node, ast.keyword) and node.arg == "argument_spec":
            spec = ast.literal_eval(node.value)
    assert doc is not None and flags is not None and spec is not None
    return doc["options"], spec, flags


def _run_actions() -> dict[str, argparse.Action]:
    parser = cli.build_parser(["run"])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["run"]
    return {s: a for a in sub._actions for s in a.option_strings if s.startswith("--")}


def test_documentation_and_argument_spec_describe_the_same_options() -> None:
    doc, spec, _ = _literals()
    assert set(doc) == set(spec)
    for name, entry in spec.items():
        documented = doc[name]
        for key in ("type", "default", "choices", "elements", "required"):
            assert documented.get(key) == entry.get(key), f"{name}: {key}"


def test_every_run_flag_is_an_option_of_the_module_or_left_out_with_a_reason() -> None:
    _, spec, flags = _literals()
    assert set(spec) - set(flags) == MODULE_ONLY
    offered = set(flags.values())
    assert offered.isdisjoint(NOT_OFFERED)
    assert set(_run_actions()) - {"--help"} == offered | set(NOT_OFFERED)


@pytest.mark.parametrize("name", sorted(_literals()[2]))
def test_each_option_is_its_flag_with_the_flags_type_default_and_choices(name: str) -> None:
    doc, spec, flags = _literals()
    flag, entry, action = flags[name], spec[name], _run_actions()[flags[name]]
    assert f"C({flag}" in " ".join(doc[name]["description"] if isinstance(doc[name]["description"], list)
                                   else [doc[name]["description"]]), "its description names the flag"
    if isinstance(action, argparse._StoreTrueAction):
        assert entry == {"type": "bool", "default": False}
    elif isinstance(action, argparse._AppendAction):
        assert entry == {"type": "list", "elements": "str", "default": []}
    else:
        assert action.type in ANSIBLE_TYPES[entry["type"]]
        assert entry.get("default") == action.default or name in OWN_DEFAULTS
        assert tuple(entry.get("choices") or ()) == tuple(action.choices or ())
    table = {o.flag: o for o in options.TABLE}
    if flag in table:  # a witness option: `run` takes it from the table, forwarded by the same flag
        assert options.RUN in table[flag].commands


def test_the_argv_passes_each_option_as_its_flag() -> None:
    source = MODULE.read_text()
    tree = ast.parse(source)
    namespace: dict[str, Any] = {"os": __import__("os")}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "FLAGS") or (isinstance(node, ast.FunctionDef)
                                                       and node.name == "run_argv"):
            exec(compile(ast.Module([node], []), str(MODULE), "exec"), namespace)
    _, spec, flags = _literals()
    params: dict[str, Any] = {k: v.get("default") for k, v in spec.items()}
    params.update(report_dir="/r", profile="/p.toml", launcher_env=["A=1", "B"], only=["network"],
                  launcher_spec=True, launch_timeout=45.0, host_cannot_observe="a VM")
    argv = namespace["run_argv"]("sandbox-conformance", params)
    parsed = cli.build_parser(argv[1:]).parse_args(argv[1:])
    assert parsed.command == "run"
    assert (parsed.profile, parsed.launcher_env, parsed.only) == ("/p.toml", ["A=1", "B"], ["network"])
    assert (parsed.launcher_spec, parsed.launcher_stdin, parsed.require) == (True, False, False)
    assert (parsed.launch_timeout, parsed.timeout, parsed.mode) == (45.0, 1800.0, "auto")
    assert parsed.host_cannot_observe == "a VM" and parsed.json == "/r/witness.json"
    assert set(flags) <= set(params)
