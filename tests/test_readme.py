"""The README works as written: every shell block in README.md and the docs it links is run, command
by command, in a scratch directory (or the checkout, where the block says `in checkout`), and each
command must exit as the block's directive documents. A block that cannot run here says why in the
directive, and the directive must account for every command: a new command without a documented
result fails this test.

Directive, on the line before the fence:

    <!-- readme-test: [in checkout;] exit 0; exit 75; skip: boots qemu for minutes -->

Also here: the README's command table is the one the parsers render (commands/table.py)."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>\w*)\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)
DIRECTIVE = re.compile(r"<!--\s*readme-test:\s*(?P<spec>.*?)\s*-->\s*$")
SHELL = {"sh", "bash", "shell", "console"}


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    text: str
    expect: str  # "exit N" or "skip: why"
    in_checkout: bool


def commands(lines: str) -> list[str]:
    """One command per line, `\\` continuations joined, comments and blank lines left out; a heredoc
    (`<<'EOF'` ... `EOF`) belongs to the command that opens it."""
    out: list[str] = []
    pending = ""
    heredoc: str | None = None
    for raw in lines.splitlines():
        if heredoc is not None:
            pending += "\n" + raw
            if raw.strip() == heredoc:
                out.append(pending)
                pending, heredoc = "", None
            continue
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        pending = f"{pending}\n{raw}" if pending else raw
        if line.endswith("\\"):
            continue
        m = re.search(r"<<-?\s*'?(\w+)'?", line)
        if m:
            heredoc = m.group(1)
            continue
        out.append(pending)
        pending = ""
    assert heredoc is None and not pending, f"unterminated command: {pending!r}"
    return out


def collect() -> tuple[list[Command], list[str]]:
    found: list[Command] = []
    problems: list[str] = []
    for doc in DOCS:
        # A ````markdown example (a rendered handover) quotes shell blocks that are not commands to run.
        text = re.sub(
            r"^````.*?^````", lambda q: "\n" * q.group(0).count("\n"), doc.read_text(), flags=re.M | re.S
        )
        for m in FENCE.finditer(text):
            if m.group("lang") not in SHELL:
                continue
            line = text[: m.start()].count("\n") + 1
            where = f"{doc.relative_to(REPO)}:{line}"
            before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            d = DIRECTIVE.search(before)
            if d is None:
                problems.append(f"{where}: a shell block with no readme-test directive before it")
                continue
            parts = [p.strip() for p in d.group("spec").split(";") if p.strip()]
            in_checkout = parts[:1] == ["in checkout"]
            parts = parts[1:] if in_checkout else parts
            cmds = commands(m.group("body"))
            if len(parts) != len(cmds):
                problems.append(f"{where}: {len(cmds)} commands but {len(parts)} documented results")
                continue
            for cmd, expect in zip(cmds, parts, strict=True):
                if not re.fullmatch(r"exit \d+|skip: .+", expect):
                    problems.append(f"{where}: {expect!r} is neither `exit N` nor `skip: why`")
                found.append(Command(str(doc.relative_to(REPO)), line, cmd, expect, in_checkout))
    return found, problems


COMMANDS, PROBLEMS = collect()


def test_every_shell_block_documents_how_each_command_ends() -> None:
    assert not PROBLEMS, PROBLEMS
    assert COMMANDS


def _run(cmd: Command, scratch: Path) -> str | None:
    """None when the command exited as documented, else what happened."""
    env = {
        "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
    }
    done = subprocess.run(
        ["sh", "-c", cmd.text],
        cwd=REPO if cmd.in_checkout else scratch,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    want = int(cmd.expect.split()[1])
    if done.returncode == want and "Traceback" not in done.stderr:
        return None
    # The lines that say what went wrong, wherever they are: a `controls` table is longer than any tail,
    # and its FAILED row was cut off once (a fresh clone under load: `controls` exited 1, reason unseen).
    # With a FAILED control, its reasons: the `  - ` lines right under it (commands/controls.py).
    said, under_failed = [], False
    for ln in done.stdout.splitlines():
        under_failed = (under_failed and ln.startswith("  - ")) or "FAILED" in ln
        if under_failed or re.search(r"BROKEN|harness error", ln):
            said.append(ln)
    return (
        f"{cmd.doc}:{cmd.line}: `{cmd.text}` exited {done.returncode}, the document says {want}\n"
        + "".join(f"{ln[:2000]}\n" for ln in said[:20])
        + f"{done.stdout[-1200:]}\n{done.stderr[-1200:]}"
    )


DOCS_WITH_COMMANDS = sorted({c.doc for c in COMMANDS if c.expect.startswith("exit")})


@pytest.mark.integration
@pytest.mark.timeout(1200)  # every example of the document, in turn (two full control runs among them)
@pytest.mark.parametrize("doc", DOCS_WITH_COMMANDS)
def test_every_runnable_command_of_a_document_exits_as_documented(
    doc: str, tmp_path: Path, root_only: None
) -> None:
    # In document order, in one scratch directory, as a reader's shell would: a block may create the
    # files a later one uses (the external-launcher example).
    failures = [
        f for c in COMMANDS if c.doc == doc and c.expect.startswith("exit") if (f := _run(c, tmp_path))
    ]
    assert not failures, "\n\n".join(failures)


def test_the_commands_table_is_the_one_the_parsers_render() -> None:
    from sandbox_conformance.commands import table as commands_table

    table = commands_table.render()
    text = (REPO / "README.md").read_text()
    begin, end = text.index(commands_table.BEGIN), text.index(commands_table.END) + len(commands_table.END)
    assert text[begin:end] == table, (
        f"README's command table is stale; paste `python -m sandbox_conformance.commands.table`:\n{table}"
    )
