"""The errors the user can act on, below every module that raises them (no Hydra, no torch)."""

import argparse
import sys
from typing import NoReturn


class UsageError(Exception):
    """A bad input the user can fix; its message is the one line we print."""


def invalid(field_name: str, value, allowed: str) -> UsageError:
    """The one line for a setting with a value it cannot take: the setting, the value, what it can be."""
    return UsageError(f"{field_name}={value!r} is invalid: {allowed}")


def first_line(err: BaseException) -> str:
    """An error's message in one line (its type where it has none: an EOFError)."""
    return (str(err).splitlines() or [type(err).__name__])[0]


class CommandParser(argparse.ArgumentParser):
    """The sibling commands' argument parser: a bad argument ends as any bad input does, in one line
    naming it (``error: <prog>: argument --x: ...; see <prog> --help``) and exit 2, not argparse's
    usage block above the message."""

    def __init__(self, prog: str, description: str | None):
        super().__init__(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"error: {self.prog}: {' '.join(message.split())}; see {self.prog} --help\n")
        sys.exit(2)

    def check_output_folder(self, path, holds: str) -> None:
        """``--out``, where a file is in its place: one line now, not a traceback once the work is done."""
        if path is not None and path.exists() and not path.is_dir():
            self.error(f"--out {path} is a file: give a folder for {holds}")
