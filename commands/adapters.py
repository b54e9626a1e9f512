"""`sandbox-conformance adapters`: the adapters for sandboxes this project did not write, and what
`witness --adapter NAME` would run (the same as
`python -m sandbox_conformance.conformance.adapters`, from anywhere)."""

from __future__ import annotations

import argparse
import pwd
import shlex

from sandbox_conformance.conformance import adapters
from sandbox_conformance.processes.exits import Refusal, UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "what",
        nargs="?",
        default="list",
        choices=("list", "profile", "launcher", "args"),
        help="list (default), or one adapter's profile file, launcher prefix or witness args",
    )
    p.add_argument("name", nargs="?", help="the adapter, for profile, launcher and args")
    p.add_argument("--as-user", metavar="NAME", help="the user the witness will launch tasks as")


def main(args: argparse.Namespace) -> int:
    if args.as_user is not None:
        # Only that the user exists: what this prints may be meant for a root shell elsewhere, so not
        # witness's "needs root" (processes/exits.py check_as_user). A typo was a listing, exit 0.
        try:
            pwd.getpwnam(args.as_user)
        except KeyError:
            raise UsageError(f"--as-user: no such user {args.as_user!r}") from None
    if args.what == "list":
        for ad in adapters.ADAPTERS.values():
            print(f"{ad.name}\t{ad.summary}")
        return 0
    if args.name is None:
        raise UsageError(f"{args.what}: which adapter? ({', '.join(adapters.ADAPTERS)})")
    try:
        r = adapters.resolve(args.name, as_user=args.as_user)
    except KeyError as e:
        raise UsageError(str(e.args[0])) from None
    except adapters.Unavailable as e:
        raise Refusal(f"adapter {args.name}: not tested: {e}") from None
    witness = r.witness_args() + (["--as-user", args.as_user] if args.as_user else [])
    print({"profile": str(r.profile), "launcher": r.launcher, "args": shlex.join(witness)}[args.what])
    return 0
