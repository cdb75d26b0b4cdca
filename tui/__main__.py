"""`python -m rsprof.tui FILE [--live]`: the TUI without the rsprof CLI."""

from __future__ import annotations

import argparse

from . import run_tui


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m rsprof.tui", description=__doc__)
    parser.add_argument("file")
    parser.add_argument("--live", action="store_true", help="a recorder writes the file now")
    args = parser.parse_args()
    return run_tui(args.file, live=args.live)


if __name__ == "__main__":
    raise SystemExit(main())
