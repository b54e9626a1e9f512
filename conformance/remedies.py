"""What usually breaks a promise, and the flag or setting that keeps it in the sandbox at hand (issue 29).

A table of (promise id, sandbox kind) -> (cause, fix). The kind is the adapter in use (`--adapter NAME`,
folded to its tool: runc and crun are `oci`, a `bwrap-*` adapter is `bwrap`), the reference sandbox's
`bwrap`, and `generic` for a launcher of your own, which this project cannot see into. Every promise id
of conformance/promises.py has a generic entry (tests/test_promises.py checks); a kind without an entry
of its own for a promise gets the generic one.

The flags are the tools' real ones, checked against their own `--help`, manuals and `runc spec` on the
test host (bubblewrap 0.8.0, util-linux 2.38.1, firejail 0.9.72, podman 4.3.1, systemd 252, runsc
20221219, runc 1.1.5, docker 28.2) or, for srt and codex, against the settings conformance/adapters/
writes and their documentation; where a tool has no setting that keeps a promise, the fix says so
rather than invent one. A remedy is advice for a person: it names what usually causes the failure, not
what caused this one (the row's detail says what the task saw).

Pure data and pure functions, on the witness command's path: no I/O, no imports of ours."""

from __future__ import annotations

from typing import NamedTuple

GENERIC = "generic"
# The sandbox kinds the table knows, in the order docs/ list them.
KINDS = ("bwrap", "unshare", "oci", "docker", "podman", "firejail", "runsc", "nspawn", "systemd-run", "srt",
         "codex", GENERIC)
# Adapter names (conformance/adapters ADAPTERS, and names to come) that are not their kind's name.
_ALIASES = {"runc": "oci", "crun": "oci", "gvisor": "runsc", "systemd-nspawn": "nspawn", "reference": "bwrap"}


class Remedy(NamedTuple):
    promise: str
    sandbox: str  # the kind this remedy was written for: the one asked, or `generic`
    cause: str
    fix: str

    def line(self) -> str:
        """The one line the text report prints under a BROKEN row."""
        return f"usually: {self.cause}; keep it with: {self.fix}"

    def to_json(self) -> dict[str, str]:
        return {"sandbox": self.sandbox, "cause": self.cause, "fix": self.fix}


def kind_of(adapter: str | None) -> str:
    """The sandbox kind of an adapter name: its tool (`runc` -> `oci`, `podman-rootless` -> `podman`,
    `bwrap-trixie` -> `bwrap`); `generic` for None or a name this table does not know."""
    if not adapter:
        return GENERIC
    name = adapter.lower()
    for candidate in (name, name.split("-", 1)[0], name.split("_", 1)[0]):
        kind = _ALIASES.get(candidate, candidate)
        if kind in KINDS:
            return kind
    return GENERIC


def remedy(promise: str, sandbox: str) -> Remedy | None:
    """The remedy for `promise` broken in a sandbox of kind `sandbox`: its own entry, else the generic
    one; None for an id this table does not know (a witness of your own suite)."""
    entries = TABLE.get(promise)
    if entries is None:
        return None
    kind = sandbox if sandbox in entries else GENERIC
    cause, fix = entries[kind]
    return Remedy(promise, kind, cause, fix)


