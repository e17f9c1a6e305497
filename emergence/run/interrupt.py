"""Ctrl-C as a run sees it. Python raises KeyboardInterrupt wherever the main thread is; raised
inside a finalizer it is only printed and the run goes on, so the run asks ``received``, set by
the handler itself, whether it was interrupted. (A module of its own: a launcher that pickles
the job function, as submitit does, pickles a module by name, not the lock inside the Event.)"""

import signal
import threading

received = threading.Event()


def on_sigint(signum, frame) -> None:
    received.set()
    raise KeyboardInterrupt


def install() -> None:
    """Handle Ctrl-C in this process with ``on_sigint`` (from the main thread)."""
    received.clear()
    signal.signal(signal.SIGINT, on_sigint)
