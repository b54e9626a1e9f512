"""Bubblewrap's own `tests/test-run.sh`, the yardstick for (c): its wall time per TAP result.

Where it comes from, first found wins:
  1. `--bwrap-tests DIR`: a bubblewrap checkout's tests/ directory (test-run.sh, libtest.sh,
     libtest-core.sh);
  2. the cache, ${XDG_CACHE_HOME:-~/.cache}/sandbox-conformance/bench/bubblewrap-VERSION/tests, filled
     by 3 once;
  3. the Debian source package of the installed bubblewrap (`apt-get source bubblewrap=VERSION`), with a
     private apt configuration whose deb-src entries are the host's own deb entries: the host's apt
     set-up is read, never changed.
When none works the bench says why and measures the comparable thing instead: a TAP script of the
same shape, one bare `bwrap --bind / / --tmpfs /tmp true` (test-run.sh's $RUN) per result.

test-run.sh is bubblewrap's (LGPL-2.0-or-later); nothing of it is kept in this repository."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from sandbox_conformance.processes.children import minimal_env, run

FETCH_TIMEOUT = 300.0
TAP_RESULT = re.compile(r"^(not ok|ok)\b(?!.*#\s*SKIP)", re.IGNORECASE)
COMPARABLE_RESULTS = 30


@dataclasses.dataclass(frozen=True)
class TapRun:
    seconds: float
    results: int  # TAP results that ran (`ok`/`not ok`, SKIPs left out)
    failed: int

    @property
    def per_result(self) -> float:
        return self.seconds / self.results


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sandbox-conformance" / "bench"


def installed_version() -> str | None:
    """The installed bubblewrap package's Debian version (dpkg-query(1)); None off Debian."""
    if shutil.which("dpkg-query") is None:
        return None
    done = run(["dpkg-query", "-W", "-f", "${Version}", "bubblewrap"], timeout=30)
    return (done.stdout.strip() or None) if done.ok else None


def _deb_src_sources(etc: Path = Path("/etc/apt")) -> str:
    """The host's enabled `deb` entries, as `deb-src` ones (one-line format), so the source package
    comes from the archive the binary came from."""
    lines: list[str] = []
    one_line = [etc / "sources.list", *sorted((etc / "sources.list.d").glob("*.list"))]
    for path in one_line:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.strip().startswith("deb "):
                lines.append("deb-src " + line.strip()[4:])
    for path in sorted((etc / "sources.list.d").glob("*.sources")):
        try:
            text = path.read_text()
        except OSError:
            continue
        for para in re.split(r"\n\s*\n", text):
            fields: dict[str, str] = {}
            for raw in para.splitlines():
                if raw.startswith("#") or ":" not in raw or raw[:1].isspace():
                    continue
                key, _, value = raw.partition(":")
                fields[key.strip().lower()] = value.strip()
            if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes") == "no":
                continue
            keyring = fields.get("signed-by", "")
            opts = f"[signed-by={keyring}] " if keyring.startswith("/") else ""
            for uri in fields.get("uris", "").split():
                for suite in fields.get("suites", "").split():
                    lines.append(f"deb-src {opts}{uri} {suite} {fields.get('components', '')}".rstrip())
    return "\n".join(lines) + "\n"


