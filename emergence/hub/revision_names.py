"""How a checkpoint's name gives its step and tokens: a family's ``revision_pattern``, or the generic
``step{N}`` / ``step{N}-tokens{M}B`` (a Hub branch, a local series' folder)."""

from __future__ import annotations

import re

# What a name without a family pattern is read as: step{N} or step{N}-tokens{M}B.
GENERIC_PATTERN = r"step(?P<step>\d+)(?:-tokens(?P<tokens>\d+)B)?"


def parse_revision_name(name: str, pattern: str | None, tokens_per_step: int | None) -> tuple[int | None, int | None]:
    """A branch name -> (step, tokens) by the family's pattern; (None, None) if it does not match.
    Tokens come from the name's ``tokens`` group (billions) if it has one, else step x tokens_per_step."""
    m = re.fullmatch(pattern or GENERIC_PATTERN, name)
    if not m:
        return None, None
    step = int(m.group("step"))
    if m.groupdict().get("tokens") is not None:
        return step, int(m.group("tokens")) * 10**9
    return step, step * tokens_per_step if tokens_per_step else None
