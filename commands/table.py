"""The README's command table, rendered from the argparse parsers themselves: one source for `--help`
and the front door.
`python -m sandbox_conformance.commands.table` prints it; tests/test_readme.py fails when the
README's copy (between the `commands:begin` and `commands:end` markers) differs."""

from __future__ import annotations

import argparse

from sandbox_conformance.commands.cli import SUBCOMMANDS, build_parser

BEGIN, END = "<!-- commands:begin (python -m sandbox_conformance.commands.table) -->", "<!-- commands:end -->"


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    out = []
    for action in parser._actions:  # argparse keeps no public list of a parser's actions
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        if not action.option_strings:
            out.append(f"`{action.metavar or action.dest}`")
            continue
        flag = "/".join(action.option_strings)
        takes = action.nargs != 0 and not isinstance(action, argparse._StoreConstAction)
        out.append(f"`{flag} {action.metavar or action.dest.upper()}`" if takes else f"`{flag}`")
    return out


def render() -> str:
    parser = build_parser(["probe"])  # every subcommand's arguments: built below one by one
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    rows = ["| command | what it does | options |", "|---|---|---|"]
    for name, (_, help_) in SUBCOMMANDS.items():
        full = build_parser([name])
        sub = next(a for a in full._actions if isinstance(a, argparse._SubParsersAction))
        rows.append(f"| `sandbox-conformance {name}` | {help_} | {' '.join(_flags(sub.choices[name]))} |")
    return "\n".join([BEGIN, *rows, END])


if __name__ == "__main__":
    print(render())
