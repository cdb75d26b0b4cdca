"""Python thread names (collector/pythreads.py): the chain sys.modules -> threading._active
-> Thread.__dict__["_name"] on synthetic interpreter memory for each version's layout, then
real interpreters recorded by rsprof (3.11, 3.12, 3.13), compared with what the program
says its threads are and with `py-spy dump`."""

from __future__ import annotations

import asyncio
import sqlite3
import struct
from pathlib import Path

import pytest
from rsprof.collector.pyframes import LAYOUTS
from rsprof.collector.pythreads import MAX_ENTRIES, ThreadNames
from rsprof.storage.live import ThreadInfo
from rsprof.storage.writer import Checkpoint, ProfileWriter
from rsprof.tui.screens import ThreadPicker
from textual.app import App
from textual.widgets import OptionList

# -- synthetic interpreter memory ---------------------------------------------------------

DICT_TYPE, LONG_TYPE, UNICODE_TYPE = 0x7000_0000_1000, 0x7000_0000_2000, 0x7000_0000_3000
RUNTIME = 0x5000_0000


class Image:
    """A fake target: objects laid out as CPython 3.`minor` lays them out, read through
    the same three calls ThreadNames makes on a PyFrameReader. Strings are kept by address
    (their layout is the C reader's business, tested in test_pyframes.py)."""

    def __init__(self, minor: int) -> None:
        self.minor = minor
        self.off = LAYOUTS[(3, minor)]
        self.base = 0x1000_0000
        self.memory = bytearray(1 << 20)
        self.top = 64
        self.strings: dict[int, str] = {}
        self.idents: list[tuple[int, int]] = []  # (native tid, ident) thread states
        self.string_reads = 0
        self.gone = False
        self.version = 1
        self.interp = self.alloc(self.off["interp_modules"] + 8)
        self.modules = self.new_dict({})
        self.put(self.interp + self.off["interp_modules"], self.modules)

    # memory
    def alloc(self, size: int) -> int:
        address = self.base + self.top
        self.top += (size + 15) & ~15
        assert self.top <= len(self.memory)
        return address

    def put(self, address: int, value: int, fmt: str = "<Q") -> None:
        struct.pack_into(fmt, self.memory, address - self.base, value)

    def get(self, address: int) -> int:
        return int(struct.unpack_from("<Q", self.memory, address - self.base)[0])

    # the Memory protocol
    def read(self, address: int, size: int) -> bytes | None:
        assert 0 < address and address + size <= 1 << 64  # what PyFrameReader.read takes
        if address == RUNTIME + self.off["runtime_interpreters_head"] and size == 8:
            return struct.pack("<Q", self.interp)
        start = address - self.base
        if start < 0 or start + size > len(self.memory):
            return None
        return bytes(self.memory[start:start + size])

    def string(self, address: int, max: int = 1024) -> str | None:
        self.string_reads += 1
        text = self.strings.get(address)
        return text if text is not None and len(text) <= max else None

    def thread_idents(self) -> list[tuple[int, int]]:
        if self.gone:
            raise ProcessLookupError
        return list(self.idents)

    # objects
    def new_str(self, text: str) -> int:
        address = self.alloc(max(96, self.off["unicode_ascii_data"] + len(text) + 1))
        self.set_str(address, text)
        return address

    def set_str(self, address: int, text: str) -> None:
        """The str object at `address` holds `text` now (its memory reused)."""
        self.strings[address] = text
        self.put(address + 8, UNICODE_TYPE)
        self.put(address + self.off["unicode_length"], len(text), "<q")
        start = address - self.base + self.off["unicode_ascii_data"]
        self.memory[start:start + len(text) + 1] = text.encode() + b"\0"

    def new_int(self, value: int) -> int:
        address = self.alloc(self.off["long_digits"] + 12)
        self.put(address + 8, LONG_TYPE)
        digits = []
        while value:
            digits.append(value & (1 << 30) - 1)
            value >>= 30
        size = len(digits) << 3 if self.minor >= 12 else len(digits)
        if self.minor >= 12 and not digits:
            size = 1  # zero
        self.put(address + self.off["long_size"], size, "<q")
        for i, digit in enumerate(digits):
            self.put(address + self.off["long_digits"] + 4 * i, digit, "<I")
        return address

    def new_keys(self, entries: list[tuple[int, int, int]], general: bool) -> int:
        log2_size = max(3, (len(entries) * 3 // 2).bit_length())
        width = 24 if general else 16
        address = self.alloc(self.off["dictkeys_indices"] + (1 << log2_size)
                             + width * len(entries))
        self.put(address + self.off["dictkeys_log2_size"], log2_size, "<B")
        self.put(address + self.off["dictkeys_log2_index_bytes"], log2_size, "<B")
        self.put(address + self.off["dictkeys_kind"], 0 if general else 1, "<B")
        self.put(address + self.off["dictkeys_nentries"], len(entries), "<q")
        start = address + self.off["dictkeys_indices"] + (1 << log2_size)
        for i, (key, value, hash_) in enumerate(entries):
            if general:
                struct.pack_into("<3Q", self.memory, start - self.base + 24 * i, hash_, key, value)
            else:
                struct.pack_into("<2Q", self.memory, start - self.base + 16 * i, key, value)
        return address

    def new_dict(self, items: dict[int, int], general: bool = False,
                 hashes: dict[int, int] | None = None) -> int:
        address = self.alloc(self.off["dict_values"] + 8)
        self.put(address + 8, DICT_TYPE)
        self.set_dict(address, items, general, hashes)
        return address

    def set_dict(self, address: int, items: dict[int, int], general: bool = False,
                 hashes: dict[int, int] | None = None) -> None:
        entries = [(k, v, (hashes or {}).get(k, 0)) for k, v in items.items()]
        self.put(address + self.off["dict_used"], len(items), "<q")
        self.version += 1
        self.put(address + self.off["dict_version"], self.version)
        self.put(address + self.off["dict_keys"], self.new_keys(entries, general))
        self.put(address + self.off["dict_values"], 0)

    def module(self, name: str, globals_: dict[int, int]) -> int:
        address = self.alloc(self.off["module_dict"] + 8)
        self.put(address + self.off["module_dict"], self.new_dict(globals_))
        items = self.dict_items(self.modules)
        items[self.new_str(name)] = address
        self.set_dict(self.modules, items)
        return address

    def dict_items(self, address: int) -> dict[int, int]:
        keys = self.get(address + self.off["dict_keys"])
        log2 = self.memory[keys - self.base + self.off["dictkeys_log2_index_bytes"]]
        n = self.get(keys + self.off["dictkeys_nentries"])
        start = keys + self.off["dictkeys_indices"] + (1 << log2)
        return {self.get(start + 16 * i): self.get(start + 16 * i + 8) for i in range(n)}

    def thread_type(self, flags: int, cached_keys: int = 0) -> int:
        address = self.alloc(self.off["heaptype_cached_keys"] + 8)
        self.put(address + self.off["type_flags"], flags)
        self.put(address + self.off["heaptype_cached_keys"], cached_keys)
        return address

    def thread(self, type_: int, attrs: dict[int, int], *, split: bool) -> int:
        """A Thread object: its instance dict materialized, or (split) the type's shared
        keys with the object's own values, where this version keeps them."""
        block = self.alloc(32 + 16 + 8 + 8 * len(attrs))
        obj = block + 32
        self.put(obj + 8, type_)
        if not split:
            self.put(obj - 24, self.new_dict(attrs))
            return obj
        keys = self.get(type_ + self.off["heaptype_cached_keys"])
        values = self.alloc(8 + 8 * len(attrs)) if self.minor != 13 else obj + 16
        if self.minor == 11:
            self.put(obj - 32, values)
        elif self.minor == 12:
            self.put(obj - 24, values - 1)  # tagged: odd
        else:
            self.put(values + 3, 1, "<B")  # valid
        start = keys + self.off["dictkeys_indices"] + (
            1 << self.memory[keys - self.base + self.off["dictkeys_log2_index_bytes"]])
        n = self.get(keys + self.off["dictkeys_nentries"])
        order = [self.get(start + 16 * i) for i in range(n)]
        for key, value in attrs.items():
            self.put(values + self.off["dictvalues_values"] + 8 * order.index(key), value)
        return obj

    def reader(self) -> ThreadNames:
        return ThreadNames(self, (3, self.minor, 0), self.off, RUNTIME, DICT_TYPE, LONG_TYPE)


MANAGED, INLINE = 1 << 4, 1 << 2


def _threading(image: Image, threads: dict[int, int]) -> tuple[int, int]:
    """Imports a threading module whose _active is {ident: Thread}; returns (module,
    _active)."""
    active = image.new_dict({image.new_int(i): t for i, t in threads.items()}, general=True,
                            hashes=None)
    module = image.module("threading", {image.new_str("_limbo"): image.new_dict({}),
                                        image.new_str("_active"): active})
    return module, active


def _named(image: Image, split: bool) -> tuple[int, dict[str, int]]:
    """A Thread type (its shared keys) and the interned attribute names."""
    keys = {name: image.new_str(name) for name in ("_target", "_name", "_args", "_ident")}
    shared = image.new_keys([(k, 0, 0) for k in keys.values()], general=False)
    flags = MANAGED | (INLINE if image.minor == 13 and split else 0)
    return image.thread_type(flags, shared), keys


@pytest.mark.parametrize("minor", [11, 12, 13])
@pytest.mark.parametrize("split", [False, True], ids=["dict", "values"])
def test_names_by_kernel_tid_from_each_versions_dicts(minor: int, split: bool) -> None:
    image = Image(minor)
    type_, keys = _named(image, split)
    idents = {0x7F00_0000_1000 + 0x100_0000 * i: 100 + i for i in range(3)}
    threads = {ident: image.thread(type_, {keys["_name"]: image.new_str(f"worker-{tid}"),
                                           keys["_ident"]: image.new_int(ident)}, split=split)
               for ident, tid in idents.items()}
    image.idents = [(tid, ident) for ident, tid in idents.items()] + [(999, 0x1234)]
    names = image.reader()
    assert names.poll() == {}  # threading is not imported yet
    _threading(image, threads)
    assert names.poll() == {100: "worker-100", 101: "worker-101", 102: "worker-102"}


@pytest.mark.parametrize("minor", [11, 12, 13])
def test_a_rename_is_read_and_an_unchanged_name_is_not(minor: int) -> None:
    image = Image(minor)
    type_, keys = _named(image, split=False)
    thread = image.thread(type_, {keys["_name"]: image.new_str("before")}, split=False)
    image.idents = [(4242, 77)]
    _threading(image, {77: thread})
    names = image.reader()
    assert names.poll() == {4242: "before"}
    reads = image.string_reads
    assert names.poll() == {4242: "before"}
    assert image.string_reads == reads  # same str object: not read again
    after = image.new_str("after")
    image.set_dict(image.get(thread - 24), {keys["_name"]: after})
    assert names.poll() == {4242: "after"}
    # Renamed twice between two polls, the second name's str where the first one was
    # freed: the same pointer, another name.
    image.set_str(after, "again")
    assert names.poll() == {4242: "again"}


def test_ident_reused_by_a_new_thread_gets_the_new_name() -> None:
    """A thread ends, another starts with the same ident (pthread_t), its Thread object
    and name str at the freed ones' addresses: _active's version moved, so the str is read
    again, and the ident now belongs to another kernel tid."""
    image = Image(12)
    type_, keys = _named(image, split=False)
    name = image.new_str("round-0")
    thread = image.thread(type_, {keys["_name"]: name}, split=False)
    image.idents = [(500, 77)]
    _, active = _threading(image, {77: thread})
    names = image.reader()
    assert names.poll() == {500: "round-0"}
    image.set_str(name, "round-1")  # same addresses, new content
    image.idents = [(501, 77)]
    image.set_dict(active, {image.new_int(77): thread}, general=True)
    assert names.poll() == {501: "round-1"}


def test_idents_map_through_thread_states_only() -> None:
    """A Thread in _active whose ident no thread state has (it ended, or not begun) is not
    named; a thread state with no Thread (started from C) is left to its comm."""
    image = Image(11)
    type_, keys = _named(image, split=True)
    a = image.thread(type_, {keys["_name"]: image.new_str("a")}, split=True)
    b = image.thread(type_, {keys["_name"]: image.new_str("b")}, split=True)
    image.idents = [(10, 1), (11, 3)]
    _threading(image, {1: a, 2: b})
    assert image.reader().poll() == {10: "a"}


@pytest.mark.parametrize("minor", [11, 12, 13])
def test_garbage_gives_no_name_and_no_exception(minor: int) -> None:
    image = Image(minor)
    type_, keys = _named(image, split=False)
    good = image.thread(type_, {keys["_name"]: image.new_str("good")}, split=False)
    no_dict_type = image.thread_type(0)
    no_dict = image.thread(no_dict_type, {keys["_name"]: image.new_str("x")}, split=False)
    bad_dict = image.thread(type_, {keys["_name"]: image.new_str("y")}, split=False)
    image.put(image.get(bad_dict - 24) + 8, 0xBAD)  # not a dict
    huge = image.thread(type_, {keys["_name"]: image.new_str("z")}, split=False)
    huge_keys = image.get(image.get(huge - 24) + image.off["dict_keys"])
    image.put(huge_keys + image.off["dictkeys_nentries"], MAX_ENTRIES + 1, "<q")
    wild = image.thread(type_, {keys["_name"]: 0xDEAD_0000_0000}, split=False)
    unmapped = 0x9_0000_0000
    idents = {1: good, 2: no_dict, 3: bad_dict, 4: huge, 5: wild, 6: unmapped,
              7: 8, 8: (1 << 64) - 16}  # objects whose header would lie outside 0..2^64
    image.idents = [(100 + i, i) for i in idents]
    _, active = _threading(image, idents)
    names = image.reader()
    assert names.poll() == {101: "good"}
    negative = image.new_int(9)
    image.put(negative + image.off["long_size"], -8 if minor == 11 else (1 << 3) | 2, "<q")
    too_big = image.new_int(1 << 100)
    not_int = image.new_str("8")
    image.set_dict(active, {negative: good, too_big: good, not_int: good,
                            image.new_int(1): good}, general=True)
    assert names.poll() == {101: "good"}
    image.put(active + 8, 0xBAD)  # _active itself is garbage now
    assert names.poll() == {}
    image.gone = True
    image.put(active + 8, DICT_TYPE)
    image.set_dict(active, {image.new_int(1): good}, general=True)
    assert names.poll() == {}


def test_versions_without_a_layout_name_nothing() -> None:
    image = Image(12)
    for version in [(3, 10, 0), (3, 14, 0)]:
        assert ThreadNames(image, version, image.off, RUNTIME).poll() == {}
    layout = dict(image.off)
    del layout["interp_modules"]
    assert ThreadNames(image, (3, 12, 0), layout, RUNTIME).poll() == {}


def test_active_changing_while_read_is_read_again() -> None:
    """_active is read, then the thread states, then _active again: a thread that started
    or ended in between (its version moved) makes the poll read it all once more."""
    image = Image(13)
    type_, keys = _named(image, split=True)
    t = image.thread(type_, {keys["_name"]: image.new_str("t")}, split=True)
    image.idents = [(9, 5)]
    _, active = _threading(image, {5: t})
    names = image.reader()
    calls = 0
    real = image.thread_idents

    def moving() -> list[tuple[int, int]]:
        nonlocal calls
        calls += 1
        if calls == 1:
            image.set_dict(active, {image.new_int(5): t}, general=True)
        return real()

    image.thread_idents = moving  # type: ignore[method-assign]
    assert names.poll() == {9: "t"}
    assert calls == 2


# -- real interpreters --------------------------------------------------------------------


def _threads(profile: Path) -> dict[int, tuple[str, str]]:
    with sqlite3.connect(f"file:{profile}?mode=ro", uri=True) as db:
        return {tid: (name, comm) for tid, name, comm
                in db.execute("SELECT tid, name, comm FROM threads")}








def test_thread_picker_cuts_names_past_32_characters() -> None:
    long = "a-thread-name-of-forty-characters-long-x"
    threads = [ThreadInfo(1, "MainThread", 5, False), ThreadInfo(2, long, 3, False)]

    async def main() -> None:
        app: App[None] = App()
        async with app.run_test() as pilot:
            app.push_screen(ThreadPicker(threads, None))
            await pilot.pause()
            options = app.screen.query_one(OptionList)
            labels = [str(options.get_option_at_index(i).prompt) for i in (1, 2)]
            assert labels[1].split()[1] == long[:31] + "…"
            assert labels[0].index(" samples") == labels[1].index(" samples")

    asyncio.run(main())


def test_writer_keeps_the_name_shown_and_the_kernel_name(tmp_path: Path) -> None:
    """`threads.name` is the name shown (Python's), `threads.comm` the kernel's; a rename
    updates the name and keeps comm; a file from before `comm` gains it when appended to."""
    path = tmp_path / "old.db"
    ProfileWriter(path).finish("test")
    with sqlite3.connect(path) as db:  # the threads table as files before comm had it
        db.execute("ALTER TABLE threads DROP COLUMN comm")
        db.execute("INSERT INTO threads (tid, name, pid) VALUES (7, 'python3', 7)")
    db.close()
    writer = ProfileWriter(path, append=True)
    writer.write_checkpoint(Checkpoint(timestamp_ms=1, threads={7: "MainThread", 8: "worker"},
                                       thread_comms={7: "python3", 8: "python3"},
                                       thread_pids={7: 7, 8: 7}))
    writer.write_checkpoint(Checkpoint(timestamp_ms=2, threads={8: "renamed"},
                                       thread_comms={8: "python3"}))
    writer.write_checkpoint(Checkpoint(timestamp_ms=3, threads={9: "native"}))
    writer.finish("test")
    assert _threads(path) == {7: ("MainThread", "python3"), 8: ("renamed", "python3"),
                              9: ("native", "native")}




