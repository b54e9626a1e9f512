"""The promise catalogue: every promise the witness suite can judge, by its stable id (issue 29).

An id is the family a witness is marked with (`@witness("secrets")`, conformance/witnesses/),
the first word of its row in the report, the key of its entry in `--json`, and what
`witness --only ID[,ID]` and `--skip ID[,ID]` take. Ids are stable: a renamed family breaks every
script that selects it, so a new promise gets a new id and an old one keeps its own.
tests/test_promises.py holds this table, the profile's `promises()` and the witness suite to one
another: every witness's family is catalogued, every id has a witness, every id a remedy.

Pure data and pure functions: no I/O, imported on the witness command's path (NamedTuple records,
docs/architecture.md "Records")."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple


class Promise(NamedTuple):
    id: str
    meaning: str  # one line: what a kept promise means for the task
    made_by: str  # the profile key that makes it
    # Made by every profile without writing it down: `[promises] not_claimed` disclaims one of these
    # with the measured reason (conformance/profile.py DEFAULT_PROMISES), except where made_by says
    # what else turns it off.
    default: bool = False


NOT_CLAIMED = "every profile, unless [promises] not_claimed disclaims it"
# In the order the report groups them (conformance/profile.py Profile.promises()).
CATALOGUE: tuple[Promise, ...] = (
    Promise("masked", "a masked path is an empty read-only tmpfs: the host's content there unreadable",
            "[filesystem] masked"),
    Promise("read_only", "a read-only path is readable and refuses every write (create, append, remove)",
            "[filesystem] read_only"),
    Promise("writable", "a writable path takes a new file, and the host sees it", "[filesystem] writable"),
    Promise("absent", "an absent path does not exist inside", "[filesystem] absent"),
    Promise("hidden", "the host's content at a hidden path is unreadable, and nothing written there "
            "reaches the host", "[filesystem] hidden"),
    Promise("aliases", "a masked path's content and an absent path are reachable under no other name",
            "[filesystem] masked or absent"),
    Promise("control", "the task's control directory is readable, read-only, and only this task's",
            "[task] control"),
    Promise("user_tmp", "the user's temp directory stays writable", "[task] user_tmp"),
    Promise("workdir", "the task starts in its working directory: that host directory, not a copy",
            "[task] workdir"),
    Promise("network", "no way out: only lo (or no socket at all), nothing of the host reachable",
            '[network] mode = "none" or "proxy"'),
    Promise("network_proxy", "out only through the sandbox's proxy, and only to the allowed names",
            '[network] mode = "proxy"'),
    Promise("write_surface", "every read-write mount of host storage is a declared writable path",
            'every profile, unless [filesystem] write_surface = "any"', default=True),
    Promise("kernel_view", "what the task reads about itself agrees with what the host's kernel shows",
            "every profile", default=True),
    Promise("leftovers", "no process the launch started still runs once the launcher has exited",
            "every profile", default=True),
    Promise("unchanged", "every look the host takes at the task, start to end, shows the same sandbox",
            "every profile", default=True),
    Promise("nested_userns", "no door to a nested user namespace opens (unshare, clone, clone3, i386, "
            "x32, setns)", '[userns] nested = "refused"'),
    Promise("pid", "a pid namespace of its own: the host's processes invisible",
            '[namespaces] pid = "private"'),
    Promise("ipc", "an ipc namespace of its own: the host's shared memory and queues invisible",
            '[namespaces] ipc = "private"'),
    Promise("uts", "a uts namespace of its own, with the promised hostname", '[namespaces] uts = "private"'),
    Promise("capabilities", "the task holds no capability", "[process] capabilities"),
    Promise("no_new_privs", "the task runs with no_new_privs set", "[process] no_new_privs"),
    Promise("environment", "only the allowlisted variables reach the task", "[environment] allow"),
    Promise("environment_set", "the [environment.set] values arrive exactly", "[environment.set]"),
    Promise("cgroup", "a cgroup leaf of its own, its whole tree killed with it, a neighbour's out of reach",
            "[limits]"),
    Promise("memory_max", "an allocation past memory.max is OOM-killed", "[limits] memory_max"),
    Promise("pids_max", "forking past pids.max fails with EAGAIN", "[limits] pids_max"),
    Promise("descriptors", "no descriptor the task holds leads out of its sandbox", NOT_CLAIMED,
            default=True),
    Promise("secrets", "the launcher's planted secret is readable nowhere inside", NOT_CLAIMED,
            default=True),
    Promise("kernel_interfaces", "the host's kernel settings (/proc/sys, sysrq-trigger, uevent_helper, the "
            "roots of its cgroup hierarchies, its binfmt_misc register) cannot be opened for writing, or "
            "refuse the write", NOT_CLAIMED, default=True),
    Promise("devices", "only allowlisted device nodes open", NOT_CLAIMED, default=True),
    Promise("host_sockets", "no host unix socket can be connected to", NOT_CLAIMED, default=True),
    Promise("lifecycle", "the task dies with its launcher (SIGKILLed at the handshake)", NOT_CLAIMED,
            default=True),
    Promise("terminal", "the task cannot push input into the terminal it was started from (TIOCSTI)",
            NOT_CLAIMED, default=True),
    Promise("syscalls", "the other syscall doors (the mount API, ptrace of a host process, io_uring, keyctl, "
            "AF_VSOCK, TIOCLINUX) answer as [syscalls] says", NOT_CLAIMED, default=True),
)
BY_ID = {p.id: p for p in CATALOGUE}
IDS = tuple(BY_ID)


class UnknownPromise(ValueError):
    """One line naming the option and the id."""


class Selection(NamedTuple):
    """Which promises a run tests: `--only` (empty: every one) less `--skip`. A promise left out is
    reported `not selected`, never kept."""

    only: frozenset[str] = frozenset()
    skip: frozenset[str] = frozenset()

    def __bool__(self) -> bool:  # no --only and no --skip: every promise, as before
        return bool(self.only or self.skip)

    def excludes(self, pid: str) -> bool:
        return pid in self.skip or (bool(self.only) and pid not in self.only)

    def why(self, pid: str) -> str:
        """What the report says of a promise this selection leaves out."""
        return "left out by --skip" if pid in self.skip else "not in --only"

    def left_out(self, made: Iterable[str]) -> tuple[str, ...]:
        return tuple(p for p in made if self.excludes(p))

    def to_json(self) -> dict[str, list[str]]:
        return {"only": sorted(self.only, key=IDS.index), "skip": sorted(self.skip, key=IDS.index)}


def parse_ids(flag: str, values: Iterable[str]) -> frozenset[str]:
    """`ID[,ID]` words (the option may be repeated) into catalogued ids; an unknown or empty one is
    a UnknownPromise naming it."""
    out: set[str] = set()
    for value in values:
        for word in value.split(","):
            word = word.strip()
            if not word:
                raise UnknownPromise(f"{flag} {value!r}: expected promise ids separated by commas")
            if word not in BY_ID:
                raise UnknownPromise(f"{flag} {word}: no such promise id (known: {', '.join(IDS)})")
            out.add(word)
    return frozenset(out)


def select(only: Iterable[str] = (), skip: Iterable[str] = ()) -> Selection:
    """The selection `--only` and `--skip` ask for; the same id in both is a UnknownPromise."""
    sel = Selection(parse_ids("--only", only), parse_ids("--skip", skip))
    both = sel.only & sel.skip
    if both:
        raise UnknownPromise(f"--only and --skip both name {', '.join(sorted(both, key=IDS.index))}: "
                             "give each promise to one of them")
    return sel


# One help text per option, shared by `witness`, `run` (runners/witness_args.py) and the pytest plugin.
ONLY_HELP = ("test only these promises, by id (README's promise table says what each means); repeatable; "
             "the others are reported `not selected`. Ids: " + ", ".join(IDS))
SKIP_HELP = "leave these promises out (reported `not selected`, never kept); repeatable"


def table_markdown() -> list[str]:
    """The catalogue as the README's table (`python -m sandbox_conformance.conformance.promises`;
    tests/test_promises.py
    keeps the README's copy equal to it)."""
    out = ["<!-- promises:begin (python -m sandbox_conformance.conformance.promises) -->",
           "| id | kept means | made by |", "|---|---|---|"]
    out += [f"| `{p.id}` | {p.meaning} | {p.made_by} |" for p in CATALOGUE]
    return [*out, "<!-- promises:end -->"]


if __name__ == "__main__":
    print("\n".join(table_markdown()))
