"""`Unavailable`, in a module of its own: every adapter raises it and the registry (`__init__`) loads
the adapters, so the adapters import it from here, not from the registry (no import circle)."""


class Unavailable(Exception):
    """This adapter cannot run on this host or as this user: the reason, one line."""
