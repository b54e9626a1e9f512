"""The negative controls' catalogue (issue 6): one named, one-thing perturbation of the reference
sandbox each, with the exact witnesses it must turn red and the collateral it may cause, and the
witnesses no control can redden, each with the reason.

A control is either a `--perturb` name the reference launcher understands (conformance/bwrap_argv.py
PERTURBATIONS) or an external launcher we ship (conformance/control_launchers/reference.py): the
reference bwrap argv plus ONE extra instruction, for promises the reference launcher has no
perturbation for; and, for NoNewPrivs (bwrap sets PR_SET_NO_NEW_PRIVS unconditionally), the same
reference sandbox entered from outside with setns(2), so the task runs without the bit.

Everything here is data plus pure functions of it: the `controls` command decides what to run,
controls_judge.py decides what the results mean."""

from __future__ import annotations

import dataclasses
import enum
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence

# Witness node ids as pytest names them when `witness` runs conformance/test_witnesses.py with
# conformance/ as the rootdir. Compared by the part after the last "::" (conformance.plugin.skip_key),
# which is also what JUnit's `name` attribute carries.
MODULE = "test_witnesses.py"
LAUNCHER_MODULE = "conformance.control_launchers.reference"


def _w(name: str) -> str:
    return f"{MODULE}::{name}"


def key(nodeid: str) -> str:
    """The comparable part of a node id: `test_x[param]`."""
    return nodeid.rsplit("::", 1)[-1]


class Needs(enum.StrEnum):
    """A host fact a control needs before it means anything."""

    disable_userns = enum.auto()  # the `disable_userns` probe: supported
    cgroup_root = enum.auto()  # the `cgroup.delegation` probe: a usable root (each task gets a leaf)
    # A usable root, and tasks launched as root: the host's cgroup files belong to uid 0, so an
    # unprivileged task is refused by file modes (EACCES) whatever the sandbox shows it.
    cgroup_root_as_root = enum.auto()


@dataclasses.dataclass(frozen=True)
class Collateral:
    """A witness a control may also turn red, and why that is the same one thing showing."""

    test: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Control:
    name: str
    what: str  # one line: the one thing that is wrong in the perturbed sandbox
    reddens: tuple[str, ...]  # node ids that must fail BY AN ASSERTION
    perturb: str | None = None  # a conformance.bwrap_argv.PERTURBATIONS name (reference launcher)
    # Arguments of conformance/control_launchers/reference.py (placeholders such as {workdir} are
    # expanded by the external launcher, conformance/launch.py).
    launcher_args: tuple[str, ...] | None = None
    prefix: str | None = None  # a whole external launcher prefix (the unsandboxed baseline: `env`)
    collateral: tuple[Collateral, ...] = ()
    needs: Needs | None = None

    def __post_init__(self) -> None:
        if [self.perturb, self.launcher_args, self.prefix].count(None) != 2:
            raise ValueError(f"control {self.name}: exactly one of perturb, launcher_args and prefix")

    @property
    def external(self) -> bool:
        """Run through an external launcher (the plugin then asserts the nested-userns witness)."""
        return self.perturb is None


@dataclasses.dataclass(frozen=True)
class Uncontrolled:
    test: str
    reason: str


