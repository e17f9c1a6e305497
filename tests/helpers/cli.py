"""One way for the tests to start a command-line program of the project as a user would."""

import os
import subprocess
import sys

# A small run on a tiny model: the paper probe cut to 32 sequences of 64 tokens, float32, no W&B
SMALL_RUN = [
    "probe=paper",
    "probe.n_sequences=32",
    "probe.seq_len=64",
    "probe.vocab_low=10",
    "probe.vocab_high=500",
    "probe.batch_size=8",
    "model.dtype=float32",
    "wandb.mode=disabled",
]


def run_cli(
    *args, module: str = "emergence", env: dict | None = None, timeout: float = 600, **popen
) -> subprocess.CompletedProcess:
    """``python -m <module> <args>`` in a fresh process; text output captured."""
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        **popen,
    )


def run_fresh(code: str) -> None:
    """Run ``code`` in a fresh interpreter (nothing imported yet) and fail with its stderr if it fails."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def start_cli(*args, module: str = "emergence", env: dict | None = None) -> subprocess.Popen:
    """The same, started in the background with stderr (where the run's lines go) as a text pipe."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""
