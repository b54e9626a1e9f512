"""Path globs for mr-check, matched against repository-relative POSIX paths.

Semantics (stated here because fnmatch's are wrong for paths: its `*` crosses `/`, so `src/*.py`
would also match `src/deep/x.py`, widening or narrowing a gate by accident):
- a pattern is anchored at the repository root (`*.py` is top-level only; write `**/*.py` for any depth);
- `*` and `?` never match `/`; `[abc]` and `[!abc]` are character classes within one component;
- a `**` component matches zero or more whole components (`src/**/x.py` matches `src/x.py`);
- a trailing `/` or `/**` matches everything below that directory (and not the directory name alone).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence


class InvalidGlob(ValueError):
    pass


def _component(part: str, pattern: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(part):
        c = part[i]
        if c == "*":
            # `a**b` inside one component is just `*` (as in gitignore(5)): it cannot cross `/`.
            while i + 1 < len(part) and part[i + 1] == "*":
                i += 1
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = part.find("]", i + 2 if part[i + 1 : i + 2] in ("!", "]") else i + 1)
            if end == -1:
                raise InvalidGlob(f"unclosed '[' in glob {pattern!r}")
            body = part[i + 1 : end]
            negate = body.startswith("!")
            body = body[1:] if negate else body
            if "/" in body:
                raise InvalidGlob(f"'/' inside a character class in glob {pattern!r}")
            body = body.replace("\\", "\\\\").replace("^", "\\^")
            out.append(f"[^/{body}]" if negate else f"[{body}]")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


@functools.lru_cache(maxsize=512)
def compile_glob(pattern: str) -> re.Pattern[str]:
    if not pattern or not pattern.strip():
        raise InvalidGlob("empty glob")
    p = pattern.lstrip("/")
    if p.endswith("/"):
        p += "**"
    if not p:
        raise InvalidGlob(f"glob {pattern!r} names the repository root; use '**' to mean every path")
    parts = p.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise InvalidGlob(f"glob {pattern!r} has an empty, '.' or '..' component "
                        "(paths are repository-relative)")
    regex = ""
    for n, part in enumerate(parts):
        last = n == len(parts) - 1
        if part == "**":
            regex += ".+" if last else "(?:[^/]+/)*"
        else:
            regex += _component(part, pattern) + ("" if last else "/")
    return re.compile(regex)


def matches(pattern: str, path: str) -> bool:
    return compile_glob(pattern).fullmatch(path) is not None


def dead_glob_hint(pattern: str, files: Sequence[str]) -> str | None:
    """None when `pattern` matches one of `files`; else why it matches nothing, for a warning.

    A glob is matched against files only, so `src/sandbox` (a directory written without `/**`) is
    the common dead gate: say so when it matches a directory that holds files."""
    regex = compile_glob(pattern)
    if any(regex.fullmatch(f) for f in files):
        return None
    dirs = {f.rsplit("/", i)[0] for f in files for i in range(1, f.count("/") + 1)}
    if any(regex.fullmatch(d) for d in dirs):
        return f": it names a directory, write {pattern.rstrip('/') + '/**'!r} for the files below it"
    return ""
