"""How verdicts are shown to a person: the promise table as text (aligned, or one line per promise)
or as Markdown to paste into a merge request, a refusal as Markdown, and whether to use colour.

Pure functions over the rows `conformance/verdicts.py promise_lines()` makes, `(promise, verdict, what the
task saw)`, and the remedy line of each promise that has a BROKEN row (conformance/remedies.py, by
promise id), printed once under that promise's last BROKEN row; the only inputs from outside are a
stream's tty-ness and an environment, both passed in. `mrcheck/report.py` may call `table_markdown` /
`refusal_markdown` for the same table in mr-check.

The `lines` form, `promise: verdict[: detail]` one per line, is a contract: the fleet tooling, the
tests and mrcheck/tiers.py (for a run that left no verdict document with the rows) parse it. A remedy
line is indented (`  usually: ...`), so a parser of rows passes over it. The `table` form is for eyes only."""

from __future__ import annotations

import enum
import re
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, TextIO

Row = tuple[str, str, str]  # (promise label, verdict: one of VERDICTS, what the task saw)

# `not selected`: a promise the profile makes that --only/--skip left out of this run; never kept.
VERDICTS = ("kept", "BROKEN", "not tested", "not selected")
REMEDY_HEAD = "usually: "  # how a remedy line starts (conformance/remedies.py Remedy.line)
HEADER = ("PROMISE", "VERDICT", "WHAT THE TASK SAW")
MIN_DETAIL = 30  # narrower than this, a wrapped detail column reads worse than a long line


class Format(enum.StrEnum):
    auto = enum.auto()  # table on a terminal, lines otherwise (like ls(1) choosing its columns)
    table = enum.auto()
    lines = enum.auto()
    markdown = enum.auto()


