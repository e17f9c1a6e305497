"""The errors the user can act on, below every module that raises them (no Hydra, no torch)."""


class UsageError(Exception):
    """A bad input the user can fix; its message is the one line we print."""
