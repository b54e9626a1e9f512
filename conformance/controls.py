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
import platform
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import PurePosixPath

from sandbox_conformance.kernel import mountinfo

# Witness node ids as pytest names them when `witness` runs the modules of conformance/witnesses/ with
# conformance/ as the rootdir: `witnesses/MODULE.py::test_x[param]`. Compared by the part after the
# last "::" (conformance.plugin.skip_key), which is also what JUnit's `name` attribute carries.
SUITE_DIR = "witnesses"
LAUNCHER_MODULE = "sandbox_conformance.conformance.control_launchers.reference"

# Which module of the suite holds each witness, for its node id (tests/test_controls_judge.py holds
# this table to the modules: every witness listed, each where it is defined).
SUITE: Mapping[str, tuple[str, ...]] = {
    "paths": (
        "test_a_masked_directory_is_an_empty_read_only_tmpfs",
        "test_a_masked_directorys_host_canary_is_invisible",
        "test_nothing_can_be_created_in_a_masked_directory",
        "test_a_read_only_path_is_readable",
        "test_a_read_only_path_refuses_writes_with_erofs",
        "test_every_mount_beneath_a_read_only_path_is_read_only",
        "test_a_writable_path_accepts_a_file_the_host_sees",
        "test_an_absent_path_does_not_exist_inside",
        "test_a_hidden_paths_host_content_is_unreadable",
        "test_nothing_written_in_a_hidden_path_reaches_the_host",
        "test_the_control_directorys_files_are_readable",
        "test_an_append_to_the_control_directorys_file_is_refused_with_erofs",
        "test_a_file_cannot_be_planted_in_the_control_directory",
        "test_the_control_directorys_files_cannot_be_removed",
        "test_a_sibling_in_the_per_user_temp_stays_writable",
    ),
    "network": (
        "test_the_task_sees_only_the_loopback_interface",
        "test_the_task_cannot_reach_the_hosts_tcp_listener",
        "test_the_task_cannot_reach_the_hosts_abstract_unix_socket",
        "test_the_task_has_a_network_namespace_of_its_own",
        "test_a_listed_name_is_reachable_through_the_proxy",
        "test_the_proxy_refuses_unlisted_names_loopback_and_the_hosts_addresses",
    ),
    "nesting": (
        "test_a_nested_user_namespace_is_refused_by_every_door",
    ),
    "isolation": (
        "test_host_pids_are_invisible_to_the_task",
        "test_pid_1_is_the_sandboxs_init",
        "test_the_ipc_namespace_is_private",
        "test_the_uts_namespace_is_private",
        "test_the_task_has_no_capabilities",
        "test_no_new_privs_is_set",
    ),
    "environment": (
        "test_only_allowlisted_environment_keys_arrive",
        "test_the_launchers_secret_does_not_reach_the_task",
        "test_the_environment_set_by_the_profile_is_exactly_that",
    ),
    "host_view": (
        "test_no_mount_shows_a_protected_host_path_under_any_name",
        "test_every_writable_host_mount_is_a_declared_writable_path",
        "test_the_tasks_proc_shows_the_kernels_state",
        "test_the_task_starts_in_its_working_directory",
    ),
    "lifecycle": (
        "test_nothing_the_launch_started_outlives_the_task",
        "test_the_sandbox_is_the_same_at_every_look",
        "test_the_task_dies_with_its_launcher",
    ),
    "reach": (
        "test_the_task_cannot_type_into_the_terminal_it_was_started_from",
        "test_every_other_syscall_door_answers_as_the_profile_says",
        "test_the_task_holds_no_descriptor_that_leads_out",
        "test_the_launchers_secret_is_readable_nowhere_in_the_task",
        "test_the_hosts_kernel_settings_cannot_be_opened_for_writing",
        "test_only_allowlisted_device_nodes_can_be_opened",
        "test_no_host_unix_socket_can_be_connected_to",
    ),
    "limits": (
        "test_the_task_runs_in_its_own_cgroup_leaf",
        "test_an_allocation_past_memory_max_is_oom_killed",
        "test_forking_past_pids_max_fails_with_eagain",
        "test_a_task_tree_is_reaped_whole_by_cgroup_kill",
        "test_a_neighbour_tasks_leaf_is_not_writable_from_inside",
    ),
}
_MODULE_OF = {test: module for module, tests in SUITE.items() for test in tests}


