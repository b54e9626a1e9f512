"""`sandbox-conformance probe`'s table, read as a person reads it: the verdict column aligned, the
cause, the one-line way on under what is not a pass; one line a finding through a pipe, wrapped
under its own column and coloured on a terminal (never with NO_COLOR). And `--json` unchanged."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import termios
import time
from pathlib import Path

import pytest

from sandbox_conformance.commands.probe import render_table, way_on
from sandbox_conformance.probes.finding import Finding, Verdict
from sandbox_conformance.runners import decide

REPO = Path(__file__).resolve().parent.parent
CLI = REPO / ".venv/bin/sandbox-conformance"
ANSI = re.compile(r"\x1b\[[0-9;]*m")

MASKED = Finding("pidns.proc", Verdict.denied,
                 "pidns.proc failed (at bwrap, EPERM): /proc has mounts over its contents (/proc/acpi: "
                 "masked or read-only), so the kernel refuses a fresh procfs (mount_too_revealing)",
                 {}, {"cause": "masked_proc", "errno": "EPERM"})
FINDINGS = [
    Finding("platform", Verdict.not_detected, "Debian GNU/Linux 12 (bookworm), kernel 6.1.0, x86_64"),
    Finding("bwrap", Verdict.supported, "bubblewrap 0.8.0 at /usr/bin/bwrap, unprivileged"),
    Finding("userns", Verdict.supported, "unshare(CLONE_NEWUSER) worked", {}, {"cause": None}),
    MASKED,
    Finding("deployment", Verdict.unknown, "no deployment signature to check"),
]


def verdict_column(lines: list[str]) -> set[int]:
    """Where each row's verdict starts: the first non-space after the PROBE column."""
    return {len(line) - len(line[line.index(" "):].lstrip()) for line in lines}


def rows(table: str) -> list[str]:
    return [line for line in table.splitlines() if line and not line.startswith(" ")][1:-1]


def test_every_verdict_starts_in_one_column_and_the_cause_has_its_own() -> None:
    table = render_table(FINDINGS)
    head, *body = table.splitlines()
    assert head.split() == ["PROBE", "VERDICT", "CAUSE", "REASON"]
    assert len(verdict_column([head, *rows(table)])) == 1
    masked = next(line for line in body if line.startswith("pidns.proc"))
    assert masked.split()[1:3] == ["denied", "masked_proc"]
    # A finding without a cause shows `-` in the CAUSE column, aligned like the rest.
    assert next(line for line in body if line.startswith("userns")).split()[2] == "-"


def test_what_is_not_a_pass_gets_the_one_line_way_on_run_would_name() -> None:
    table = render_table(FINDINGS)
    lines = table.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("pidns.proc"))
    assert lines[i + 1].strip() == f"way on: {decide.CAUSE_WAY_ON['masked_proc']}"
    # The way-on line sits under the REASON column.
    assert lines[i + 1].index("way on") == lines[0].index("REASON")
    # Passes and "am I in X?" answers get none; a failure whose cause names no host setting neither.
    assert table.count("way on:") == 1


def test_a_healthy_table_has_no_cause_column_and_ends_with_the_count() -> None:
    healthy = [f for f in FINDINGS if f.verdict is not Verdict.denied]
    table = render_table(healthy)
    assert table.splitlines()[0].split() == ["PROBE", "VERDICT", "REASON"]
    assert table.splitlines()[-1] == "4 probes: 2 supported, 1 not_detected, 1 unknown"


def test_piped_each_finding_is_one_line_and_on_a_terminal_it_wraps_under_its_column() -> None:
    assert len(render_table(FINDINGS).splitlines()) == 1 + len(FINDINGS) + 1 + 1  # head, rows, way on, count
    wrapped = render_table(FINDINGS, width=80)
    lines = wrapped.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    reason_col = lines[0].index("REASON")
    continuation = [line for line in lines if line.startswith(" ")]
    assert continuation, "the long reason wrapped"
    assert all(len(line) - len(line.lstrip()) >= reason_col for line in continuation)
    # Wrapping only moves words: the reason reads the same, joined back.
    i = next(n for n, line in enumerate(lines) if line.startswith("pidns.proc"))
    parts = [lines[i][reason_col:]]
    for line in lines[i + 1:]:
        if not line.startswith(" ") or "way on" in line:
            break
        parts.append(line.strip())
    assert " ".join(parts) == MASKED.reason