def resolve(fmt: Format | str | None, stream: TextIO) -> Format:
    fmt = Format(fmt or Format.auto)
    if fmt is Format.auto:
        return Format.table if _isatty(stream) else Format.lines
    return fmt


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or fd-less stream (pytest's capture) is no terminal
        return False


def use_colour(stream: TextIO, environ: Mapping[str, str]) -> bool:
    """Colour only on a terminal. https://no-color.org: NO_COLOR present and not empty turns it off
    whatever else is true; TERM=dumb declares a terminal without escape sequences (terminfo(5))."""
    if environ.get("NO_COLOR", "") != "" or environ.get("TERM") == "dumb":
        return False
    return _isatty(stream)


# SGR parameters (ECMA-48 8.3.117): 1 bold, 2 faint, 31 red, 32 green, 33 yellow; 0 resets.
_SGR = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33"}
VERDICT_STYLE: dict[str, tuple[str, ...]] = {
    "kept": ("green",),
    "BROKEN": ("bold", "red"),
    "not tested": ("yellow",),
    "not selected": ("dim",),
    "PASS": ("bold", "green"),
    "FAIL": ("bold", "red"),
}


class Style(NamedTuple):
    """How text is painted: in ANSI colours (SGR) when `colour` is set, a verdict word in the style
    VERDICT_STYLE gives it; unchanged otherwise."""

    colour: bool = False

    def paint(self, text: str, *styles: str) -> str:
        if not self.colour or not styles or not text:
            return text
        return f"\x1b[{';'.join(_SGR[s] for s in styles)}m{text}\x1b[0m"

    def verdict(self, word: str) -> str:
        return self.paint(word, *VERDICT_STYLE.get(word, ()))


PLAIN = Style()  # no colour: a pipe, a file, NO_COLOR


def family_of(label: str) -> str:
    """A promise label is `family` or `family parameter` (conformance/verdicts.py Collector)."""
    return label.partition(" ")[0]


def grouped(rows: Iterable[Row]) -> list[Row]:
    """The rows with each family's together, families in the order they first appear (a stable
    regrouping: the witness modules already keep a family's witnesses side by side, in one module)."""
    by: dict[str, list[Row]] = {}
    for row in rows:
        by.setdefault(family_of(row[0]), []).append(row)
    return [row for rs in by.values() for row in rs]


# What a row says when its witnesses all fell to one failure printed once, below the table (a launch
# that failed fails every witness of its task the same way). It keeps the "harness error: " head that
# mrcheck/tiers.py counts by; that count goes to the line below it.
SAID_BELOW = "harness error: the launch failed (said once, below)"


def said_once(rows: Iterable[Row], problems: Sequence[str]) -> list[Row]:
    """The rows with a detail that is one of `problems` (printed after the table) replaced by
    SAID_BELOW: one launcher failure is printed once, not on every row and once more."""
    shown = set(problems)
    return [(label, verdict, SAID_BELOW if detail in shown else detail) for label, verdict, detail in rows]


def remedy_after(rows: Sequence[Row], remedies: Mapping[str, str]) -> dict[int, str]:
    """Where each remedy goes: the index of its promise's last BROKEN row -> the line (once per promise,
    however many of its paths broke)."""
    last: dict[str, int] = {}
    for i, (label, verdict, _) in enumerate(rows):
        if verdict == "BROKEN" and family_of(label) in remedies:
            last[family_of(label)] = i
    return {i: remedies[family] for family, i in last.items()}


def lines_text(rows: Iterable[Row], style: Style = PLAIN,
               remedies: Mapping[str, str] | None = None) -> list[str]:
    rows = grouped(rows)
    after = remedy_after(rows, remedies or {})
    out = []
    for i, (label, verdict, detail) in enumerate(rows):
        out.append(f"{label}: {style.verdict(verdict)}{': ' + detail if detail else ''}")
        if i in after:
            out.append("  " + style.paint(after[i], "dim"))
    return out


_LINE = re.compile(
    r"^(?P<promise>\S.*?): (?P<verdict>kept|BROKEN|not tested|not selected)(?:: (?P<detail>.*))?$"
)


def parse_lines_text(text: str) -> list[Row]:
    """The rows back from the `lines` form (what a runner captured through a pipe: mr-check can
    render them again as `table_markdown`); other lines (the summary, harness errors) are skipped."""
    return [(m["promise"], m["verdict"], m["detail"] or "")
            for m in map(_LINE.match, text.splitlines()) if m]


def table_text(rows: Iterable[Row], *, width: int = 0, style: Style = PLAIN,
               remedies: Mapping[str, str] | None = None) -> list[str]:
    """An aligned table: the family named once per group, then its parameter; the verdict column
    aligned; what the task saw wrapped to `width` (0: never wrapped) under its own column; a remedy
    on one line of its own, in that column, under its promise's last BROKEN row."""
    rows = grouped(rows)
    after = remedy_after(rows, remedies or {})
    split = [(family_of(label), label.partition(" ")[2], verdict, detail) for label, verdict, detail in rows]
    fam_w = max([len(f) for f, p, *_ in split if p], default=0)  # a bare family spans both columns
    promises, previous = [], None
    for family, param, *_ in split:
        shown = family if family != previous else ""
        previous = family
        promises.append(f"{shown:<{fam_w}} {param}" if param else shown)
    promise_w = max(len(HEADER[0]), *(len(p) for p in promises), 0)
    verdict_w = max(len(HEADER[1]), *(len(v) for *_, v, _ in split), 0)
    start = promise_w + 2 + verdict_w + 2
    avail = width - start if width else 0
    out = [style.paint(f"{HEADER[0]:<{promise_w}}  {HEADER[1]:<{verdict_w}}  {HEADER[2]}", "bold")]
    for i, (promise, (_, _, verdict, detail)) in enumerate(zip(promises, split, strict=True)):
        cells = f"{promise:<{promise_w}}  {style.verdict(verdict)}{' ' * (verdict_w - len(verdict))}"
        chunks = [detail]
        if detail and avail >= MIN_DETAIL:
            # Whole words only: a path or a JSON token cut in two is no longer copyable.
            chunks = textwrap.wrap(detail, avail, break_long_words=False, break_on_hyphens=False)
        out.append((cells + "  " + chunks[0]).rstrip())
        out += [" " * start + chunk for chunk in chunks[1:]]
        if i in after:
            # One line, never wrapped: a flag cut in two is no longer copyable either.
            out.append(" " * start + style.paint(after[i], "dim"))
    return out


def parse_table_text(text: str) -> list[Row]:
    """The rows back from `table_text` output without colour (for tests and scripts that were handed
    the table): a blank family cell continues the one above, indented lines continue a detail."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines or not lines[0].startswith(HEADER[0]):
        raise ValueError("not a promise table: no header line")
    head = lines[0]
    v_at, d_at = head.index(HEADER[1]), head.index(HEADER[2])
    rows: list[list[str]] = []
    family = ""
    for ln in lines[1:]:
        if ln.strip().startswith(REMEDY_HEAD):
            continue  # a remedy, not a row's text (remedies_text reads them)
        if not ln[:v_at].strip() and rows:
            rows[-1][2] += " " + ln.strip()
            continue
        promise, verdict, detail = ln[:v_at].rstrip(), ln[v_at:d_at].strip(), ln[d_at:].strip()
        if promise.startswith(" "):
            promise = family + " " + promise.strip()
        else:
            head_word, _, rest = promise.partition(" ")
            family = head_word
            promise = f"{head_word} {rest.strip()}" if rest.strip() else head_word
        rows.append([promise, verdict, detail])
    return [(p, v, d) for p, v, d in rows]


# ---- Markdown (GitHub- and GitLab-flavoured) -----------------------------------------------------------

_MD_SPECIAL = "\\`*<|"


def md_text(text: str) -> str:
    """Text that stays text in Markdown: the characters that would start code, emphasis or HTML,
    and `|` (a table cell ends at it, even inside backticks: GFM "Tables"), backslashed. Brackets
    stay: a link needs `](` or a reference definition, neither of which a verdict carries."""
    return "".join("\\" + c if c in _MD_SPECIAL else c for c in text.replace("\n", " "))


def md_code(text: str) -> str:
    """Inline code; a backtick inside gets a longer fence (CommonMark "Code spans"), and `|` its
    backslash, which GFM tables remove before the cell is parsed."""
    fence = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{fence}{pad}{text.replace('|', chr(92) + '|')}{pad}{fence}"


def table_markdown(rows: Iterable[Row]) -> list[str]:
    out = ["| promise | verdict | what the task saw |", "|---|---|---|"]
    for label, verdict, detail in grouped(rows):
        shown = f"**{verdict}**" if verdict == "BROKEN" else md_text(verdict)
        out.append(f"| {md_code(label)} | {shown} | {md_text(detail)} |")
    return out


def parse_table_markdown(text: str) -> list[Row]:
    """The rows back from `table_markdown` (for tests): backticks, bold and backslashes undone."""
    rows: list[Row] = []
    for ln in text.splitlines():
        if not ln.startswith("| ") or ln.startswith(("| promise |", "|---")):
            continue
        cells = [c.strip() for c in _split_cells(ln)]
        label = cells[0].strip("`").strip()
        rows.append((label, cells[1].strip("*"), cells[2]))
    return rows


def _split_cells(line: str) -> list[str]:
    cells, cur, i = [], "", 1  # skip the leading `|`
    while i < len(line):
        c = line[i]
        if c == "\\" and i + 1 < len(line):
            cur += line[i + 1]
            i += 2
            continue
        if c == "|":
            cells.append(cur)
            cur = ""
        else:
            cur += c
        i += 1
    return cells


def remedies_markdown(rows: Sequence[Row], remedies: Mapping[str, str]) -> list[str]:
    """Each BROKEN promise's remedy, as a list under the table: a fourth column would be empty on every
    other row, and too narrow for a flag on this one."""
    rows = grouped(rows)
    after = remedy_after(rows, remedies)
    if not after:
        return []
    items = [f"- {md_code(family_of(rows[i][0]))}: {md_text(line)}" for i, line in sorted(after.items())]
    return ["How to keep what broke:", "", *items, ""]


def remedies_text(text: str) -> list[str]:
    """The remedy lines back from a `lines` or `table` form (for tests and scripts)."""
    return [ln.strip() for ln in text.splitlines() if ln.strip().startswith(REMEDY_HEAD)]


def witness_markdown(rows: Sequence[Row], *, word: str, summary: str,
                     problems: Sequence[str] = (), remedies: Mapping[str, str] | None = None) -> list[str]:
    """The witness report as one Markdown block: a heading with the verdict, the table, the remedies
    of what broke, what else went wrong, and the summary line last (the same line the text forms end
    with)."""
    out = [f"#### sandbox-conformance witness: {word}", "", *table_markdown(rows), ""]
    out += remedies_markdown(rows, remedies or {})
    if problems:
        out += [f"- {md_text(p)}" for p in problems] + [""]
    out.append(md_text(summary))
    return out


def refusal_markdown(command: str, reason: str, *, because: Sequence[str] = (), ways_on: Sequence[str] = (),
                     notes: Sequence[str] = ()) -> list[str]:
    """A refusal (exit 75: nothing was tested) to paste into a merge request. Headed by what is
    needed, not by the word REFUSED: the reader needs the next step (as mr-check's handover)."""
    out = [f"#### {command}: not tested here", "", f"Why: {md_text(reason)}"]
    if because:
        out += ["", *(f"- because: {md_text(b)}" for b in because)]
    if ways_on:
        out += ["", "Ways on:", "", *(f"- {md_text(w)}" for w in ways_on)]
    if notes:
        out += ["", *(f"Note: {md_text(n)}" for n in notes)]
    return out
