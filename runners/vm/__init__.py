"""VM mode: a Debian kernel under qemu over the host's root (docs/vm-mode.md)."""
