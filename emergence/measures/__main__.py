"""``python -m emergence.measures [--check] DOC``: the table of the registry's per-head columns in DOC
(docs/outputs.md), between its ``TABLE_START`` and ``TABLE_END`` lines, written from what each measure
declares (``Column.meaning``); ``--check`` exits 1 where DOC's table differs, writing nothing."""

from __future__ import annotations

import sys
from pathlib import Path

from emergence.core.atomic import atomic_write_text
from emergence.core.errors import CommandParser
from emergence.measures import REGISTRY

TABLE_START = "<!-- measures' columns: written by python -m emergence.measures docs/outputs.md -->"
TABLE_END = "<!-- end of the measures' columns -->"


def columns_table() -> str:
    """The registry's per-head columns as a markdown table: column, measure, meaning."""
    lines = ["| column | measure | meaning |", "|---|---|---|"]
    for measure in REGISTRY.values():
        for c in measure.columns:
            lines.append(f"| `{c.name}` | [`{measure.name}`](measures.md) | {c.meaning.replace('|', chr(92) + '|')} |")
    return "\n".join(lines)


def with_table(text: str) -> str:
    """``text`` with the lines between its markers replaced by ``columns_table``."""
    head, start, rest = text.partition(TABLE_START)
    _, end, tail = rest.partition(TABLE_END)
    if not start or not end:
        raise ValueError(f"no {TABLE_START!r} ... {TABLE_END!r} block")
    return f"{head}{TABLE_START}\n{columns_table()}\n{TABLE_END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser("python -m emergence.measures", __doc__)
    parser.add_argument("doc", type=Path)
    parser.add_argument("--check", action="store_true", help="exit 1 where the table differs; write nothing")
    args = parser.parse_args(argv)
    try:
        text = args.doc.read_text()
        written = with_table(text)
    except (OSError, ValueError) as err:
        print(f"error: {args.doc}: {err}", file=sys.stderr)
        return 2
    if args.check:
        if written != text:
            print(f"{args.doc}: the measures' columns table is stale: run python -m emergence.measures {args.doc}")
            return 1
        return 0
    atomic_write_text(args.doc, written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