def fetch(version: str, into: Path) -> str | None:
    """apt-get source bubblewrap=VERSION, unpacked, its tests/ copied to `into`. None, or why not."""
    for tool in ("apt-get", "dpkg-source"):
        if shutil.which(tool) is None:
            return f"no {tool}"
    sources = _deb_src_sources()
    if "deb-src" not in sources:
        return "no apt sources configured"
    with tempfile.TemporaryDirectory(prefix="sbxc-bench-apt-") as tmp:
        work = Path(tmp)
        (work / "sources.list").write_text(sources)
        for d in ("parts", "lists/partial", "cache/archives/partial", "src"):
            (work / d).mkdir(parents=True)
        apt = ["apt-get", "-q", "-o", f"Dir::Etc::SourceList={work}/sources.list",
               "-o", f"Dir::Etc::SourceParts={work}/parts", "-o", f"Dir::State::Lists={work}/lists",
               "-o", f"Dir::Cache={work}/cache", "-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root"]
        done = run([*apt, "update"], timeout=FETCH_TIMEOUT, cwd=str(work))
        if not done.ok:
            return f"apt-get update (deb-src) failed: {done.stderr_tail()}"
        done = run([*apt, "source", "--download-only", f"bubblewrap={version}"], timeout=FETCH_TIMEOUT,
                   cwd=str(work / "src"))
        if not done.ok:
            return f"apt-get source bubblewrap={version} failed: {done.stderr_tail()}"
        dsc = next((work / "src").glob("*.dsc"), None)
        if dsc is None:
            return "apt-get source left no .dsc"
        done = run(["dpkg-source", "-x", "--no-check", dsc.name, "unpacked"], timeout=FETCH_TIMEOUT,
                   cwd=str(work / "src"))
        tests = work / "src" / "unpacked" / "tests"
        if not done.ok or not (tests / "test-run.sh").is_file():
            return f"dpkg-source -x gave no tests/test-run.sh: {done.stderr_tail()}"
        into.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".partial-", dir=into.parent))
        shutil.copytree(tests, staging / "tests")
        (staging / "tests").rename(into)  # whole or not at all: a half copy never looks like a cache hit
        staging.rmdir()
    return None


def locate(given: str | None, *, allow_fetch: bool = True) -> tuple[Path | None, str]:
    """(the tests/ directory holding test-run.sh, or None and why not)."""
    if given:
        path = Path(given)
        if (path / "test-run.sh").is_file():
            return path, f"{path}"
        return None, f"--bwrap-tests {given}: no test-run.sh there"
    version = installed_version()
    if version is None:
        return None, "bubblewrap's Debian package is not installed (dpkg-query found no version)"
    cached = cache_root() / f"bubblewrap-{version}" / "tests"
    if (cached / "test-run.sh").is_file():
        return cached, f"bubblewrap {version} source package (cached at {cached})"
    if not allow_fetch:
        return None, f"not cached at {cached} and fetching is off"
    why = fetch(version, cached)
    if why is not None:
        return None, why
    return cached, f"bubblewrap {version} source package (fetched to {cached})"


def _tap(argv: list[str], cwd: str, env: dict[str, str]) -> TapRun:
    started = time.perf_counter()
    done = run(argv, timeout=FETCH_TIMEOUT, cwd=cwd, env=env)
    seconds = time.perf_counter() - started
    lines = done.stdout.splitlines()
    results = [line for line in lines if TAP_RESULT.match(line)]
    failed = sum(line.lower().startswith("not ok") for line in results)
    if not done.ok or not results:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode} with {len(results)} TAP results: "
                           f"{done.stderr_tail()}")
    return TapRun(seconds, len(results), failed)


# test-run.sh 0.8.0 makes `mktemp /tmp/bwrap-test-XXXXXXXX` for one test and never removes it.
LEAKED = "bwrap-test-"


def run_test_run_sh(tests: Path, bwrap: str) -> TapRun:
    """One run of bubblewrap's tests/test-run.sh against `bwrap`. It makes and removes its own
    /var/tmp/tap-test.XXXXXX (libtest.sh); the /tmp file it leaks is removed here (only names
    that appeared during this run)."""
    env = minimal_env({"BWRAP": bwrap})
    before = set(_leaked())
    try:
        return _tap(["bash", str(tests / "test-run.sh")], str(tests), env)
    finally:
        for name in set(_leaked()) - before:
            path = os.path.join("/tmp", name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)


def _leaked() -> list[str]:
    try:
        return [n for n in os.listdir("/tmp") if n.startswith(LEAKED)]
    except OSError:
        return []


def comparable_script(bwrap: str, results: int = COMPARABLE_RESULTS) -> str:
    """A TAP script of test-run.sh's shape where it cannot be had: one `$RUN true` per result, $RUN
    being test-run.sh's default (`bwrap --bind / / --tmpfs /tmp`)."""
    return "\n".join([
        "set -eu",
        f'RUN="{bwrap} --bind / / --tmpfs /tmp"',
        f"echo 1..{results}",
        f"for i in $(seq 1 {results}); do $RUN true; echo \"ok $i - bwrap ran\"; done",
    ]) + "\n"


def run_comparable(bwrap: str) -> TapRun:
    return _tap(["bash", "-c", comparable_script(bwrap)], "/", minimal_env())