MASKED_TMPFS = _w("test_a_masked_directory_is_an_empty_read_only_tmpfs[{state}/db]")
MASKED_CANARY = _w("test_a_masked_directorys_host_canary_is_invisible[{state}/db]")
MASKED_CREATE = _w("test_nothing_can_be_created_in_a_masked_directory[{state}/db]")
USR_READABLE = _w("test_a_read_only_path_is_readable[/usr]")
STATE_READABLE = _w("test_a_read_only_path_is_readable[{state}]")
USR_EROFS = _w("test_a_read_only_path_refuses_writes_with_erofs[/usr]")
STATE_EROFS = _w("test_a_read_only_path_refuses_writes_with_erofs[{state}]")
WORKDIR_WRITABLE = _w("test_a_writable_path_accepts_a_file_the_host_sees[{workdir}]")
NEIGHBOUR_ABSENT = _w("test_an_absent_path_does_not_exist_inside[{neighbour_control}]")
OTHER_USER_ABSENT = _w("test_an_absent_path_does_not_exist_inside[{other_user}]")
CONTROL_READABLE = _w("test_the_control_directorys_files_are_readable")
CONTROL_APPEND = _w("test_an_append_to_the_control_directorys_file_is_refused_with_erofs")
CONTROL_PLANT = _w("test_a_file_cannot_be_planted_in_the_control_directory")
CONTROL_UNLINK = _w("test_the_control_directorys_files_cannot_be_removed")
USER_TMP_WRITABLE = _w("test_a_sibling_in_the_per_user_temp_stays_writable")
ONLY_LO = _w("test_the_task_sees_only_the_loopback_interface")
NO_TCP = _w("test_the_task_cannot_reach_the_hosts_tcp_listener")
NO_ABSTRACT = _w("test_the_task_cannot_reach_the_hosts_abstract_unix_socket")
NESTED_USERNS = _w("test_a_nested_user_namespace_is_refused")
PIDS_INVISIBLE = _w("test_host_pids_are_invisible_to_the_task")
PID_1 = _w("test_pid_1_is_the_sandboxs_init")
IPC = _w("test_the_ipc_namespace_is_private")
UTS = _w("test_the_uts_namespace_is_private")
NO_CAPS = _w("test_the_task_has_no_capabilities")
NNP = _w("test_no_new_privs_is_set")
ENV_ALLOWLIST = _w("test_only_allowlisted_environment_keys_arrive")
ENV_SECRET = _w("test_the_launchers_secret_does_not_reach_the_task")
CGROUP_OWN_LEAF = _w("test_the_task_runs_in_its_own_cgroup_leaf")
CGROUP_OOM = _w("test_an_allocation_past_memory_max_is_oom_killed")
CGROUP_PIDS = _w("test_forking_past_pids_max_fails_with_eagain")
CGROUP_KILL = _w("test_a_task_tree_is_reaped_whole_by_cgroup_kill")
CGROUP_NEIGHBOUR = _w("test_a_neighbour_tasks_leaf_is_not_writable_from_inside")