def _w(name: str) -> str:
    """The node id of the witness `test_x[param]`; a name the table does not know (a synthetic one in
    a test) stays its bare key, which compares the same."""
    module = _MODULE_OF.get(name.split("[", 1)[0])
    return f"{SUITE_DIR}/{module}.py::{name}" if module else name


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
    # Tasks launched as root: the host's sysctls and device nodes belong to root (0644, 0600), so an
    # unprivileged task is refused by file modes whatever the sandbox exposes.
    as_root = enum.auto()
    x86_64 = enum.auto()  # the i386 entry point (int 0x80) exists only there
    # TIOCSTI is allowed at all: dev.tty.legacy_tiocsti is not 0 (Linux 6.2 can refuse it to everyone).
    legacy_tiocsti = enum.auto()
    # Tasks launched as root, where bwrap makes ONE user namespace, owning the task's mount namespace.
    # Run by a user, bwrap --dev maps the task into a second one nested below it (uid 0 is needed in
    # the first to mount devpts), which kept capabilities never reach the mount namespace from.
    one_userns = enum.auto()
    # Tasks launched as root, and a cgroup hierarchy mounted at /sys/fs/cgroup on the host to bind in.
    host_cgroupfs_as_root = enum.auto()
    # Tasks launched as root (register is 0200, root's), and a kernel that has binfmt_misc.
    binfmt_misc_as_root = enum.auto()


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
    # The launcher reads the witness program from stdin (to rewrite it): run with --launcher-stdin.
    stdin: bool = False

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
WORKDIR_START = _w("test_the_task_starts_in_its_working_directory")
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
NESTED_USERNS = _w("test_a_nested_user_namespace_is_refused_by_every_door")
PIDS_INVISIBLE = _w("test_host_pids_are_invisible_to_the_task")
PID_1 = _w("test_pid_1_is_the_sandboxs_init")
IPC = _w("test_the_ipc_namespace_is_private")
UTS = _w("test_the_uts_namespace_is_private")
NO_CAPS = _w("test_the_task_has_no_capabilities")
NNP = _w("test_no_new_privs_is_set")
ENV_ALLOWLIST = _w("test_only_allowlisted_environment_keys_arrive")
ENV_SECRET = _w("test_the_launchers_secret_does_not_reach_the_task")
USR_MOUNTS_RO = _w("test_every_mount_beneath_a_read_only_path_is_read_only[/usr]")
STATE_MOUNTS_RO = _w("test_every_mount_beneath_a_read_only_path_is_read_only[{state}]")
ENV_SET = _w("test_the_environment_set_by_the_profile_is_exactly_that")
OWN_NETNS = _w("test_the_task_has_a_network_namespace_of_its_own")
ALIASES = _w("test_no_mount_shows_a_protected_host_path_under_any_name")
WRITE_SURFACE = _w("test_every_writable_host_mount_is_a_declared_writable_path")
KERNEL_VIEW = _w("test_the_tasks_proc_shows_the_kernels_state")
LEFTOVERS = _w("test_nothing_the_launch_started_outlives_the_task")
CGROUP_OWN_LEAF = _w("test_the_task_runs_in_its_own_cgroup_leaf")
CGROUP_OOM = _w("test_an_allocation_past_memory_max_is_oom_killed")
CGROUP_PIDS = _w("test_forking_past_pids_max_fails_with_eagain")
CGROUP_KILL = _w("test_a_task_tree_is_reaped_whole_by_cgroup_kill")
CGROUP_NEIGHBOUR = _w("test_a_neighbour_tasks_leaf_is_not_writable_from_inside")
DESCRIPTORS = _w("test_the_task_holds_no_descriptor_that_leads_out")
SECRETS = _w("test_the_launchers_secret_is_readable_nowhere_in_the_task")
KERNEL_INTERFACES = _w("test_the_hosts_kernel_settings_cannot_be_opened_for_writing")
DEVICES = _w("test_only_allowlisted_device_nodes_can_be_opened")
HOST_SOCKETS = _w("test_no_host_unix_socket_can_be_connected_to")
UNCHANGED = _w("test_the_sandbox_is_the_same_at_every_look")
LIFECYCLE = _w("test_the_task_dies_with_its_launcher")
TERMINAL = _w("test_the_task_cannot_type_into_the_terminal_it_was_started_from")
SYSCALLS = _w("test_every_other_syscall_door_answers_as_the_profile_says")

# Every witness judged on the host's reading of the live task: a document with no live task behind it
# (a forger's, a decoy's) turns each of them red.
HOST_JUDGED = (
    MASKED_TMPFS,
    USR_MOUNTS_RO,
    STATE_MOUNTS_RO,
    OWN_NETNS,
    PIDS_INVISIBLE,
    PID_1,
    IPC,
    UTS,
    NO_CAPS,
    NNP,
    ENV_ALLOWLIST,
    ENV_SECRET,
    ENV_SET,
    ALIASES,
    WRITE_SURFACE,
    KERNEL_VIEW,
    WORKDIR_START,
    DESCRIPTORS,
    SECRETS,
    KERNEL_INTERFACES,
    DEVICES,
    HOST_SOCKETS,
)

