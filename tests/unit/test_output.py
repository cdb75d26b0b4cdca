"""rsprof.output: what `rsprof run` keeps of its program's output under the TUI: the chunks
read (bounded), handed to the profile once each, and the last lines printed at the end,
each stream to its own, whole lines in the order written. Synthetic chunks, no pty read."""

from __future__ import annotations

import pytest

from rsprof.output import MAX_KEPT_BYTES, TAIL_LINES, Chunk, OutputCapture


def capture(*chunks: tuple[str, bytes]) -> OutputCapture:
    found = OutputCapture(masters={}, slaves={})
    found.chunks = [Chunk(i, stream, data) for i, (stream, data) in enumerate(chunks)]
    return found


@pytest.mark.parametrize(("chunks", "lines", "out", "err", "said"), [
    pytest.param([("stdout", b"a\nb\n")], None, b"a\nb\n", b"", False, id="whole-lines"),
    pytest.param([("stdout", b"par"), ("stderr", b"E\n"), ("stdout", b"tial\nend")], None,
                 b"partial\nend", b"E\n", False, id="a-line-in-pieces-stays-one"),
    pytest.param([("stdout", b"1\n2\n3\n"), ("stderr", b"e\n")], 2, b"3\n", b"e\n", True,
                 id="the-last-lines-of-both"),
    pytest.param([("stdout", b"\n\n")], None, b"\n\n", b"", False, id="empty-lines-count"),
    pytest.param([], None, b"", b"", False, id="nothing"),
])
def test_print_tail(capsysbinary: pytest.CaptureFixture[bytes], chunks: list[tuple[str, bytes]],
                    lines: int | None, out: bytes, err: bytes, said: bool) -> None:
    capture(*chunks).print_tail(lines)
    captured = capsysbinary.readouterr()
    assert captured.out == out
    header = b"rsprof: the program's last "
    assert captured.err.startswith(header) is said
    assert captured.err.split(b"\n", 1)[-1] == err if said else captured.err == err


def test_the_default_tail() -> None:
    assert TAIL_LINES == 20


def test_the_tail_says_how_many_were_kept(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    capture(*[("stdout", f"{i}\n".encode()) for i in range(30)]).print_tail()
    captured = capsysbinary.readouterr()
    assert captured.out == b"".join(f"{i}\n".encode() for i in range(10, 30))
    assert b"last 20 lines of output (30 in the profile's target_output table" in captured.err


def test_dropped_bytes_are_said(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    found = capture(("stdout", b"x\n"))
    found.dropped_bytes = 123
    found.print_tail()
    assert b"123 bytes of the program's output were not kept (over 64 MiB)" in \
        capsysbinary.readouterr().err
    assert MAX_KEPT_BYTES == 64 << 20


def test_save_hands_each_chunk_over_once() -> None:
    found = capture(("stdout", b"a"), ("stderr", b"b"))
    saved: list[list[tuple[int, str, bytes]]] = []
    found.save(saved.append)
    found.chunks.append(Chunk(9, "stdout", b"c"))
    found.save(saved.append)
    found.save(saved.append)
    assert saved == [[(0, "stdout", b"a"), (1, "stderr", b"b")], [(9, "stdout", b"c")], []]