TABLE: dict[str, dict[str, tuple[str, str]]] = {
    "masked": {
        GENERIC: ("the path is bound from the host, or a bind of a parent lands after the mask",
                  "cover the path with an empty read-only tmpfs after every bind of its parents"),
        "bwrap": ("no --tmpfs over the path, or a --bind/--ro-bind of a parent after it",
                  "--tmpfs PATH --remount-ro PATH after every bind of its parents (--ro-bind /dev/null FILE"
                  " for a file)"),
        "oci": ("the path is not in linux.maskedPaths, or a mount over a parent comes later",
                "linux.maskedPaths"),
        "docker": ("the path comes from the image or a volume",
                   "--mount type=tmpfs,destination=PATH,readonly"),
        "podman": ("the path comes from the image or a volume",
                   "--security-opt mask=PATH"),
        "systemd-run": ("ProtectSystem= leaves the path readable",
                        "TemporaryFileSystem=PATH:ro"),
        "srt": ("srt's denyRead covers a path with an empty writable tmpfs: that keeps `hidden`, not "
                "`masked`",
                "filesystem.denyRead, with the path declared `hidden` in the profile"),
        "codex": ('a "none" path is an empty mode-000 tmpfs: that keeps `hidden`, not `masked`',
                  '"none" for the path in the permissions profile, declared `hidden` in the profile'),
    },
    "read_only": {
        GENERIC: ("the path, or a mount beneath it, is bound read-write",
                  "bind it read-only, and every mount beneath it too (a read-write submount stays writable)"),
        "bwrap": ("--bind where --ro-bind was meant, or a later --bind beneath the path",
                  "--ro-bind SRC PATH, and --remount-ro PATH after binds beneath it"),
        "oci": ("a bind mount without the ro option",
                'mount options ["rbind", "ro"], and root.readonly: true'),
        "docker": ("a volume without :ro",
                   "-v SRC:PATH:ro, and --read-only for the image's root"),
        "podman": ("a volume without :ro",
                   "-v SRC:PATH:ro, and --read-only for the image's root"),
        "firejail": ("the path is left as the host has it",
                     "--read-only=PATH"),
        "nspawn": ("--bind= where --bind-ro= was meant",
                   "--bind-ro=PATH, and --read-only for the root"),
        "systemd-run": ("ProtectSystem= below strict, or ReadWritePaths= over the path",
                        "ReadOnlyPaths=PATH, or ProtectSystem=strict"),
        "srt": ("the path, or a parent, in filesystem.allowWrite",
                "keep it out of filesystem.allowWrite, or list it in filesystem.denyWrite"),
        "codex": ('"write" for the path or a parent in the permissions profile',
                  '"read" for the path'),
    },
    "writable": {
        GENERIC: ("the path is bound read-only, or is a private copy (a tmpfs, an overlay) the host never "
                  "sees",
                  "bind the host directory read-write at the same path"),
        "bwrap": ("--ro-bind or --tmpfs where --bind was meant",
                  "--bind PATH PATH"),
        "oci": ("a bind mount with ro, or no mount",
                'a bind mount with options ["rbind", "rw"]'),
        "docker": ("a volume with :ro, or none",
                   "-v PATH:PATH:rw"),
        "podman": ("a volume with :ro, or none",
                   "-v PATH:PATH:rw"),
        "nspawn": ("--bind-ro= or no bind",
                   "--bind=PATH"),
        "systemd-run": ("ProtectSystem=strict without an exception",
                        "ReadWritePaths=PATH"),
        "srt": ("the path is not in filesystem.allowWrite",
                "filesystem.allowWrite"),
        "codex": ('the path is "read" in the permissions profile',
                  '"write" for the path'),
    },
    "absent": {
        GENERIC: ("the path is bound in with the rest of the host's tree",
                  "leave it out: cover its parent with a tmpfs and bind back only what the task needs"),
        "bwrap": ("a bind of a parent (--ro-bind / /) brings it in",
                  "--tmpfs PARENT after the bind, then --ro-bind back only the task's own trees"),
        "podman": ("a tmpfs mount copies the image's content up into it (podman's default tmpcopyup)",
                   "notmpcopyup in the tmpfs mount's options"),
        "srt": ("denyRead leaves an empty directory, not an absent path",
                "declare the path `hidden` instead"),
        "codex": ('"none" leaves an empty mode-000 directory, not an absent path',
                  "declare the path `hidden` instead"),
    },
    "hidden": {
        GENERIC: ("the path is bound in readable",
                  "cover it with an empty tmpfs, or make it inaccessible"),
        "bwrap": ("nothing covers the path",
                  "--tmpfs PATH"),
        "oci": ("the path is not masked",
                "linux.maskedPaths"),
        "docker": ("the path comes from a volume",
                   "--mount type=tmpfs,destination=PATH"),
        "podman": ("the path comes from a volume",
                   "--security-opt mask=PATH"),
        "firejail": ("the path is not blacklisted",
                     "--blacklist=PATH"),
        "nspawn": ("the path is bound in",
                   "--inaccessible=PATH"),
        "systemd-run": ("the path is readable under ProtectSystem=",
                        "InaccessiblePaths=PATH"),
        "srt": ("the path is not in filesystem.denyRead",
                "filesystem.denyRead"),
        "codex": ('the path is "read" in the permissions profile',
                  '"none" for the path'),
    },
    "aliases": {
        GENERIC: ("a second bind of the host's /, of the state tree or of one file, outside the mask",
                  "bind each host tree once, and mask a path after every bind that contains it"),
        "bwrap": ("a --bind/--ro-bind of / or of the state tree at a second place (/hostroot)",
                  "remove the second bind; --tmpfs the path after every bind that contains it"),
    },
    "control": {
        GENERIC: ("the control directory is bound read-write, or the whole users' tree is bound in",
                  "bind only this task's control directory, read-only, over a tmpfs that hides the rest"),
        "bwrap": ("--bind of the control directory, or no --tmpfs over the users' tree",
                  "--tmpfs {state}/users, then --ro-bind {control} {control}"),
    },
    "user_tmp": {
        GENERIC: ("the per-user temp directory is read-only, or a private tmpfs",
                  "bind the host's directory read-write at its path"),
        "bwrap": ("--ro-bind of the directory, or none after the tmpfs over the users' tree",
                  "--bind {user_tmp} {user_tmp} after that tmpfs"),
    },
    "workdir": {
        GENERIC: ("the task starts elsewhere, or in a copy (a tmpfs, an overlay) of its directory",
                  "bind the host's directory read-write at its path and start the task there"),
        "bwrap": ("no --chdir, or a --tmpfs over the directory",
                  "--bind DIR DIR --chdir DIR"),
        "oci": ("process.cwd is another directory, or the directory is not bind-mounted",
                "a bind mount of DIR and process.cwd: DIR"),
        "docker": ("no --workdir, or no volume for it",
                   "-v DIR:DIR:rw --workdir DIR"),
        "podman": ("no --workdir, or no volume for it",
                   "-v DIR:DIR:rw --workdir DIR"),
        "nspawn": ("no --chdir=, or no bind for it",
                   "--bind=DIR --chdir=DIR"),
        "systemd-run": ("no WorkingDirectory=, or the directory is not bound",
                        "BindPaths=DIR WorkingDirectory=DIR"),
    },
    "network": {
        GENERIC: ("the task shares the host's network namespace",
                  "a new network namespace with only lo"),
        "bwrap": ("--share-net, or neither --unshare-net nor --unshare-all",
                  "--unshare-net"),
        "unshare": ("no --net",
                    "--net"),
        "oci": ("no network entry in linux.namespaces",
                'a {"type": "network"} entry in linux.namespaces'),
        "docker": ("--network host, or the default bridge",
                   "--network none"),
        "podman": ("--network host, or the default network",
                   "--network none"),
        "firejail": ("no --net=none",
                     "--net=none"),
        "runsc": ("--network=host, or the default sandbox network",
                  "--network=none"),
        "nspawn": ("no --private-network",
                   "--private-network"),
        "systemd-run": ("no PrivateNetwork=",
                        "PrivateNetwork=yes"),
        "srt": ("a domain in network.allowedDomains that reaches the host",
                "network.allowedDomains with only the names the task may reach"),
        "codex": ("a sandbox mode with network access",
                  "sandbox_workspace_write.network_access = false"),
    },
    "network_proxy": {
        GENERIC: ("the proxy lets a name off the allowlist through, or the task connects past the proxy",
                  "no route out but the proxy (a network namespace of its own) and an allowlist in the "
                  "proxy"),
        "srt": ("network.allowedDomains lists more than the profile's [network] allowed",
                "network.allowedDomains with exactly the allowed names"),
    },
    "write_surface": {
        GENERIC: ("a read-write mount of host storage the profile does not declare (a parent of the "
                  "workdir, the host's /tmp or /dev/shm)",
                  "bind read-write only the declared paths; give scratch space a tmpfs, or declare it in "
                  "[filesystem] scratch"),
        "bwrap": ("a --bind beyond the declared paths (--bind / /, the host's /tmp)",
                  "--ro-bind / /, --tmpfs /tmp, and --bind only the declared paths"),
        "docker": ("a read-write volume or root",
                   "--read-only, and --tmpfs for scratch space"),
        "podman": ("a read-write volume or root",
                   "--read-only, and --tmpfs for scratch space"),
        "systemd-run": ("ProtectSystem=strict leaves /home, /root and /run/user to ProtectHome=",
                        "ProtectHome=read-only"),
    },
    "kernel_view": {
        GENERIC: ("the task's /proc is not a procfs of its own pid namespace (a forged or bound /proc), or "
                  "a file over /proc/self",
                  "mount a fresh procfs for the task's pid namespace, and nothing over it"),
        "bwrap": ("a --bind or --ro-bind over /proc or a file in it",
                  "--unshare-pid --proc /proc"),
    },
    "leftovers": {
        GENERIC: ("a process the launch started (a daemon the launcher forked, a helper) outlives the "
                  "launcher",
                  "run the task in a pid namespace of its own, and wait for it before the launcher exits"),
        "bwrap": ("the launcher backgrounds bwrap, or the task's tree is in no pid namespace of its own",
                  "exec bwrap with --unshare-pid --die-with-parent"),
        "unshare": ("no --pid --fork: the task's tree is not in a pid namespace of its own",
                    "--pid --fork --kill-child"),
        "firejail": ("firejail keeps the sandbox while any process in it runs",
                     "--deterministic-shutdown"),
        "docker": ("a detached container (-d)",
                   "--rm without -d"),
        "podman": ("rootless podman keeps a per-user pause process that outlives every launch, by design",
                   "podman run --rm without -d; the pause process is podman's own, not the task's"),
        "systemd-run": ("KillMode= other than control-group",
                        "--wait --collect with KillMode=control-group"),
    },
    "unchanged": {
        GENERIC: ("the sandbox changed after the handshake: a seccomp filter, a mount or a namespace set up"
                  " late, or the task moved",
                  "set the whole sandbox up before the task's first instruction (seccomp and mounts before "
                  "exec)"),
    },
    "nested_userns": {
        GENERIC: ("nothing refuses CLONE_NEWUSER inside, or a seccomp filter checks x86_64 numbers only",
                  "a seccomp filter that refuses unshare, clone and clone3 with CLONE_NEWUSER on every "
                  "architecture (checking seccomp_data.arch), or user.max_user_namespaces=0 inside"),
        "bwrap": ("no --disable-userns",
                  "--unshare-user --disable-userns (bwrap >= 0.8)"),
        "oci": ("a seccomp profile without the namespace rule, or without every ABI in architectures",
                "linux.seccomp refusing CLONE_NEWUSER, with every ABI in architectures"),
        "docker": ("--security-opt seccomp=unconfined, or a profile without the namespace rule",
                   "the engine's default seccomp profile"),
        "podman": ("--security-opt seccomp=unconfined, or a profile without the namespace rule",
                   "the engine's default seccomp profile"),
        "firejail": ("no --restrict-namespaces",
                     "--restrict-namespaces"),
        "systemd-run": ("no RestrictNamespaces=",
                        "RestrictNamespaces=~user"),
        "codex": ("codex's seccomp filter is a network filter: clone, clone3 and unshare with CLONE_NEWUSER"
                  " succeed inside",
                  'no codex setting refuses it: [userns] nested = "allowed" in the profile'),
    },
    "pid": {
        GENERIC: ("the task shares the host's pid namespace",
                  "a new pid namespace with a fresh /proc"),
        "bwrap": ("no --unshare-pid",
                  "--unshare-pid --proc /proc"),
        "unshare": ("no --pid",
                    "--pid --fork --mount-proc"),
        "oci": ("no pid entry in linux.namespaces",
                'a {"type": "pid"} entry in linux.namespaces'),
        "docker": ("--pid host",
                   "the default private pid namespace (no --pid host)"),
        "podman": ("--pid host",
                   "the default private pid namespace (no --pid host)"),
    },
    "ipc": {
        GENERIC: ("the task shares the host's ipc namespace",
                  "a new ipc namespace"),
        "bwrap": ("no --unshare-ipc",
                  "--unshare-ipc"),
        "unshare": ("no --ipc",
                    "--ipc"),
        "oci": ("no ipc entry in linux.namespaces",
                'an {"type": "ipc"} entry in linux.namespaces'),
        "docker": ("--ipc host or shareable",
                   "--ipc private"),
        "podman": ("--ipc host",
                   "--ipc private"),
        "systemd-run": ("no PrivateIPC=",
                        "PrivateIPC=yes"),
    },
    "uts": {
        GENERIC: ("the task shares the host's uts namespace, or another hostname is set",
                  "a new uts namespace with the promised hostname"),
        "bwrap": ("no --unshare-uts, or no --hostname",
                  "--unshare-uts --hostname NAME"),
        "unshare": ("no --uts",
                    "--uts"),
        "oci": ("no uts entry in linux.namespaces, or another hostname",
                'a {"type": "uts"} entry in linux.namespaces and hostname'),
        "docker": ("--uts host, or no --hostname",
                   "--hostname NAME"),
        "podman": ("--uts host, or no --hostname",
                   "--hostname NAME"),
        "nspawn": ("no --hostname=",
                   "--hostname=NAME"),
        "systemd-run": ("no ProtectHostname=",
                        "ProtectHostname=yes"),
    },
    "capabilities": {
        GENERIC: ("the task keeps capabilities (root in its user namespace, a full bounding set)",
                  "drop every capability, the bounding set too"),
        "bwrap": ("no --cap-drop ALL (a root caller's task keeps its capabilities)",
                  "--cap-drop ALL"),
        "unshare": ("--map-root-user gives the task every capability in its user namespace",
                    "--map-current-user, and setpriv --bounding-set -all"),
        "oci": ("a capability in a process.capabilities set",
                "empty process.capabilities sets, bounding included"),
        "docker": ("the engine's default capability set",
                   "--cap-drop ALL"),
        "podman": ("the engine's default capability set",
                   "--cap-drop=all"),
        "firejail": ("no --caps.drop=all",
                     "--caps.drop=all"),
        "nspawn": ("nspawn's default capability set for the payload",
                   "--drop-capability=CAP,... for each of them"),
        "systemd-run": ("the unit's default capability bounding set",
                        "CapabilityBoundingSet= and AmbientCapabilities="),
    },
    "no_new_privs": {
        GENERIC: ("no PR_SET_NO_NEW_PRIVS before the task's exec",
                  "set no_new_privs (prctl PR_SET_NO_NEW_PRIVS) before exec"),
        "unshare": ("unshare(1) never sets it",
                    "setpriv --no-new-privs"),
        "oci": ("process.noNewPrivileges is false",
                "process.noNewPrivileges: true"),
        "docker": ("no --security-opt no-new-privileges",
                   "--security-opt no-new-privileges"),
        "podman": ("no --security-opt no-new-privileges",
                   "--security-opt no-new-privileges"),
        "firejail": ("no --nonewprivs, and no seccomp filter",
                     "--nonewprivs"),
        "nspawn": ("no --no-new-privileges",
                   "--no-new-privileges=yes"),
        "systemd-run": ("no NoNewPrivileges=",
                        "NoNewPrivileges=yes"),
    },
    "environment": {
        GENERIC: ("the launcher's environment is passed through",
                  "start the task with an empty environment and set only the allowlisted names"),
        "bwrap": ("no --clearenv",
                  "--clearenv, then --setenv NAME VALUE for each allowed name"),
        "unshare": ("unshare(1) passes its environment through",
                    "start it through env -i with only the allowed NAME=VALUE pairs"),
        "oci": ("process.env copied from the launcher",
                "process.env with only the allowed names"),
        "docker": ("--env-file, or an image's ENV",
                   "--env NAME=VALUE for each allowed name only"),
        "podman": ("--env-host, --env-file, or an image's ENV",
                   "--env NAME=VALUE for each allowed name only"),
        "firejail": ("firejail passes its caller's environment through",
                     "start it through env -i, or --rmenv=NAME"),
        "srt": ("srt passes its environment to the command",
                "start srt through env -i with the allowed names"),
        "codex": ("codex passes its environment to the command, and adds CODEX_* names",
                  '[shell_environment_policy] inherit = "none", with set for the allowed names'),
    },
    "environment_set": {
        GENERIC: ("a value is rewritten on the way (a login shell, the sandbox's defaults)",
                  "set each value explicitly, last"),
        "bwrap": ("no --setenv for the name",
                  "--setenv NAME VALUE"),
        "oci": ("process.env lacks the value",
                "NAME=VALUE in process.env"),
        "docker": ("no --env for the name",
                   "--env NAME=VALUE"),
        "podman": ("no --env for the name",
                   "--env NAME=VALUE"),
        "nspawn": ("no --setenv= for the name",
                   "--setenv=NAME=VALUE"),
        "systemd-run": ("no Environment= for the name",
                        "Environment=NAME=VALUE"),
        "codex": ("the name is not set by the shell environment policy",
                  "[shell_environment_policy] set"),
    },
    "cgroup": {
        GENERIC: ("the task is in no cgroup leaf of its own, or a neighbour's leaf is writable from it",
                  "a leaf per task under a delegated cgroup v2 root, entered before exec, emptied with "
                  "cgroup.kill"),
    },
    "memory_max": {
        GENERIC: ("no memory.max in the task's leaf",
                  "write memory.max in the task's leaf before it runs"),
        "oci": ("no linux.resources.memory.limit",
                "linux.resources.memory.limit"),
        "docker": ("no --memory",
                   "--memory BYTES"),
        "podman": ("no --memory",
                   "--memory BYTES"),
        "nspawn": ("no MemoryMax= property",
                   "--property=MemoryMax=BYTES"),
        "systemd-run": ("no MemoryMax=",
                        "MemoryMax=BYTES"),
    },
    "pids_max": {
        GENERIC: ("no pids.max in the task's leaf",
                  "write pids.max in the task's leaf before it runs"),
        "oci": ("no linux.resources.pids.limit",
                "linux.resources.pids.limit"),
        "docker": ("no --pids-limit",
                   "--pids-limit N"),
        "podman": ("no --pids-limit",
                   "--pids-limit N"),
        "nspawn": ("no TasksMax= property",
                   "--property=TasksMax=N"),
        "systemd-run": ("no TasksMax=",
                        "TasksMax=N"),
    },
    "descriptors": {
        GENERIC: ("the launcher leaves descriptors open across exec (a host directory, a socket, a "
                  "namespace)",
                  "close every descriptor but 0-2 before exec (close_range(2), or O_CLOEXEC everywhere)"),
        "bwrap": ("bwrap passes on every descriptor its caller left open",
                  "close them in the launcher before exec'ing bwrap (close_range(3, ~0U, 0); Python's "
                  "close_fds=True)"),
        "unshare": ("unshare(1) passes on every descriptor its caller left open",
                    "close them in the launcher before exec'ing unshare (close_range(2))"),
        "oci": ("a runc older than 1.1.12 leaks a host directory descriptor (CVE-2024-21626), or "
                "--preserve-fds",
                "runc >= 1.1.12, and no --preserve-fds"),
        "docker": ("a runc older than 1.1.12 under the engine (CVE-2024-21626)",
                   "runc >= 1.1.12"),
        "podman": ("--preserve-fds, or a runc older than 1.1.12 (CVE-2024-21626)",
                   "no --preserve-fds, and runc >= 1.1.12"),
        "firejail": ("--keep-fd",
                     "no --keep-fd (firejail then closes all but 0-2)"),
    },
    "secrets": {
        GENERIC: ("the sandbox's own process (its PID 1, a monitor) or a file the task can read holds the "
                  "launcher's secret",
                  "start the sandbox itself with an allowlisted environment (env -i), and hand the task no "
                  "file holding a secret"),
        "bwrap": ("bwrap itself, the sandbox's PID 1, keeps the environment it was started with: --clearenv"
                  " clears only the task's (/proc/1/environ)",
                  "start bwrap through env -i, and give the task its variables with --setenv"),
        "unshare": ("unshare(1) passes its environment through and shows the host's tree",
                    "start it through env -i, and keep secret files out of the task's tree"),
        "oci": ("process.env copied from the launcher, or a bind of a directory holding a secret",
                "process.env with only what the task needs; bind no directory holding a secret"),
        "docker": ("--env-file with the launcher's .env, or a volume holding a secret",
                   "--env NAME=VALUE for what the task needs only; no volume holding a secret"),
        "podman": ("--env-host, --env-file with the launcher's .env, or a volume holding a secret",
                   "--env NAME=VALUE for what the task needs only; no volume holding a secret"),
        "firejail": ("firejail passes its caller's environment to the task",
                     "start firejail through env -i (or --rmenv=NAME for one name)"),
        "systemd-run": ("--setenv of the launcher's variables, or PassEnvironment=",
                        "Environment= with only what the task needs"),
        "srt": ("srt passes its environment to the command, and the launcher's directory is readable",
                "start srt through env -i, and list the launcher's directory in filesystem.denyRead"),
        "codex": ("codex passes its environment to the command, and its helper (PID 1) keeps it",
                  'start codex with an allowlisted environment, and "none" for the launcher\'s directory'),
    },
    "kernel_interfaces": {
        GENERIC: ("/proc/sys (or /proc/sysrq-trigger, /sys, the host's /sys/fs/cgroup, its binfmt_misc) is "
                  "writable to a task that is root on the host",
                  "bind /proc/sys and /proc/sysrq-trigger read-only over the task's /proc, and /sys "
                  "read-only; a cgroupfs only of the task's own cgroup namespace, or none; no binfmt_misc "
                  "but a user namespace's own"),
        "bwrap": ("bwrap's --proc leaves /proc/sys writable to a root task (under --unshare-user it skips "
                  "its read-only cover); a --bind of /sys or /sys/fs/cgroup gives it the host's cgroups",
                  "--ro-bind /proc/sys /proc/sys (and /proc/sysrq-trigger) after --proc /proc; /sys only "
                  "with --ro-bind"),
        "unshare": ("--mount-proc leaves /proc/sys writable to a root task",
                    "bind /proc/sys read-only over itself in the new mount namespace"),
        "oci": ("linux.readonlyPaths without /proc/sys",
                "runc spec's linux.readonlyPaths (/proc/bus, /proc/fs, /proc/irq, /proc/sys, "
                "/proc/sysrq-trigger)"),
        "docker": ("--privileged, or --security-opt systempaths=unconfined, or a -v of /sys/fs/cgroup or "
                   "/proc/sys/fs/binfmt_misc",
                   "the engine's default read-only /proc/sys, and no volume of the host's kernel interfaces"),
        "podman": ("--privileged, or --security-opt unmask=, or a -v of /sys/fs/cgroup or "
                   "/proc/sys/fs/binfmt_misc",
                   "the engine's default read-only /proc/sys, and no volume of the host's kernel interfaces"),
        "systemd-run": ("no ProtectKernelTunables=, or no ProtectControlGroups= (ProtectKernelTunables= "
                        "leaves /sys/fs/cgroup read-write)",
                        "ProtectKernelTunables=yes ProtectControlGroups=yes"),
        "srt": ("srt mounts /proc after every bind: as root the task opens /proc/sys for writing",
                "no setting of srt's keeps it (measured): run it as an unprivileged user, or disclaim the "
                "promise in the profile"),
        "codex": ('codex\'s bwrap mounts a fresh /proc ("/proc/sys" = "read" changes nothing)',
                  "no setting of codex's keeps it (measured): run it as an unprivileged user, or disclaim "
                  "the promise in the profile"),
    },
    "devices": {
        GENERIC: ("the host's /dev, or a device node bound elsewhere, is visible",
                  "a minimal /dev of the task's own (null, zero, full, random, urandom, tty, ptmx, pts), "
                  "and no device bound anywhere else"),
        "bwrap": ("--dev-bind /dev /dev, or a --dev-bind of one node",
                  "--dev /dev, and no --dev-bind"),
        "unshare": ("unshare(1) leaves the host's /dev",
                    "mount a minimal /dev in the new mount namespace"),
        "oci": ("a node in linux.devices, or a bind of /dev",
                "no linux.devices beyond the runtime's defaults"),
        "docker": ("--device or --privileged",
                   "no --device, no --privileged"),
        "podman": ("--device or --privileged",
                   "no --device, no --privileged"),
        "firejail": ("without --private-dev the host's /dev is visible; with it dri, snd, video and usb "
                     "stay",
                     "--private-dev --no3d --nosound --novideo --nodvd --nou2f"),
        "systemd-run": ("no PrivateDevices=",
                        "PrivateDevices=yes"),
    },
    "host_sockets": {
        GENERIC: ("a host socket is reachable through the filesystem (the host's /run or /tmp, a bound "
                  "docker.sock): connect(2) needs write permission on the socket, not a writable mount",
                  "a tmpfs over /run and /tmp (or leave them out), and no daemon socket bound in"),
        "bwrap": ("--ro-bind / / keeps /run and /tmp, where the host's daemon sockets are",
                  "--tmpfs /run --tmpfs /tmp after --ro-bind / /, and no bind of a socket"),
        "oci": ("a bind mount of /run or of a socket",
                "bind no socket and no /run"),
        "docker": ("a volume of the engine's socket (-v /var/run/docker.sock) or of /run",
                   "no volume of a socket or of /run"),
        "podman": ("a volume of a socket or of /run",
                   "no volume of a socket or of /run"),
        "runsc": ("--host-uds=open, create or all",
                  "--host-uds=none (runsc's default)"),
        "systemd-run": ("the host's /run and /tmp are visible",
                        "PrivateTmp=yes and TemporaryFileSystem=/run:ro"),
        "srt": ("network.allowAllUnixSockets = true",
                "network.allowAllUnixSockets = false (srt's seccomp filter then refuses socket(AF_UNIX))"),
        "codex": ("codex's seccomp refuses connect(2) and sendto(2) but not sendmsg(2), and the host's "
                  "sockets stay in its read-only /",
                  '"none" for /run and /tmp in the permissions profile'),
    },
    "lifecycle": {
        GENERIC: ("nothing ties the sandbox to its launcher: a SIGKILLed launcher leaves the task running",
                  "a parent-death signal (PR_SET_PDEATHSIG) on the sandbox's init, or a supervisor that "
                  "kills it when the launcher goes"),
        "bwrap": ("no --die-with-parent",
                  "--die-with-parent"),
        "unshare": ("no --kill-child",
                    "--fork --kill-child"),
        "oci": ("runc run's container init outlives a SIGKILLed runc",
                "a guard that runs `runc delete --force ID` when the launcher dies"),
        "docker": ("the daemon, not the client, runs the container: a SIGKILLed docker run leaves it "
                   "running",
                   "docker run --name NAME, and a supervisor that runs `docker kill NAME` when the launcher"
                   " dies"),
        "podman": ("conmon, not podman run, supervises the container: a SIGKILLed podman run leaves it "
                   "running",
                   "podman run --name NAME, and a supervisor that runs `podman kill NAME` when the launcher"
                   " dies"),
        "systemd-run": ("the manager, not systemd-run, runs the unit: a SIGKILLed systemd-run --wait leaves"
                        " it running",
                        "a supervisor that runs `systemctl kill UNIT` when the launcher dies"),
        "codex": ("the codex CLI's node wrapper SIGKILLed leaves codex, codex-linux-sandbox and the task "
                  "running",
                  "no codex setting covers it: kill the launcher's whole process group"),
    },
    "terminal": {
        GENERIC: ("the task shares its launcher's controlling terminal, and TIOCSTI pushes input a shell "
                  "will run",
                  "start the task in a new session (setsid(2)) or give it a pseudo-terminal of its own; on "
                  "Linux >= 6.2, dev.tty.legacy_tiocsti=0 refuses TIOCSTI to everyone"),
        "bwrap": ("no --new-session (bwrap CVE-2017-5226)",
                  "--new-session"),
        "unshare": ("unshare(1) keeps the caller's session and terminal",
                    "start it under setsid --wait"),
        "oci": ("the caller's terminal passed through as the container's stdio",
                '"terminal": false with stdio that is not the caller\'s terminal, or the runtime under '
                'setsid --wait'),
        "docker": ("the caller's terminal handed in (a bind of /dev/tty, --device of a tty)",
                   "-t for a pseudo-terminal of the container's own; none of the caller's"),
        "podman": ("the caller's terminal handed in (a bind of /dev/tty, --device of a tty)",
                   "-t for a pseudo-terminal of the container's own; none of the caller's"),
        "firejail": ("firejail keeps the caller's controlling terminal (it flushes the input queue at exit "
                     "instead of calling setsid, CVE-2016-7545)",
                     "start firejail under setsid --wait, or dev.tty.legacy_tiocsti=0 (Linux >= 6.2)"),
        "nspawn": ("--console=pipe passes the caller's terminal on as it is",
                   "--console=interactive (a pseudo-terminal of the container's own)"),
    },
    "syscalls": {
        GENERIC: ("the task keeps CAP_SYS_ADMIN over its own mount namespace (the new mount API opens), "
                  "shares a pid namespace where it may ptrace a host process, or a door the profile "
                  "names is not in the sandbox's seccomp filter",
                  "drop every capability (or keep them only in a user namespace nested below the one "
                  "owning the mount namespace), a pid namespace of its own, and a seccomp filter that "
                  "refuses the doors [syscalls] names with the errno it names"),
        "bwrap": ("capabilities kept (--cap-add) where the task's user namespace owns its mount "
                  "namespace (no --disable-userns), or no --unshare-pid; bwrap installs no seccomp "
                  "filter of its own",
                  "--cap-drop ALL and --disable-userns, --unshare-pid, and --seccomp FD with a filter "
                  "for io_uring_setup, keyctl and socket(AF_VSOCK)"),
        "docker": ("--cap-add SYS_ADMIN, --privileged, or --security-opt seccomp=unconfined",
                   "no added capabilities, and docker's default seccomp profile (it refuses keyctl and "
                   "the new mount API)"),
        "podman": ("--cap-add SYS_ADMIN, --privileged, or --security-opt seccomp=unconfined",
                   "--cap-drop=all and podman's default seccomp profile"),
        "oci": ("CAP_SYS_ADMIN in process.capabilities, or no linux.seccomp in the bundle",
                "no CAP_SYS_ADMIN, and linux.seccomp refusing the doors the profile names"),
    },
}
