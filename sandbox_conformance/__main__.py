"""`python -m sandbox_conformance ARGS`: the console script, for a process that has an interpreter
but not our script on PATH (the standby fallback, a container, a guest)."""

from sandbox_conformance.commands.cli import main

raise SystemExit(main())