CONTROLS: tuple[Control, ...] = (
    Control(
        "mask_dropped",
        "the masked directory is not covered at all",
        perturb="mask_dropped",
        # Nothing can be created there still: the mask lies under the read-only {state} bind, so
        # without the mask a create gets EROFS from the bind. That witness is the mask_writable one's.
        reddens=(MASKED_TMPFS, MASKED_CANARY),
    ),
    Control(
        "mask_writable",
        "the masked directory is an empty but writable tmpfs",
        perturb="mask_writable",
        reddens=(MASKED_TMPFS, MASKED_CREATE),
    ),
    Control(
        "control_rw",
        "the control directory is bound read-write",
        perturb="control_rw",
        reddens=(CONTROL_APPEND, CONTROL_PLANT, CONTROL_UNLINK),
    ),
    Control(
        "control_scoped_per_user",
        "the read-only control bind covers the user's whole tree, so the neighbour task's control "
        "directory is visible",
        perturb="control_scoped_per_user",
        reddens=(NEIGHBOUR_ABSENT,),
    ),
    Control(
        "other_user_bound",
        "another user's subtree is bound in",
        perturb="other_user_bound",
        reddens=(OTHER_USER_ABSENT,),
    ),
    Control(
        "network_shared",
        "the host's network namespace is shared",
        perturb="network_shared",
        reddens=(ONLY_LO, NO_TCP, NO_ABSTRACT),
    ),
    Control(
        "nested_userns_enabled",
        "--disable-userns is left out, so the task may create user namespaces",
        perturb="nested_userns_enabled",
        reddens=(NESTED_USERNS,),
        needs=Needs.disable_userns,
    ),
    Control(
        "pid_shared",
        "the host's pid namespace is shared (and the host's /proc bound in)",
        perturb="pid_shared",
        reddens=(PIDS_INVISIBLE, PID_1),
    ),
    Control("ipc_shared", "the host's ipc namespace is shared", perturb="ipc_shared", reddens=(IPC,)),
    Control("uts_shared", "the host's uts namespace is shared", perturb="uts_shared", reddens=(UTS,)),
    Control("caps_kept", "capabilities are kept (--cap-add ALL)", perturb="caps_kept", reddens=(NO_CAPS,)),
    Control(
        "env_kept",
        "the launcher's environment reaches the task (no --clearenv)",
        perturb="env_kept",
        reddens=(ENV_ALLOWLIST, ENV_SECRET),
    ),
    Control(
        "limits_dropped",
        "the task's cgroup leaf is made and entered, but none of the profile's limits is written to it",
        perturb="limits_dropped",
        # The leaf itself is still there: the own-leaf, cgroup.kill and neighbour witnesses stay green.
        reddens=(CGROUP_OOM, CGROUP_PIDS),
        needs=Needs.cgroup_root,
    ),
    Control(
        "leaf_not_entered",
        "the task's cgroup leaf is made with the profile's limits, but the task is never put into it",
        perturb="leaf_not_entered",
        # The neighbour's leaf is as unreachable as before: that witness stays green.
        reddens=(CGROUP_OWN_LEAF, CGROUP_OOM, CGROUP_PIDS, CGROUP_KILL),
        needs=Needs.cgroup_root,
    ),
    # The reference launcher has no perturbation for the promises below: the reference argv plus one
    # extra bwrap instruction, appended last so it wins over the reference mounts (bwrap applies its
    # setup operations in command-line order).
    Control(
        "workdir_read_only",
        "the task's workdir is remounted read-only",
        launcher_args=("--append=--remount-ro", "--append={workdir}"),
        reddens=(WORKDIR_WRITABLE,),
    ),
    Control(
        "user_tmp_read_only",
        "the per-user temp directory is remounted read-only (the task tree made read-only, not just "
        "its control directory)",
        launcher_args=("--append=--remount-ro", "--append={user_tmp}"),
        reddens=(USER_TMP_WRITABLE,),
    ),
    Control(
        "control_swapped",
        "the neighbour task's control directory is bound (read-only) where this task's should be",
        launcher_args=("--append=--ro-bind", "--append={neighbour_control}", "--append={control}"),
        # Append, plant and unlink still meet a read-only bind: only the content is wrong.
        reddens=(CONTROL_READABLE,),
    ),
    Control(
        "read_only_stale",
        "the read-only state tree shows a file with other content than the host's (a stale copy)",
        launcher_args=(
            "--append=--ro-bind",
            "--append={neighbour_control}/system_prompt.txt",
            "--append={state}/config.toml",
        ),
        reddens=(STATE_READABLE,),
    ),
    Control(
        "state_file_writable",
        "one file of the read-only state tree is bound read-write",
        launcher_args=("--append=--bind", "--append={state}/config.toml", "--append={state}/config.toml"),
        # The witness appends zero bytes (conformance/plan.py): the refusal is at open(2).
        reddens=(STATE_EROFS,),
    ),
    Control(
        "usr_writable",
        "/usr is bound read-write",
        launcher_args=("--append=--bind", "--append=/usr", "--append=/usr"),
        # The witness's plant REACHES the host's /usr here (as root; EACCES as an unprivileged user,
        # still not EROFS): the harness removes it by its nonce after the launch (conformance/harness.py),
        # as it does for the unsandboxed baseline.
        reddens=(USR_EROFS,),
    ),
    Control(
        "cgroup_tree_bound",
        "the host's cgroup2 tree is bound read-write into the task (no cgroup namespace can hide a "
        "neighbour's leaf then)",
        launcher_args=("--append=--bind", "--append=/sys/fs/cgroup", "--append=/sys/fs/cgroup"),
        # Only the neighbour's memory.max goes through: its cgroup.procs still refuses a move out of
        # the task's cgroup namespace under nsdelegate (ENOENT, kernel/cgroup/cgroup.c
        # cgroup_procs_write_permission); one accepted write is a broken promise.
        reddens=(CGROUP_NEIGHBOUR,),
        needs=Needs.cgroup_root_as_root,
    ),
    Control(
        "no_new_privs_off",
        "the task enters the reference sandbox's namespaces from outside (setns), without "
        "PR_SET_NO_NEW_PRIVS, which bwrap always sets on its own children",
        launcher_args=("--join",),
        reddens=(NNP,),
    ),
)

UNCONTROLLED: tuple[Uncontrolled, ...] = (
    Uncontrolled(
        USR_READABLE,
        "/usr holds the interpreter the witness program runs in: a sandbox that hides or empties /usr "
        "cannot start the task, so this witness can only go red as a harness error, never by an "
        "assertion; the same assertions are controlled for {state} by read_only_stale",
    ),
)