def test_colour_is_only_the_verdict_and_never_shifts_a_column() -> None:
    coloured = render_table(FINDINGS, colour=True)
    assert "\x1b[31mdenied\x1b[0m" in coloured and "\x1b[32msupported\x1b[0m" in coloured
    assert ANSI.sub("", coloured) == render_table(FINDINGS)


def test_a_rung_untried_for_want_of_bwrap_leaves_the_way_on_to_the_bwrap_row() -> None:
    bwrap = Finding("bwrap", Verdict.unsupported, "bwrap not found in PATH", {}, {"path": None})
    rung = Finding("netns", Verdict.unsupported, "not tried: bwrap not found", {}, {"cause": "no_bwrap"})
    by = {"bwrap": bwrap, "netns": rung}
    assert way_on(bwrap, by) == decide.CAUSE_WAY_ON["no_bwrap"]
    assert way_on(rung, by) is None
    assert render_table([bwrap, rung]).count("way on:") == 1


# ---------------------------------------------------------------- the command, as a user runs it

def _cli_or_skip() -> None:
    if not CLI.exists():
        pytest.skip(f"{CLI} not installed: run `make setup`")


def test_piped_the_table_has_no_colour_and_one_line_a_finding() -> None:
    _cli_or_skip()
    done = subprocess.run([str(CLI), "probe", "--only", "platform,deployment"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "TERM": "xterm"})
    assert done.returncode == 0, done.stderr
    assert not ANSI.search(done.stdout)
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines[1:-1]] == ["platform", "deployment"]
    assert lines[-1].startswith("2 probes: ")


def _on_a_terminal(argv: list[str], env: dict[str, str], columns: int = 90) -> str:
    """argv's output through a pseudo-terminal `columns` wide (TIOCSWINSZ), as a person sees it."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    proc = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower, env=env,
                            start_new_session=True)
    os.close(follower)
    out = b""
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # EIO: the terminal's other end is closed, the child is done
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        assert proc.wait(timeout=30) == 0, out.decode(errors="replace")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        os.close(leader)
    return out.decode(errors="replace").replace("\r\n", "\n")


def test_on_a_terminal_the_verdict_is_coloured_and_the_reason_wraps_and_no_color_turns_colour_off() -> None:
    _cli_or_skip()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "", "LINES": ""}
    env.pop("NO_COLOR", None)
    argv = [str(CLI), "probe", "--only", "platform,bwrap,cgroup.delegation"]
    shown = _on_a_terminal(argv, {k: v for k, v in env.items() if v})
    assert ANSI.search(shown), shown
    plain = ANSI.sub("", shown)
    assert all(len(line) <= 90 for line in plain.splitlines()), plain
    assert len(verdict_column(rows(plain))) == 1
    no_colour = _on_a_terminal(argv, {**{k: v for k, v in env.items() if v}, "NO_COLOR": "1"})
    assert not ANSI.search(no_colour)


def test_json_keeps_its_schema_1_shape() -> None:
    """--json is unchanged by the table: the same top-level keys, context keys and finding keys, every
    evidence value a string (docs/findings.md)."""
    _cli_or_skip()
    if shutil.which("bwrap") is None:
        pytest.skip("bwrap not installed (apt-get install bubblewrap)")
    done = subprocess.run([str(CLI), "probe", "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert list(doc) == ["schema", "context", "findings"] and doc["schema"] == 1
    assert set(doc["context"]) == {"euid", "user", "as_user", "kernel", "arch", "python", "bwrap",
                                   "bwrap_version"}
    for f in doc["findings"]:
        assert list(f) == ["probe", "verdict", "reason", "evidence", "facts"]
        assert f["verdict"] in {str(v) for v in Verdict}
        assert all(isinstance(v, str) for v in f["evidence"].values())
    ladder = [f for f in doc["findings"] if f["probe"] in ("userns", "userns.map", "netns", "pidns.proc",
                                                            "disable_userns")]
    assert len(ladder) == 5
    for f in ladder:
        assert {"cause", "also", "errno", "user", "step", "observed_by"} <= set(f["facts"])
        assert f["facts"]["observed_by"] in ("combined", "rung", None)
