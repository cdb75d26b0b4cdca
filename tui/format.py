"""Text formatting shared by the TUI's widgets (pure functions, no Textual)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache

from rich.cells import cell_len, set_cell_size

SPARK_CHARS = "▁▂▃▄▅▆▇█"


def sparkline(
    values: Sequence[float], width: int = 12, *, from_zero: bool = True, top: float | None = None
) -> str:
    """One cell per value (the last `width`).

    `from_zero`: bars scale from 0 to the largest value, or to `top` when given (one scale
    shared by a whole column). Otherwise they scale from the smallest to the largest value,
    so slow growth (a leak) shows as a ramp; a flat series is a row of middle bars (all
    zero: lowest bars).
    """
    values = list(values)[-width:]
    if top is None:
        top = max(values, default=0)
    else:
        from_zero = True
    if top <= 0:
        return SPARK_CHARS[0] * len(values)
    bottom = 0.0 if from_zero else min(values)
    last = len(SPARK_CHARS) - 1
    if top == bottom:
        return SPARK_CHARS[last // 2] * len(values)
    span = top - bottom
    return "".join(
        SPARK_CHARS[max(0, min(last, round((v - bottom) / span * last)))] for v in values
    )


def fmt_pct(value: float) -> str:
    return f"{value:.2f}%" if value < 99.995 else "100.0%"


def fmt_bytes(n: float) -> str:
    """Binary units, at most 10 characters: `512 B`, `1.5 KiB`, `960.0 KiB`, `1.0 GiB`."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n < 1024:
        return f"{sign}{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.1f} {unit}"
    raise AssertionError("unreachable")


def bytes_unit(top: float) -> tuple[str, float]:
    """The unit to plot values up to `top` bytes in, and its size."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if top >= size:
            return unit, float(size)
    return "B", 1.0


def fmt_seconds(seconds: float) -> str:
    """A duration as the Wall view states time: `850 µs`, `12.3 ms`, `4.56 s`."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def fmt_count(n: int) -> str:
    """`1,924`, then `12.3M` / `4.5G` once it gets too wide for a column."""
    if n < 10_000_000:
        return f"{n:,}"
    if n < 10_000_000_000:
        return f"{n / 1e6:.1f}M"
    return f"{n / 1e9:.1f}G"


