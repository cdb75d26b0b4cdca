"""Python thread names of a running CPython 3.11-3.13, read from outside.

Python names its threads (`threading.Thread(name=...)`, `ThreadPoolExecutor-0_3`,
`asyncio_0`) without telling the kernel: on 3.11-3.13 every thread's `comm` stays the
program's. The names live in the interpreter: `sys.modules["threading"]._active` maps each
thread's ident (its `pthread_self()`) to its Thread object, whose instance dict holds
`_name`; each thread state pairs the ident (`thread_id`) with the kernel tid
(`native_thread_id`). `ThreadNames.poll()` follows that chain with the frame reader's
`read` and `string` (`process_vm_readv`: nothing runs in the target, nothing stops it), as
py-spy does. Everything read is checked and bounded: a pointer may be stale or garbage,
so a failed check costs a name (the kernel's stays), never a wrong one or an exception.

Cost (docs/native.md, "Python thread names"): per poll a few reads to find `_active`
unchanged, a walk of the thread states only when `_active` changed, and per thread three
reads (four on 3.13) to see whether its `_name` is still the same str; the str is decoded
again only when it changed.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

_MANAGED_DICT = 1 << 4  # Py_TPFLAGS_MANAGED_DICT (3.11+): the instance dict is at obj - 24
_INLINE_VALUES = 1 << 2  # Py_TPFLAGS_INLINE_VALUES (3.13): the values follow the header
_GENERAL = 0  # DICT_KEYS_GENERAL: entries (hash, key, value); other kinds (key, value)
MAX_ENTRIES = 8192  # dict entries read (sys.modules, a module's globals, _active)
MAX_NAME = 1024  # code points of a thread name
_MAX_LOG2_SIZE = 30
_ADDRESS_END = 1 << 64
_SIGNATURE = 96  # bytes of a name's str compared to see it unchanged (ASCII up to 48 chars)


class Memory(Protocol):
    """What ThreadNames reads through (PyFrameReader; a synthetic image in tests)."""

    def read(self, address: int, size: int, /) -> bytes | None: ...
    def string(self, address: int, max: int = ..., /) -> str | None: ...
    def thread_idents(self) -> list[tuple[int, int]]: ...


@dataclass(slots=True)
class _Found:
    """Where one name was last found in a dict, to find it again in one read."""

    version: int = -1
    keys: int = 0
    index: int = -1
    key: int = 0
    value: int = 0


@dataclass(slots=True)
class _Thread:
    obj: int  # the Thread object
    name_ptr: int  # its `_name` str
    name: str
    signature: bytes  # the str's first _SIGNATURE bytes but its reference count


class ThreadNames:
    """The Python names of one process image's threads: `poll()` -> {kernel tid: name}."""

    def __init__(self, memory: Memory, version: tuple[int, ...], layout: Mapping[str, int],
                 runtime: int, dict_type: int = 0, long_type: int = 0) -> None:
        self.memory = memory
        self.minor = version[1] if version[:1] == (3,) else 0
        self.off = layout
        self.runtime = runtime
        self.dict_type = dict_type
        self.long_type = long_type
        self.supported = (self.minor in (11, 12, 13) and all(key in layout for key in _KEYS)
                          and layout["tstate_thread_id"] >= 0)
        self._modules = _Found()  # "threading" in sys.modules
        self._active = _Found()  # "_active" in threading's globals
        self._active_state: tuple[int, int, int] | None = None  # (version, used, keys)
        self._tids: dict[int, int] = {}  # Thread object -> kernel tid, for that _active state
        self._threads: dict[int, _Thread] = {}  # kernel tid -> what was read last
        self._strings: dict[tuple[int, str], bool] = {}  # per poll: str at address is text
        self._found: dict[tuple[int, int], _Found] = {}  # (Thread, its dict) -> `_name` there
        self.polls = 0  # polls that read something (for the docs' figures)

    # -- public ----------------------------------------------------------------------------

    def poll(self) -> dict[int, str]:
        """{kernel tid: Python name} of the threads `threading` knows now. Threads it does
        not know (not started by threading, or before `import threading`) are left out,
        and so is any thread whose name could not be read consistently this time."""
        if not self.supported:
            return {}
        self.polls += 1
        self._strings.clear()
        try:
            return self._poll()
        except ProcessLookupError:
            return {}

    # -- the chain -------------------------------------------------------------------------

    def _poll(self) -> dict[int, str]:
        active = self._find_active()
        if active is None:
            self._threads.clear()
            return {}
        for _ in range(2):
            state = self._dict_state(active)
            if state is None:
                return {}
            changed = state != self._active_state
            if changed:
                mapped = self._map_threads(active)
                # _active changed while we read it (a thread started or ended): the idents
                # may not belong to the thread states we read. Once more, else next poll.
                if mapped is None or self._dict_state(active) != state:
                    self._active_state = None
                    continue
                self._active_state, self._tids = state, mapped
            return self._names(force=changed)
        return {tid: t.name for tid, t in self._threads.items()}

    def _find_active(self) -> int | None:
        """threading._active's address, None when threading is not imported (yet)."""
        modules = self._ptr(self._interp() + self.off["interp_modules"])
        if not modules:
            return None
        module = self._lookup(modules, "threading", self._modules)
        if not module:
            return None
        globals_ = self._ptr(module + self.off["module_dict"])
        return (self._lookup(globals_, "_active", self._active) or None) if globals_ else None

    def _interp(self) -> int:
        """The main interpreter (threading of subinterpreters is theirs, not the program's)."""
        return self._ptr(self.runtime + self.off["runtime_interpreters_head"])

    def _map_threads(self, active: int) -> dict[int, int] | None:
        """Thread object -> kernel tid for every entry of _active with a thread state."""
        items = self._dict_items(active)
        if items is None:
            return None
        by_ident = {ident: native for native, ident in self.memory.thread_idents() if ident}
        mapped = {}
        for key, value, _ in items:
            ident = self._int(key)
            if ident is not None and ident in by_ident:
                mapped[value] = by_ident[ident]
        return mapped

    def _names(self, force: bool) -> dict[int, str]:
        """Each mapped thread's `_name`; the str is read again only when the pointer moved,
        the Thread object is another, or `force` (_active changed: a new thread may sit at
        a freed one's addresses)."""
        threads: dict[int, _Thread] = {}
        keys_seen: dict[int, list[tuple[int, int, int]] | None] = {}
        types_seen: dict[int, tuple[int, int]] = {}
        for obj, tid in self._tids.items():
            name_ptr = self._instance_attr(obj, "_name", keys_seen, types_seen)
            if not name_ptr:
                continue
            # One read says whether it is the same str: its type, length, hash, state and
            # (ASCII) text up to _SIGNATURE bytes. The pointer alone is not enough: two
            # renames between polls can put the second name where the first one was freed.
            signature = self._read(name_ptr, _SIGNATURE) or b""
            old = self._threads.get(tid)
            if (not force and old is not None and old.obj == obj and old.name_ptr == name_ptr
                    and signature[8:] == old.signature and old.name.isascii()
                    and self.off["unicode_ascii_data"] + len(old.name) <= _SIGNATURE):
                threads[tid] = old
                continue
            name = self._string(name_ptr, MAX_NAME)
            if name:
                threads[tid] = _Thread(obj, name_ptr, name, signature[8:])
        self._threads = threads
        live = set(self._tids)
        self._found = {key: found for key, found in self._found.items() if key[0] in live}
        return {tid: t.name for tid, t in threads.items()}

    # -- objects ---------------------------------------------------------------------------

    def _instance_attr(self, obj: int, name: str,
                       keys_seen: dict[int, list[tuple[int, int, int]] | None],
                       types_seen: dict[int, tuple[int, int]]) -> int:
        """The value (address) of attribute `name` in obj's managed instance dict, 0 if
        none. The dict is a real dict, or (not materialized) the type's shared keys with
        the object's own values array, wherever this version keeps them."""
        head = self._read(obj - 32, 48)  # (3.11 values, dict), GC header, refcnt, type
        if head is None:
            return 0
        values_311, dict_or_values, _, _, _, type_ = struct.unpack("<6Q", head)
        if type_ not in types_seen:
            types_seen[type_] = (self._u64(type_ + self.off["type_flags"]) or 0,
                                 self._ptr(type_ + self.off["heaptype_cached_keys"]))
        flags, cached = types_seen[type_]
        if not flags & _MANAGED_DICT:
            return 0
        values = 0
        if self.minor == 11:
            values = values_311
        elif self.minor == 12 and dict_or_values & 1:
            values, dict_or_values = dict_or_values + 1, 0  # tagged: the values array
        elif self.minor == 13 and flags & _INLINE_VALUES:
            valid = self._read(obj + 16 + 3, 1)  # PyDictValues.valid
            if valid is not None and valid[0]:
                values, dict_or_values = obj + 16, 0
        if values:
            if cached not in keys_seen:
                keys_seen[cached] = self._keys_entries(cached) if cached else None
            entries = keys_seen[cached]
            if entries is None:
                return 0
            for index, (key, _, _) in enumerate(entries):
                if key and self._is(key, name):
                    slot = values + self.off["dictvalues_values"] + 8 * index
                    return self._ptr(slot)
            return 0
        if not dict_or_values:
            return 0
        found = self._found.get((obj, dict_or_values))
        if found is None:
            found = self._found[(obj, dict_or_values)] = _Found()
        return self._lookup(dict_or_values, name, found)

    def _int(self, address: int) -> int | None:
        """A non-negative int object's value (idents are pthread_t: up to 64 bits)."""
        head = self._read(address, self.off["long_digits"] + 12)
        if head is None:
            return None
        if self.long_type and struct.unpack_from("<Q", head, 8)[0] != self.long_type:
            return None
        (size,) = struct.unpack_from("<q", head, self.off["long_size"])
        if self.minor >= 12:  # lv_tag: digit count << 3 | sign (0 positive, 1 zero, 2 negative)
            sign, size = size & 3, size >> 3
            if sign == 1:
                return 0
            if sign != 0:
                return None
        if not 0 <= size <= 3:
            return None
        digits = struct.unpack_from("<3I", head, self.off["long_digits"])
        value = 0
        for digit in reversed(digits[:size]):
            if digit >> 30:
                return None
            value = value << 30 | digit
        return value

    # -- dicts -----------------------------------------------------------------------------

    def _dict_state(self, address: int) -> tuple[int, int, int] | None:
        """(ma_version_tag, ma_used, ma_keys): any insert or delete changes the version."""
        head = self._dict_head(address)
        return None if head is None else head[:3]

    def _dict_head(self, address: int) -> tuple[int, int, int, int] | None:
        """(version, used, keys, values) of the dict at `address`."""
        size = self.off["dict_values"] + 8
        head = self._read(address, size)
        if head is None:
            return None
        if self.dict_type and struct.unpack_from("<Q", head, 8)[0] != self.dict_type:
            return None
        used, = struct.unpack_from("<q", head, self.off["dict_used"])
        version, = struct.unpack_from("<Q", head, self.off["dict_version"])
        keys, = struct.unpack_from("<Q", head, self.off["dict_keys"])
        values, = struct.unpack_from("<Q", head, self.off["dict_values"])
        if not 0 <= used <= MAX_ENTRIES or not keys:
            return None
        return version, used, keys, values

    def _keys_entries(self, keys: int) -> list[tuple[int, int, int]] | None:
        """(key, value, hash) of each entry of a keys object in order (deleted ones are
        (0, 0, 0)); a split table's values are NULL here (they are in the values array)."""
        head = self._read(keys, self.off["dictkeys_indices"])
        if head is None:
            return None
        log2_size = head[self.off["dictkeys_log2_size"]]
        log2_index_bytes = head[self.off["dictkeys_log2_index_bytes"]]
        kind = head[self.off["dictkeys_kind"]]
        nentries, = struct.unpack_from("<q", head, self.off["dictkeys_nentries"])
        if (kind > 2 or log2_size > _MAX_LOG2_SIZE or not 0 <= nentries <= MAX_ENTRIES
                or nentries > 1 << log2_size or not log2_size <= log2_index_bytes <= log2_size + 3):
            return None
        width = 24 if kind == _GENERAL else 16
        start = keys + self.off["dictkeys_indices"] + (1 << log2_index_bytes)
        data = self._read(start, nentries * width) if nentries else b""
        if data is None:
            return None
        if kind == _GENERAL:
            return [(key, value, hash_) for hash_, key, value in struct.iter_unpack("<3Q", data)]
        return [(key, value, 0) for key, value in struct.iter_unpack("<2Q", data)]

    def _dict_entries(self, address: int) -> tuple[tuple[int, int, int, int],
                                                   list[tuple[int, int, int]]] | None:
        """The dict's header and every entry (key, value, hash) in order, deleted ones
        included (as zeros), a split dict's values taken from its values array."""
        head = self._dict_head(address)
        if head is None:
            return None
        entries = self._keys_entries(head[2])
        if entries is None:
            return None
        if head[3]:  # a split dict: the values are in their own array
            data = self._read(head[3] + self.off["dictvalues_values"], 8 * len(entries))
            if data is None:
                return None
            entries = [(key, value, hash_) for (key, _, hash_), (value,)
                       in zip(entries, struct.iter_unpack("<Q", data))]
        return head, entries

    def _dict_items(self, address: int) -> list[tuple[int, int, int]] | None:
        """(key, value, hash) of every live entry of the dict at `address`."""
        found = self._dict_entries(address)
        return None if found is None else [e for e in found[1] if e[0] and e[1]]

    def _lookup(self, address: int, name: str, found: _Found) -> int:
        """The value of str key `name` in the dict at `address`, 0 if absent. Known again
        from the dict's header alone while the dict is unchanged (any insert or delete
        moves its version), from one more read while the key keeps its entry; else the
        keys are compared one by one."""
        head = self._dict_head(address)
        if head is None:
            return 0
        version, _, keys, values = head
        if found.version == version and found.keys == keys:
            return found.value
        if found.keys == keys and found.index >= 0 and not values:
            entries = self._keys_entries(keys)
            if entries is not None and found.index < len(entries):
                key, value, _ = entries[found.index]
                if key == found.key and value:
                    found.version, found.value = version, value
                    return value
        read = self._dict_entries(address)
        if read is None:
            return 0
        found.version, found.keys, found.index, found.key, found.value = version, keys, -1, 0, 0
        for index, (key, value, _) in enumerate(read[1]):
            if key and value and self._is(key, name):
                found.index, found.key, found.value = index, key, value
                break
        return found.value

    def _is(self, address: int, text: str) -> bool:
        """Whether the str at `address` is `text` (remembered for the poll: the keys of
        every Thread's dict are the same interned strs)."""
        key = (address, text)
        if key not in self._strings:
            self._strings[key] = self._string(address, len(text)) == text
        return self._strings[key]

    def _read(self, address: int, size: int) -> bytes | None:
        """`size` bytes at `address`; None for an address no process has (a garbage
        pointer plus an offset can fall below 0 or past 2^64)."""
        if address <= 0 or address + size > _ADDRESS_END:
            return None
        return self.memory.read(address, size)

    def _string(self, address: int, max: int) -> str | None:
        if address <= 0 or address >= _ADDRESS_END:
            return None
        return self.memory.string(address, max)

    def _ptr(self, address: int) -> int:
        data = self._read(address, 8)
        return struct.unpack("<Q", data)[0] if data is not None else 0

    def _u64(self, address: int) -> int | None:
        data = self._read(address, 8)
        return struct.unpack("<Q", data)[0] if data is not None else None


_KEYS = ("interp_modules", "module_dict", "tstate_thread_id", "long_size", "long_digits",
         "dict_used", "dict_version", "dict_keys", "dict_values", "dictkeys_log2_size",
         "dictkeys_log2_index_bytes", "dictkeys_kind", "dictkeys_nentries", "dictkeys_indices",
         "dictvalues_values", "type_flags", "heaptype_cached_keys", "runtime_interpreters_head",
         "unicode_ascii_data")
