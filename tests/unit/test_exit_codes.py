"""rsprof.exit_codes: the numbers are the ones README's "Exit codes" table documents."""

from __future__ import annotations

import re
from pathlib import Path

from rsprof import exit_codes

README = Path(__file__).resolve().parents[2] / "README.md"


def test_codes_are_the_documented_ones() -> None:
    codes = {name: value for name, value in vars(exit_codes).items() if name.startswith("EXIT_")}
    assert codes == {"EXIT_OK": 0, "EXIT_ERROR": 1, "EXIT_USAGE": 2, "EXIT_NOT_FOUND": 3,
                     "EXIT_PERMISSION": 4, "EXIT_HEAP_REFUSED": 5, "EXIT_DATABASE": 6,
                     "EXIT_INTERRUPTED": 130}
    text = README.read_text()
    table = text[text.index("### Exit codes"):]
    table = table[:table.index("\n\n", table.index("| code"))]
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert documented == set(codes.values())