CONTROLS: tuple[Control, ...] = (
    Control(
        "mask_dropped",
        "the masked directory is not covered at all",
        perturb="mask_dropped",
        # Nothing can be created there still: the mask lies under the read-only {state} bind, so
        # without the mask a create gets EROFS from the bind. That witness is the mask_writable one's.
        # The host's reading of the mount table names the same exposure (at the path itself).
        reddens=(MASKED_TMPFS, MASKED_CANARY, ALIASES),
    ),
    Control(
        "mask_writable",
        "the masked directory is an empty but writable tmpfs",
        perturb="mask_writable",
        # A writable tmpfs beneath the read-only {state}: the same one thing, seen in the mount table.
        reddens=(MASKED_TMPFS, MASKED_CREATE, STATE_MOUNTS_RO),
    ),
    Control(
        "control_rw",
        "the control directory is bound read-write",
        perturb="control_rw",
        # A read-write bind of host storage beneath {state}, seen in the task's mount table too.
        reddens=(CONTROL_APPEND, CONTROL_PLANT, CONTROL_UNLINK, STATE_MOUNTS_RO, WRITE_SURFACE),
    ),
    Control(
        "control_scoped_per_user",
        "the read-only control bind covers the user's whole tree, so the neighbour task's control "
        "directory is visible",
        perturb="control_scoped_per_user",
        reddens=(NEIGHBOUR_ABSENT, ALIASES),
    ),
    Control(
        "other_user_bound",
        "another user's subtree is bound in",
        perturb="other_user_bound",
        reddens=(OTHER_USER_ABSENT, ALIASES),
    ),
    Control(
        "network_shared",
        "the host's network namespace is shared",
        perturb="network_shared",
        reddens=(ONLY_LO, NO_TCP, NO_ABSTRACT, OWN_NETNS),
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
        # bwrap is started with the launcher's environment too, so its own PID 1 holds the secret.
        reddens=(ENV_ALLOWLIST, ENV_SECRET, SECRETS),
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
        "workdir_copy",
        "the task starts in an empty tmpfs at its workdir's path, not in the host's workdir",
        launcher_args=("--append=--tmpfs", "--append={workdir}"),
        # On stdin: a script in the workdir would be hidden by the copy too (no task at all).
        stdin=True,
        # The path inside is right; only the host's look through /proc/PID/cwd tells the directories
        # apart. What the task writes there never reaches the host either.
        reddens=(WORKDIR_START, WORKDIR_WRITABLE),
        collateral=(
            Collateral(
                CGROUP_KILL,
                "the tree's marker is written in the workdir, where the harness never sees it (with a "
                "cgroup root only)",
            ),
        ),
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
        # Append, plant and unlink still meet a read-only bind: only the content is wrong. The host's
        # reading of the mount table names it: the neighbour's (absent) directory, under this name.
        reddens=(CONTROL_READABLE, ALIASES),
    ),
    Control(
        "read_only_stale",
        "the read-only state tree shows a file with other content than the host's (a stale copy)",
        launcher_args=(
            "--append=--ro-bind",
            "--append={neighbour_control}/system_prompt.txt",
            "--append={state}/config.toml",
        ),
        # The stale copy IS the neighbour's control file: an alias of an absent path.
        reddens=(STATE_READABLE, ALIASES),
    ),
    Control(
        "state_file_writable",
        "one file of the read-only state tree is bound read-write",
        launcher_args=("--append=--bind", "--append={state}/config.toml", "--append={state}/config.toml"),
        # The witness appends zero bytes (conformance/plan.py): the refusal is at open(2).
        reddens=(STATE_EROFS, STATE_MOUNTS_RO, WRITE_SURFACE),
    ),
    Control(
        "usr_writable",
        "/usr is bound read-write",
        launcher_args=("--append=--bind", "--append=/usr", "--append=/usr"),
        # The witness's plant REACHES the host's /usr here (as root; EACCES as an unprivileged user,
        # still not EROFS): the harness removes it by its nonce after the launch (conformance/harness.py),
        # as it does for the unsandboxed baseline.
        reddens=(USR_EROFS, USR_MOUNTS_RO, WRITE_SURFACE),
    ),
    Control(
        "cgroup_tree_bound",
        "the host's cgroup2 tree is bound read-write into the task (no cgroup namespace can hide a "
        "neighbour's leaf then)",
        launcher_args=("--append=--bind", "--append=/sys/fs/cgroup", "--append=/sys/fs/cgroup"),
        # Only the neighbour's memory.max goes through: its cgroup.procs still refuses a move out of
        # the task's cgroup namespace under nsdelegate (ENOENT, kernel/cgroup/cgroup.c
        # cgroup_procs_write_permission); one accepted write is a broken promise. The tree's root comes
        # with it, read-write to a root task: the host's kernel settings (cgroupfs_bound's one thing).
        reddens=(CGROUP_NEIGHBOUR, KERNEL_INTERFACES),
        needs=Needs.cgroup_root_as_root,
    ),
    Control(
        "no_new_privs_off",
        "the task enters the reference sandbox's namespaces from outside (setns), without "
        "PR_SET_NO_NEW_PRIVS, which bwrap always sets on its own children",
        launcher_args=("--join",),
        reddens=(NNP,),
        collateral=(
            Collateral(
                TERMINAL,
                "entered from outside with setns(2), the task is in the launcher's own session, controlling "
                "terminal and all: bwrap's --new-session never ran for it",
            ),
        ),
    ),
    # ---- adversaries (issue 11): sandboxes built to pass a checker that trusts the wrong observer ----
    Control(
        "alias_host_root",
        "the host's / is also bound (read-only) at /hostroot, where the masked canary, the neighbour's "
        "control directory and the other user's tree can all be read",
        launcher_args=("--append=--ro-bind", "--append=/", "--append=/hostroot"),
        # The same alias shows the launcher's .env and the harness's planted daemon socket (a socket
        # on a read-only mount still accepts connect(2)); and, since bwrap binds recursively (MS_REC),
        # the host's own procfs at /hostroot/proc, which lists every host process (host_proc_bound's
        # one thing).
        reddens=(ALIASES, SECRETS, HOST_SOCKETS, PIDS_INVISIBLE),
        collateral=(
            Collateral(
                WRITE_SURFACE,
                "the alias carries the host's own submounts along; one that stays read-write there (a "
                "container engine's data root, say) is host storage the task can write",
            ),
        ),
    ),
    Control(
        "read_only_subdir_writable",
        "/usr is read-only at the top, but /usr/local beneath it is bound read-write",
        launcher_args=("--append=--bind", "--append=/usr/local", "--append=/usr/local"),
        # The witness's plant reaches the host's /usr/local as root (EACCES as a user): removed by its
        # nonce after the launch, like usr_writable's.
        reddens=(USR_EROFS, USR_MOUNTS_RO, WRITE_SURFACE),
    ),
    Control(
        "forged_proc",
        "the host's ipc and uts namespaces are shared and capabilities kept, behind a /proc that shows "
        "none of it (no capabilities, NoNewPrivs, private namespace ids)",
        launcher_args=(
            "--forge-proc",
            "--drop=--unshare-ipc",
            "--drop=--unshare-uts",
            "--drop=--hostname",
            "--drop=sbxc-task",
            "--drop=--cap-drop",
            "--drop=ALL",
            # As root bwrap keeps capabilities unless told; an unprivileged caller's task keeps none
            # unless asked (bwrap(1), --cap-add).
            "--append=--cap-add",
            "--append=ALL",
        ),
        # The forged /proc lists no processes: PID 1 cannot be seen inside either.
        reddens=(IPC, UTS, NO_CAPS, KERNEL_VIEW, PID_1),
    ),
    Control(
        "nesting_one_door",
        "no --disable-userns; a seccomp filter refuses unshare(2) alone, so clone(2) and clone3(2) with "
        "CLONE_NEWUSER still create a user namespace",
        launcher_args=("--seccomp-refuse=unshare", "--drop=--disable-userns"),
        reddens=(NESTED_USERNS,),
    ),
    Control(
        "secret_as_value",
        "the launcher's secret is passed as the value of an allowlisted key (LANG)",
        launcher_args=("--leak-secret-as=LANG",),
        # The value is on bwrap's own command line (--setenv LANG ...) too: PID 1's cmdline shows it.
        reddens=(ENV_SECRET, ENV_SET, SECRETS),
    ),
    Control(
        "stale_control",
        "a control directory left by another run (same file names, same shape, another nonce) is bound "
        "where this task's should be",
        launcher_args=("--stale-control",),
        reddens=(CONTROL_READABLE,),
    ),
    Control(
        "daemon_left_behind",
        "the launcher leaves a daemon running (double fork, a session of its own) after the task exits",
        launcher_args=("--leave-daemon",),
        # The lifecycle launch leaves one too, and finds it after the launcher's SIGKILL.
        reddens=(LEFTOVERS, LIFECYCLE),
    ),
    Control(
        "forged_document",
        "no sandbox and no task: the launcher prints the document a perfect sandbox would, echoing this "
        "launch's nonce and creating the files the writable witnesses look for",
        launcher_args=("--forge-document",),
        stdin=True,
        # The lifecycle launch meets no task either: nothing announces, so nothing can be killed; and the
        # terminal launch gets the forger's document, which tried nothing.
        reddens=(*HOST_JUDGED, UNCHANGED, LIFECYCLE, TERMINAL),
        collateral=(
            Collateral(
                NESTED_USERNS,
                "the forger answers the doors it knows of (clone, clone3, unshare), not the i386 and x32 "
                "entry points the witness tries on x86_64",
            ),
            Collateral(MASKED_CANARY, "the forger reads the host's files for every path it is asked about"),
            Collateral(NEIGHBOUR_ABSENT, "the forger cannot tell an absent path from a read-only one"),
            Collateral(OTHER_USER_ABSENT, "the forger cannot tell an absent path from a read-only one"),
        ),
    ),
    # ---- issue 13: what agent sandboxes promise (hidden content, proxies, accepted refusals) ------
    Control(
        "mask_is_a_copy",
        "the masked directory is a read-only tmpfs of the sandbox's own, but holding a copy of the host's "
        "files: no host storage is mounted there, yet the content a mask (like any hidden path) keeps out "
        "is readable",
        launcher_args=("--mask-copy",),
        reddens=(MASKED_TMPFS, MASKED_CANARY),
    ),
    Control(
        "proxy_lets_unlisted_through",
        "the task is offered an HTTP proxy (HTTPS_PROXY, relayed into its network namespace as srt does) "
        "that tunnels to any name: under network none, where no name is listed, the host's listener is "
        "reached through it",
        launcher_args=("--offer-proxy",),
        # The proxy is announced the way srt announces its own, in variables the allowlist does not list.
        # Its relay in the task's pid namespace holds a socket of the host's network namespace: the way out.
        reddens=(NO_TCP, ENV_ALLOWLIST, DESCRIPTORS),
    ),
    Control(
        "refusal_outside_accepted",
        "/usr is bound read-write and a Landlock ruleset refuses every write there with EACCES: nothing "
        "lands, but the refusal is not one the profile accepts ([filesystem] refuse, EROFS by default)",
        launcher_args=("--append=--bind", "--append=/usr", "--append=/usr", "--landlock-refuse=/usr"),
        # The read-write bind that lets Landlock answer first shows in the task's mount table too.
        reddens=(USR_EROFS, USR_MOUNTS_RO, WRITE_SURFACE),
    ),
)

