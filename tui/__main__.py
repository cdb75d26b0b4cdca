"""`python -m rsprof.tui FILE [--live] [--pid PID]`: the TUI without the rsprof CLI."""

from __future__ import annotations

import argparse

from . import run_tui


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m rsprof.tui", description=__doc__)
    parser.add_argument("file")
    parser.add_argument("--live", action="store_true", help="a recorder writes the file now")
    parser.add_argument("--pid", type=int, help="target PID (live mode: CPU, RSS, exit)")
    args = parser.parse_args()
    return run_tui(args.file, live=args.live, target_pid=args.pid)


if __name__ == "__main__":
    raise SystemExit(main())