def fmt_elapsed(ms: float) -> str:
    """`HH:MM:SS`; days are added in front when needed (`2d 03:04:05`)."""
    total = max(0, int(ms // 1000))
    days, rest = divmod(total, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    clock = f"{h:02d}:{m:02d}:{s:02d}"
    return f"{days}d {clock}" if days else clock


def fmt_offset(seconds: float) -> str:
    """A chart axis label: `45s`, `12:05`, `1:02:03`."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def fit_end(text: str, width: int) -> str:
    """Pads or cuts `text` to `width` cells, cutting at the end with `…`."""
    if width <= 0:
        return ""
    if cell_len(text) <= width:
        return set_cell_size(text, width)
    return set_cell_size(text, width - 1) + "…"


def fit_start(text: str, width: int) -> str:
    """Pads or cuts `text` to `width` cells, cutting at the start (keeps a path's file name)."""
    if width <= 0:
        return ""
    if cell_len(text) <= width:
        return set_cell_size(text, width)
    tail = text[-(width - 1) :] if width > 1 else ""
    while cell_len(tail) > width - 1:
        tail = tail[1:]
    return set_cell_size("…" + tail, width)


def align_right(text: str, width: int) -> str:
    if cell_len(text) >= width:
        return fit_end(text, width)
    return " " * (width - cell_len(text)) + text


# ---- function names for display ----------------------------------------------------------

# C++ operator names, longest first: their `<`, `>`, `(`, `[` open and close nothing
# (`operator<`, `operator->`, `operator()`), and `operator-<int>` is `operator-` with a
# template argument list.
_OPERATORS = sorted(("<=>", "<<=", ">>=", "->*", "()", "[]", "<<", ">>", "<=", ">=", "==",
                     "!=", "&&", "||", "++", "--", "+=", "-=", "*=", "/=", "%=", "&=", "|=",
                     "^=", "->", "<", ">", "+", "-", "*", "/", "%", "&", "|", "^", "~", "!",
                     "=", ","), key=len, reverse=True)


# A word of a name that is `operator`, `ns::operator<`: the name starts there.
_OPERATOR_TOKEN = re.compile(r"(?:^|::)operator[^\w\s]*$")


def _scan(name: str) -> list[int]:
    """The bracket depth before each character of a C++/Rust name, with the characters of
    an operator's name (`operator<`, `operator()`) at the depth around them."""
    depths = [0] * len(name)
    depth = 0
    i = 0
    while i < len(name):
        if name.startswith("operator", i) and (i == 0 or not _is_ident(name[i - 1])):
            end = i + len("operator")
            symbol = next((op for op in _OPERATORS if name.startswith(op, end)), "")
            for k in range(i, end + len(symbol)):
                depths[k] = depth
            i = end + len(symbol)
            continue
        char = name[i]
        if char in "<([{":
            depths[i] = depth
            depth += 1
        elif char in ">)]}":
            depth = max(depth - 1, 0)
            depths[i] = depth
        else:
            depths[i] = depth
        i += 1
    return depths


def _is_ident(char: str) -> bool:
    return char.isalnum() or char == "_"


def _strip_parameters(name: str) -> str:
    """`ns::f(int, char) const` -> `ns::f`; `operator()` stays itself."""
    text = name
    for qualifier in (" const", " volatile", " &&", " &", " noexcept"):
        while text.endswith(qualifier):
            text = text[: -len(qualifier)]
    if not text.endswith(")"):
        return name
    depths = _scan(text)
    close = len(text) - 1
    open_at = next((i for i in range(close - 1, -1, -1)
                    if text[i] == "(" and depths[i] == depths[close]), -1)
    if open_at <= 0 or text[:open_at].endswith("operator"):
        return name
    return text[:open_at]


def _drop_return_type(name: str) -> str:
    """`void std::sort<…>` -> `std::sort<…>`; `operator delete` keeps its words."""
    depths = _scan(name)
    tokens: list[str] = []
    start = 0
    for i, char in enumerate(name):
        if char == " " and depths[i] == 0:
            tokens.append(name[start:i])
            start = i + 1
    tokens.append(name[start:])
    if len(tokens) == 1:
        return name
    for k in range(len(tokens) - 1, -1, -1):
        if _OPERATOR_TOKEN.search(tokens[k]):
            return " ".join(tokens[k:])
    return tokens[-1]


def _collapse_templates(name: str) -> str:
    """`std::sort<__normal_iterator<int*>, …>` -> `std::sort<…>` (a leading `<T as Trait>`
    and Python's `<module>` are names, not argument lists)."""
    depths = _scan(name)
    out: list[str] = []
    i = 0
    while i < len(name):
        char = name[i]
        opens = i + 1 < len(name) and depths[i + 1] == depths[i] + 1  # not `operator<`
        if char == "<" and depths[i] == 0 and i > 0 and opens and name[i - 1] != ":":
            close = next((j for j in range(i + 1, len(name))
                          if name[j] == ">" and depths[j] == 0), -1)
            if close < 0:
                out.append(name[i:])
                break
            out.append("<…>")
            i = close + 1
            continue
        out.append(char)
        i += 1
    return "".join(out)


# A name with none of these is shown as it is (C functions, `ns::f`, Python's): no scan.
_PLAIN = re.compile(r"[^<>()\[\]{} @]*")


@lru_cache(maxsize=1 << 16)
def short_function(name: str) -> str:
    """A function name as `go tool pprof` shows it: no parameter list, no return type,
    template arguments as `<…>` (`std::sort<…>`, `shop::Basket::total`,
    `main::{lambda(int, int)#2}::operator()`); a `@plt` or version suffix is kept. Display
    only: a profile keys functions by their full names.

    Cached: the TUI names the same functions at every refresh (scanning 10 000 names took
    0.3-0.4 s of each rebuild of the table)."""
    if not name or name[0] == "[" or _PLAIN.fullmatch(name):
        return name
    base, at, suffix = name, "", ""
    depths = _scan(name)
    tail = name.rfind("@")
    if tail > 0 and depths[tail] == 0:
        base, at, suffix = name[:tail], "@", name[tail + 1:]
        if base.endswith("@"):  # `memcpy@@GLIBC_2.14`
            base, at = base[:-1], "@@"
    bare = _strip_parameters(base)
    # A return type comes before a C++ function's name only: `all samples` is a name.
    if bare != base or "::" in bare:
        bare = _drop_return_type(bare)
    short = _collapse_templates(bare)
    return f"{short}{at}{suffix}" if short else name


@lru_cache(maxsize=1 << 12)
def _with_templates(name: str) -> str:
    return _drop_return_type(_strip_parameters(name))


def short_functions(names: Iterable[str]) -> dict[str, str]:
    """Display names for names shown together: each shortened (short_function), except
    that two different functions never look the same: where they would, they keep their
    template arguments, and if that is not enough their full names."""
    names = set(names)
    shown = {name: short_function(name) for name in names}
    for fallback in (_with_templates, lambda n: n):
        seen: dict[str, set[str]] = {}
        for name, text in shown.items():
            seen.setdefault(text, set()).add(name)
        clashing = [name for group in seen.values() if len(group) > 1 for name in group]
        if not clashing:
            break
        for name in clashing:
            shown[name] = fallback(name)
    return shown
