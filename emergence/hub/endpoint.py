"""Talking to the Hugging Face Hub (or the mirror ``HF_ENDPOINT`` names): which endpoint, whether
it answers, and whether a failure was the connection going away. No torch: a download's child
process (``prefetch``) asks it too."""

from __future__ import annotations

import socket


def hub_endpoint() -> str:
    """The Hub the client talks to: https://huggingface.co, or the mirror ``HF_ENDPOINT`` names."""
    from huggingface_hub import constants

    return constants.ENDPOINT


def hub_reachable(timeout: float = 5.0) -> bool:
    """One quick connection to the Hub endpoint, instead of minutes of retries when there is no route."""
    from urllib.parse import urlparse

    url = urlparse(hub_endpoint())
    port = url.port or (80 if url.scheme == "http" else 443)  # a mirror at http://host listens on 80
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def connection_lost(err: BaseException) -> bool:
    """Whether ``err`` (or what caused it) is a connection refused, reset or timed out: the
    server went away. transformers rewords such a failure as a file the repo lacks, and the
    HTTP client's own exception types differ between huggingface_hub releases; the OS-level
    error at the bottom of the chain does not."""
    return caused_by(err, (ConnectionError, TimeoutError))


def caused_by(err: BaseException | None, types: tuple) -> bool:
    """Whether ``err`` or an error in its chain (cause, else context) is one of ``types``."""
    while err is not None:
        if isinstance(err, types):
            return True
        err = err.__cause__ or err.__context__
    return False