REACH: tuple[Control, ...] = (
    # ---- issue 26: what the task holds and reaches, each a class a real sandbox has shipped ----------
    Control(
        "secret_in_init",
        "bwrap is started with the launcher's environment and clears only the task's (--clearenv): its "
        "own process, the sandbox's PID 1, still holds the secret, readable at /proc/1/environ",
        perturb="secret_in_init",
        reddens=(SECRETS,),
    ),
    Control(
        "secret_file_handed",
        "the launcher hands the task its secret in a file: a .env in the task's working directory",
        launcher_args=("--secret-file",),
        reddens=(SECRETS,),
    ),
    Control(
        "proc_sys_writable",
        "the task's /proc/sys is left read-write (bwrap's --proc alone): as root, the host's kernel "
        "settings (core_pattern, overcommit_ratio) open for writing",
        perturb="proc_sys_writable",
        reddens=(KERNEL_INTERFACES,),
        needs=Needs.as_root,
    ),
    Control(
        "dir_fd_leaked",
        "the launcher leaves a descriptor of the layout's root directory open into the task (runc "
        "CVE-2024-21626): openat(fd, '..') walks the host's tree past every mount",
        launcher_args=("--leak-dir",),
        reddens=(DESCRIPTORS,),
    ),
    Control(
        "socket_leaked",
        "the launcher leaves a TCP connection of its own, on the host's loopback, open into a task whose "
        "network is none",
        launcher_args=("--leak-socket",),
        reddens=(DESCRIPTORS,),
    ),
    Control(
        "netns_fd_leaked",
        "the launcher leaves a descriptor of the host's network namespace open into the task",
        launcher_args=("--leak-netns",),
        reddens=(DESCRIPTORS,),
    ),
    Control(
        "exec_joined_late",
        "after the handshake, a process enters the sandbox from outside (as `runc exec` does) holding a "
        "descriptor of a host directory, with its cwd there (runc CVE-2024-21626): the task's pid "
        "namespace holds a way out the handshake never saw",
        launcher_args=("--exec-late",),
        reddens=(DESCRIPTORS,),
        collateral=(
            Collateral(
                SECRETS,
                "the entering process is forked from the launcher and carries its environment, the "
                "planted secret with it, until its execve(2) (a few milliseconds): a later look in that "
                "window finds the secret in its /proc/PID/environ, as the task could",
            ),
        ),
    ),
    Control(
        "exec_late_with_secret",
        "after the handshake, a process enters the sandbox from outside carrying the launcher's "
        "environment, secret and all (`docker exec -e TOKEN=...`, a `kubectl exec` from a daemon that "
        "holds the key): the task, of the same uid, reads its /proc/PID/environ after its own search",
        launcher_args=("--exec-late-env",),
        reddens=(SECRETS,),
        collateral=(
            Collateral(
                DESCRIPTORS,
                "between its fork and its execve(2) the entering process still holds the namespace "
                "descriptors it entered by (closed at exec, O_CLOEXEC): a later look in those "
                "milliseconds sees them (2 full runs in 3 under load)",
            ),
        ),
    ),
    Control(
        "helper_held_late",
        "a helper of the sandbox's in the task's pid namespace, there and clean at the handshake, is "
        "handed a descriptor of a host directory over a unix socket once the task is released (a "
        "broker's SCM_RIGHTS): the way out comes after the only look the host made at it",
        launcher_args=("--helper-late",),
        reddens=(DESCRIPTORS,),
    ),
    Control(
        "daemon_socket_bound",
        "a host daemon's unix socket (the harness's planted one) is bound into the task, read-only: "
        "connect(2) needs no writable mount (the Docker-socket class)",
        launcher_args=("--bind-daemon-socket",),
        reddens=(HOST_SOCKETS,),
    ),
    Control(
        "daemon_socket_uring",
        "the planted daemon socket bound in, and a seccomp filter that refuses socket(AF_UNIX) (srt's) but "
        "leaves io_uring open: IORING_OP_SOCKET and IORING_OP_CONNECT reach it past the filter",
        launcher_args=("--bind-daemon-socket", "--seccomp-refuse=socket-unix"),
        reddens=(HOST_SOCKETS,),
    ),
    Control(
        "host_proc_bound",
        "the host's /proc bound in read-only at /host/proc beside the task's own (a monitoring agent's "
        "`-v /proc:/host/proc`): every host process is listed there",
        launcher_args=("--append=--ro-bind", "--append=/proc", "--append=/host/proc"),
        reddens=(PIDS_INVISIBLE,),
    ),
    Control(
        "host_dev_bound",
        "the host's /dev bound in at /host/dev beside the task's minimal /dev: its nodes open there",
        launcher_args=("--append=--dev-bind", "--append=/dev", "--append=/host/dev"),
        reddens=(DEVICES,),
        collateral=(
            Collateral(
                WRITE_SURFACE,
                "the host's /dev (devtmpfs) and /dev/shm (tmpfs) come with it, read-write host storage the "
                "profile does not declare writable",
            ),
        ),
        needs=Needs.as_root,
    ),
    Control(
        "device_bound",
        "the host's /dev/kvm is bound next to the minimal /dev: a task with no capabilities opens it",
        launcher_args=("--append=--dev-bind", "--append=/dev/kvm", "--append=/dev/kvm"),
        reddens=(DEVICES,),
        needs=Needs.as_root,
    ),
    Control(
        "device_beside_dev",
        "the host's /dev/kmsg is bound at /kmsg, outside /dev, where a task that lists only /dev never looks",
        launcher_args=("--append=--dev-bind", "--append=/dev/kmsg", "--append=/kmsg"),
        reddens=(DEVICES,),
        needs=Needs.as_root,
    ),
    Control(
        "cgroupfs_bound",
        "the host's /sys/fs/cgroup is bound in read-write (as `--privileged` or a `-v /sys/fs/cgroup` "
        "mount gives it): every cgroup of the host's is the task's to write, a v1 release_agent among "
        "them (CVE-2022-0492)",
        launcher_args=("--append=--bind", "--append=/sys/fs/cgroup", "--append=/sys/fs/cgroup"),
        reddens=(KERNEL_INTERFACES,),
        collateral=(
            Collateral(
                WRITE_SURFACE,
                "on a v1 or hybrid host /sys/fs/cgroup itself is a tmpfs holding the hierarchies' mount "
                "points: the bind carries that host tmpfs in read-write too",
            ),
        ),
        needs=Needs.host_cgroupfs_as_root,
    ),
    Control(
        "binfmt_bound",
        "the host's binfmt_misc instance is bound in read-write (as a container given "
        "/proc/sys/fs/binfmt_misc to register qemu handlers has it): its register names an interpreter the "
        "kernel runs for every matching exec on the host",
        launcher_args=("--binfmt-bound",),
        reddens=(KERNEL_INTERFACES,),
        needs=Needs.binfmt_misc_as_root,
    ),
    Control(
        "no_new_session",
        "no --new-session: the task keeps the launcher's controlling terminal and pushes input into it "
        "with TIOCSTI (bwrap CVE-2017-5226)",
        launcher_args=("--drop=--new-session",),
        reddens=(TERMINAL,),
        needs=Needs.legacy_tiocsti,
    ),
    Control(
        "shared_cache_under_workdir",
        "the host's /var/tmp, storage every task shares, is bound read-write beneath the declared writable "
        "workdir ({workdir}/cache): the workdir is declared, what is mounted under it is not",
        launcher_args=("--append=--bind", "--append=/var/tmp", "--append={workdir}/cache"),
        reddens=(WRITE_SURFACE,),
    ),
    Control(
        "canary_hardlinked",
        "the masked database has a second name on the same filesystem, a hardlink in the task's working "
        "directory: no mount's root is an ancestor of its path, yet its content is readable",
        launcher_args=("--canary-hardlink",),
        reddens=(ALIASES,),
    ),
    Control(
        "canary_copied",
        "a copy of the masked database sits in the sandbox's own /tmp (bwrap --file): no host storage is "
        "mounted there, yet the content the mask keeps out is readable under another name",
        launcher_args=("--canary-copy",),
        reddens=(ALIASES,),
    ),
    Control(
        "mount_api_open",
        "the task keeps its capabilities in the user namespace that owns its mount namespace (--cap-add "
        "ALL, no --disable-userns): fsopen(2), open_tree(2) and move_mount(2) pass their permission check",
        launcher_args=("--drop=--disable-userns", "--append=--cap-add", "--append=ALL"),
        reddens=(SYSCALLS, NO_CAPS),
        needs=Needs.one_userns,
        # Under --disable-userns the task sits in a nested user namespace, where kept capabilities do not
        # reach the mount namespace (caps_kept): dropping it opens the nested-userns door too.
        collateral=(Collateral(NESTED_USERNS, "no --disable-userns: the same dropped boundary showing"),),
    ),
    Control(
        "nesting_x86_64_only",
        "no --disable-userns; a seccomp filter refuses user namespaces by x86_64 syscall numbers and never "
        "checks the architecture, so unshare through the i386 entry point (int 0x80) creates one",
        launcher_args=("--seccomp-x86-64-only", "--drop=--disable-userns"),
        reddens=(NESTED_USERNS,),
        needs=Needs.x86_64,
    ),
)
WATCH: tuple[Control, ...] = (
    # ---- issue 27: sandboxes built to fool an observer that looks once, at an announced moment ------
    Control(
        "outlives_launcher",
        "no --die-with-parent: the task keeps running when its launcher is SIGKILLed",
        launcher_args=("--drop=--die-with-parent",),
        reddens=(LIFECYCLE,),
    ),
    Control(
        "late_seccomp",
        "the task's seccomp filter is applied just before it announces the handshake: until the host's "
        "look, it ran in another sandbox than the one the host reads",
        launcher_args=("--late-seccomp",),
        stdin=True,
        # The task read its own status before the filter; the host reads it after: the same one thing.
        reddens=(UNCHANGED, KERNEL_VIEW),
    ),
    *(
        Control(
            f"defeat_on_{signal_}",
            f"a defeat device: the honest sandbox only when {how}, the host's network shared otherwise",
            launcher_args=(f"--defeat={signal_}",),
            reddens=(ONLY_LO, NO_TCP, NO_ABSTRACT, OWN_NETNS),
        )
        for signal_, how in (
            ("spec", "the task spec's variable is in the launcher's environment"),
            ("argv", "the command is `python3 -I -S -`"),
            ("stdin", "stdin starts with the witness program's PLAN line"),
            ("names", "any SANDBOX_CONFORMANCE_* variable is in the launcher's environment"),
        )
    ),
    Control(
        "decoy",
        "a decoy in the honest reference sandbox carries the task's tag and waits to be looked at, while "
        "the real task runs with the host's ipc namespace and every capability and prints the document",
        launcher_args=("--decoy",),
        stdin=True,
        # The host released the process it read with a number the document does not carry: every
        # witness judged on that reading has no live task behind the document.
        reddens=(*HOST_JUDGED, UNCHANGED),
        collateral=(
            Collateral(LIFECYCLE, "its launch meets the same decoy, and the real task never announces"),
        ),
    ),
)
CONTROLS = CONTROLS + REACH + WATCH

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
    key(t)
    for t in (
        USR_READABLE,
        STATE_READABLE,
        WORKDIR_WRITABLE,
        CONTROL_READABLE,
        USER_TMP_WRITABLE,
        # Honesty, not isolation: a task with no sandbox at all shows the kernel's state truthfully and
        # leaves nothing behind. Their own controls are forged_proc and daemon_left_behind.
        KERNEL_VIEW,
        LEFTOVERS,
        # The harness starts the unsandboxed task with nothing but its stdio pipes: no descriptor of it
        # leads anywhere. Its controls are dir_fd_leaked, socket_leaked and netns_fd_leaked.
        DESCRIPTORS,
        # With no sandbox the task is the launcher's own process (`env` execs it): it is one thing all
        # its life and dies with its launcher. Their controls: late_seccomp, decoy, outlives_launcher.
        UNCHANGED,
        LIFECYCLE,
    )
)
# Witnesses an unprivileged task keeps with no sandbox at all: the host's sysctls and device nodes
# belong to root, so file modes refuse it (see Needs.as_root). Not the syscall doors: the process it
# must not ptrace is its own user's and open to any tracer (conformance/ptrace_target.py), so with no
# sandbox it is traced (it was the harness, a root process, which the kernel refused it anyway).
MODE_KEPT: frozenset[str] = frozenset(key(t) for t in (KERNEL_INTERFACES, DEVICES))


