"""errno names, the way every layer reports an OSError: "EACCES", never strerror's text, which is
localised and reworded between libc releases.

The programs that run inside a task or a trial under `python3 -I -S` (conformance/inside.py,
probes/_inside_ladder.py, processes/guardian.py, probes/sandboxed.py's TRIAL) import nothing of ours and
keep one-line copies of their own."""

from __future__ import annotations

import errno


def errname(e: OSError) -> str:
    """`e`'s errno name, or the number as text when errno(3) has no name for it."""
    return errno.errorcode.get(e.errno or 0, str(e.errno))
