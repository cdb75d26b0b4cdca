"""Text formatting shared by the TUI's widgets (pure functions, no Textual)."""

from __future__ import annotations

from collections.abc import Sequence

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
