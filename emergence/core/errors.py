"""The errors the user can act on, below every module that raises them (no Hydra, no torch)."""


class UsageError(Exception):
    """A bad input the user can fix; its message is the one line we print."""


def invalid(field_name: str, value, allowed: str) -> UsageError:
    """The one line for a setting with a value it cannot take: the setting, the value, what it can be."""
    return UsageError(f"{field_name}={value!r} is invalid: {allowed}")


def first_line(err: BaseException) -> str:
    """An error's message in one line (its type where it has none: an EOFError)."""
    return (str(err).splitlines() or [type(err).__name__])[0]