# Witnesses that check something the sandbox must ALLOW (a readable or writable path): a task with no
# sandbox at all passes them, so the unsandboxed baseline does not require them red.
AVAILABILITY: frozenset[str] = frozenset(
    key(t) for t in (USR_READABLE, STATE_READABLE, WORKDIR_WRITABLE, CONTROL_READABLE, USER_TMP_WRITABLE)
)
# Witnesses of the task's cgroup leaf: the harness, not the sandbox, makes the leaf and writes its
# limits (conformance/harness.py), so a task with no sandbox at all still has them. The unsandboxed
# baseline does not require them red; it may still redden some (as root, nothing stops a write to the
# neighbour's leaf), which is declared collateral.
HARNESS_ENFORCED: frozenset[str] = frozenset(
    key(t) for t in (CGROUP_OWN_LEAF, CGROUP_OOM, CGROUP_PIDS, CGROUP_KILL, CGROUP_NEIGHBOUR)
)

UNSANDBOXED = "unsandboxed"


def by_name(controls: Sequence[Control] = CONTROLS) -> dict[str, Control]:
    return {c.name: c for c in controls}


def not_applicable(
    control: Control,
    *,
    disable_userns: bool,
    disable_userns_reason: str,
    cgroup_root: bool = False,
    cgroup_root_reason: str = "the cgroup.delegation probe was not consulted",
    as_root: bool = True,
) -> str | None:
    """Why this control cannot mean anything on this host, or None."""
    if control.needs is Needs.disable_userns and not disable_userns:
        # The reference launcher only passes --disable-userns where the probe saw it work, and the
        # nested-userns witness skips otherwise: there is no boundary to take away.
        return f"the disable_userns probe says --disable-userns does not work here: {disable_userns_reason}"
    if control.needs in (Needs.cgroup_root, Needs.cgroup_root_as_root) and not cgroup_root:
        # No usable root: no task gets a leaf, the cgroup witnesses skip, and there is no leaf to
        # break (the VM mode, `run --mode vm`, has a root).
        return f"no usable cgroup root here, so no task gets a cgroup leaf: {cgroup_root_reason}"
    if control.needs is Needs.cgroup_root_as_root and not as_root:
        return (
            "tasks run as an unprivileged user: the cgroup files belong to root, so file modes refuse "
            "the write whatever the sandbox shows (run the controls as root)"
        )
    return None


def collateral(control: Control, *, disable_userns: bool) -> tuple[Collateral, ...]:
    """The declared collateral on this host."""
    extra: tuple[Collateral, ...] = ()
    if control.external and not disable_userns:
        # The plugin only skips the nested-userns witness for the REFERENCE launcher; through an
        # external launcher (ours, built without --disable-userns here) it is asserted, and goes red.
        extra = (
            Collateral(
                NESTED_USERNS,
                "skipped under the reference launcher where --disable-userns does not work, but "
                "asserted (and red) through an external launcher",
            ),
        )
    return control.collateral + extra


def launcher_prefix(control: Control, *, python: str = sys.executable, disable_userns: bool) -> str | None:
    """The `--launcher` prefix for this control, or None for a reference-launcher perturbation."""
    if control.prefix is not None:
        return control.prefix
    if control.launcher_args is None:
        return None
    words = [python, "-m", LAUNCHER_MODULE]
    if disable_userns:
        words.append("--disable-userns")
    words += list(control.launcher_args)
    words.append("--")
    return shlex.join(words)


def unsandboxed(baseline_passed: Iterable[str], baseline_other: Mapping[str, str]) -> Control:
    """The unsandboxed baseline as a control: the witness program run with no sandbox at all (`env`
    as the launcher) must turn every isolation witness that passed in the baseline red. A witness
    that did not pass in the baseline proves nothing either way: declared collateral, with why."""
    passed = list(map(key, baseline_passed))
    names = tuple(sorted(k for k in passed if k not in AVAILABILITY | HARNESS_ENFORCED))
    return Control(
        UNSANDBOXED,
        "no sandbox at all: the witness program runs directly on the host",
        prefix="env",
        reddens=tuple(_w(n) for n in names),
        collateral=tuple(
            Collateral(_w(key(k)), f"did not pass in the baseline ({why}): not judged")
            for k, why in sorted(baseline_other.items())
        )
        + tuple(
            Collateral(_w(k), "the harness's cgroup leaf, not the sandbox, keeps it: not judged")
            for k in sorted(set(passed) & HARNESS_ENFORCED)
        ),
    )