def mode_kept(proc: str = "/proc") -> frozenset[str]:
    """MODE_KEPT on this host: where Yama refuses every attach without CAP_SYS_PTRACE (ptrace_scope 2 or
    3) the ptrace door is absent for an unprivileged task, and its mount API doors refuse it (no
    CAP_SYS_ADMIN): the syscall doors are kept with no sandbox at all."""
    try:
        with open(f"{proc}/sys/kernel/yama/ptrace_scope") as f:
            scope = f.read().strip()
    except OSError:
        scope = ""
    return MODE_KEPT | {key(SYSCALLS)} if scope in ("2", "3") else MODE_KEPT
# Witnesses of the task's cgroup leaf: the harness, not the sandbox, makes the leaf and writes its
# limits (conformance/harness.py), so a task with no sandbox at all still has them. The unsandboxed
# baseline does not require them red; it may still redden some (as root, nothing stops a write to the
# neighbour's leaf), which is declared collateral.
HARNESS_ENFORCED: frozenset[str] = frozenset(
    key(t) for t in (CGROUP_OWN_LEAF, CGROUP_OOM, CGROUP_PIDS, CGROUP_KILL, CGROUP_NEIGHBOUR)
)

# Witnesses a task with no sandbox keeps only on a quiet host: it shares the host's mount namespace,
# where a mount anything else makes or removes (a container engine's shm and overlay mounts) shows up
# between two looks. Measured: a podman run beside the unsandboxed baseline turned `unchanged` red with
# its container's `userdata/shm` mount. Declared collateral of the unsandboxed baseline, never required
# red by it (its controls are late_seccomp, decoy and forged_document).
HOST_SHARED: frozenset[str] = frozenset(key(t) for t in (UNCHANGED,))

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
    if control.needs is Needs.as_root and not as_root:
        return (
            "tasks run as an unprivileged user: the host's kernel settings and device nodes belong to root "
            "(0644, 0600; dmesg_restrict for /dev/kmsg), so file modes refuse the task whatever the sandbox "
            "exposes (run the controls as root)"
        )
    if control.needs is Needs.one_userns and not as_root:
        return (
            "tasks run as an unprivileged user: bwrap --dev then puts the task in a second user namespace "
            "below the one that owns its mount namespace, so capabilities kept there never reach it "
            "(measured: fsopen(2) EPERM under --cap-add ALL; run the controls as root)"
        )
    if control.needs is Needs.host_cgroupfs_as_root:
        if not as_root:
            return (
                "tasks run as an unprivileged user: the files at a cgroup hierarchy's root belong to root "
                "(0644), so file modes refuse the task whatever the sandbox shows (run the controls as root)"
            )
        if not _host_cgroupfs():
            return "the host has no cgroup hierarchy mounted at /sys/fs/cgroup: nothing to bind in"
    if control.needs is Needs.binfmt_misc_as_root:
        if not as_root:
            return (
                "tasks run as an unprivileged user: binfmt_misc's register belongs to root (0200), so file "
                "modes refuse the task whatever the sandbox shows (run the controls as root)"
            )
        if not _kernel_has("binfmt_misc"):
            return "this kernel has no binfmt_misc (not in /proc/filesystems): no instance to bind in"
    if control.needs is Needs.legacy_tiocsti and _legacy_tiocsti() == "0":
        return "dev.tty.legacy_tiocsti = 0: this kernel refuses TIOCSTI to every task, sandboxed or not"
    if control.needs is Needs.x86_64 and platform.machine() != "x86_64":
        return f"the i386 entry point exists only on x86_64, not on {platform.machine()}"
    if control.needs is Needs.cgroup_root_as_root and not as_root:
        return (
            "tasks run as an unprivileged user: the cgroup files belong to root, so file modes refuse "
            "the write whatever the sandbox shows (run the controls as root)"
        )
    return None


