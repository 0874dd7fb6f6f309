"""Print the README's model table from the registry; ``--check README.md`` exits 1 when the
README's table (between the ``<!-- models -->`` markers) differs, ``--write README.md`` updates it.

    python scripts/model_table.py --write README.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from colossal_jax.cli import model_table  # noqa: E402

BEGIN, END = "<!-- models -->", "<!-- /models -->"


def replaced(text: str, table: str) -> str:
    """``text`` with the part between the markers replaced by ``table``."""
    head, found, rest = text.partition(BEGIN)
    if not found or END not in rest:
        raise SystemExit(f"no {BEGIN} ... {END} markers")
    return f"{head}{BEGIN}\n{table}\n{END}{rest.partition(END)[2]}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", metavar="README", help="exit 1 if its table is not the registry's")
    p.add_argument("--write", metavar="README", help="replace its table with the registry's")
    args = p.parse_args(argv)
    table = model_table()
    if args.check or args.write:
        path = Path(args.check or args.write)
        text = path.read_text()
        new = replaced(text, table)
        if args.check:
            if new != text:
                print(
                    f"{path}: the model table differs from the registry; run --write",
                    file=sys.stderr,
                )
                return 1
            return 0
        path.write_text(new)
        return 0
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
