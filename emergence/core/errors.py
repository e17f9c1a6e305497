"""The errors the user can act on, below every module that raises them (no Hydra, no torch)."""


class UsageError(Exception):
    """A bad input the user can fix; its message is the one line we print."""


def invalid(field_name: str, value, allowed: str) -> UsageError:
    """The one line for a setting with a value it cannot take: the setting, the value, what it can be."""
    return UsageError(f"{field_name}={value!r} is invalid: {allowed}")