def _host_cgroupfs() -> bool:
    try:
        with open("/proc/self/mountinfo") as f:
            mounts = mountinfo.parse(f.read())
    except OSError:
        return False
    top = PurePosixPath("/sys/fs/cgroup")
    return any(
        m.fstype in ("cgroup", "cgroup2")
        and m.root == "/"
        and PurePosixPath(m.mount_point).is_relative_to(top)
        for m in mounts
    )


def _kernel_has(fstype: str) -> bool:
    try:
        with open("/proc/filesystems") as f:
            return any(line.split()[-1:] == [fstype] for line in f)
    except OSError:
        return False


def _legacy_tiocsti() -> str:
    try:
        with open("/proc/sys/dev/tty/legacy_tiocsti") as f:
            return f.read().strip()
    except OSError:
        return "absent"  # before Linux 6.2 there is no switch: TIOCSTI is always allowed


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
    # The task id in the launcher's own argv (expanded by the harness, conformance/launch.py), the rest
    # of the layout found where it runs: the controls run as a user's launcher does, with no spec.
    words.append("--task={task_id}")
    if disable_userns:
        words.append("--disable-userns")
    words += list(control.launcher_args)
    words.append("--")
    return shlex.join(words)


def unsandboxed(
    baseline_passed: Iterable[str], baseline_other: Mapping[str, str], *, as_root: bool = True
) -> Control:
    """The unsandboxed baseline as a control: the witness program run with no sandbox at all (`env`
    as the launcher) must turn every isolation witness that passed in the baseline red. A witness
    that did not pass in the baseline proves nothing either way: declared collateral, with why."""
    passed = list(map(key, baseline_passed))
    by_modes = frozenset() if as_root else mode_kept()
    names = tuple(sorted(k for k in passed if k not in AVAILABILITY | HARNESS_ENFORCED | by_modes))
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
        )
        + tuple(
            Collateral(_w(k), "file modes keep it for an unprivileged task, sandbox or not: not judged")
            for k in sorted(set(passed) & by_modes)
        )
        + tuple(
            Collateral(_w(k), "the task shares the host's mount namespace, where anything else on the host "
                       "may mount or unmount between two looks: not judged")
            for k in sorted(set(passed) & HOST_SHARED)
        ),
    )
