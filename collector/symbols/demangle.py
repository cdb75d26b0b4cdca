"""Symbol demangling: C++ (Itanium, via cxxfilt), Rust legacy and Rust v0.

Rust is done here rather than with a PyPI package: the legacy scheme is a C++-like `_ZN...E`
with a hash component to strip, and v0 (`_R...`) is a small grammar (RFC 2603) that fits in one
recursive-descent parser. Output follows rustc-demangle's alternate form (`{:#}`): no hashes and
no crate disambiguators, which is what a profile view wants.
"""

from __future__ import annotations

import functools
import re

try:  # cxxfilt wraps libstdc++'s __cxa_demangle through ctypes
    import cxxfilt as _cxxfilt
except ImportError:  # pragma: no cover - cxxfilt is a declared dependency
    _cxxfilt = None

_LEGACY_HASH = re.compile(r"^h[0-9a-f]{16}$")


@functools.lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """The human-readable form of a linker name; the name itself when it is not mangled.
    A suffix after `@` (a PLT stub's `@plt`, a symbol version `@@GLIBC_2.2.5`) is kept
    after the demangled name, as perf and binutils print it."""
    base, at, suffix = name.partition("@")
    if at and base:
        shown = demangle(base)
        return name if shown == base else f"{shown}@{suffix}"
    if name.startswith("_R"):
        return demangle_rust_v0(name) or name
    if name.startswith("_ZN"):
        rust = demangle_rust_legacy(name)
        if rust is not None:
            return rust
    if name.startswith("_Z") and _cxxfilt is not None:
        try:
            return str(_cxxfilt.demangle(name))
        except Exception:  # cxxfilt raises InvalidName on anything it cannot parse
            return name
    return name


# ---- Rust legacy ---------------------------------------------------------------------------

_LEGACY_ESCAPES = {
    "SP": "@", "BP": "*", "RF": "&", "LT": "<", "GT": ">", "LP": "(", "RP": ")", "C": ",",
}


def _legacy_unescape(part: str) -> str:
    if part.startswith("_$"):
        part = part[1:]
    out: list[str] = []
    i = 0
    while i < len(part):
        ch = part[i]
        if ch == "$":
            end = part.find("$", i + 1)
            if end < 0:
                return part
            code = part[i + 1:end]
            if code in _LEGACY_ESCAPES:
                out.append(_LEGACY_ESCAPES[code])
            elif code.startswith("u") and len(code) > 1:
                try:
                    out.append(chr(int(code[1:], 16)))
                except ValueError:
                    return part
            else:
                return part
            i = end + 1
        elif part.startswith("..", i):
            out.append("::")
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def demangle_rust_legacy(name: str) -> str | None:
    """`_ZN3foo3bar17h0123456789abcdefE` -> `foo::bar`; None unless it is a Rust legacy symbol."""
    body = name[3:]
    parts: list[str] = []
    i = 0
    while i < len(body) and body[i] != "E":
        j = i
        while j < len(body) and body[j].isdigit():
            j += 1
        if j == i:
            return None
        n = int(body[i:j])
        if n == 0 or j + n > len(body):
            return None
        parts.append(body[j:j + n])
        i = j + n
    # LLVM may append suffixes such as `.llvm.1234` after the final E.
    if i >= len(body) or (i != len(body) - 1 and body[i + 1] != "."):
        return None
    if len(parts) < 2 or not _LEGACY_HASH.match(parts[-1]):
        return None
    return "::".join(_legacy_unescape(p) for p in parts[:-1])


# ---- Rust v0 -------------------------------------------------------------------------------

_BASIC_TYPES = {
    "a": "i8", "b": "bool", "c": "char", "d": "f64", "e": "str", "f": "f32", "h": "u8",
    "i": "isize", "j": "usize", "l": "i32", "m": "u32", "n": "i128", "o": "u128", "s": "i16",
    "t": "u16", "u": "()", "v": "...", "x": "i64", "y": "u64", "z": "!", "p": "_",
}
_SIGNED = {"a", "i", "l", "n", "s", "x"}
_MAX_DEPTH = 200


class _V0Error(Exception):
    pass


class _V0Parser:
    """Parses the text after `_R` and prints it. Backrefs are byte offsets into that text."""

    def __init__(self, sym: str) -> None:
        self.sym = sym
        self.pos = 0
        self.depth = 0
        self.lifetimes = 0  # lifetimes bound by enclosing `for<...>` binders

    def peek(self) -> str:
        return self.sym[self.pos] if self.pos < len(self.sym) else ""

    def next(self) -> str:
        if self.pos >= len(self.sym):
            raise _V0Error("unexpected end")
        ch = self.sym[self.pos]
        self.pos += 1
        return ch

    def eat(self, ch: str) -> bool:
        if self.peek() == ch:
            self.pos += 1
            return True
        return False

    def base62(self) -> int:
        if self.eat("_"):
            return 0
        value = 0
        while True:
            ch = self.next()
            if ch == "_":
                return value + 1
            if ch.isdigit():
                d = ord(ch) - 48
            elif "a" <= ch <= "z":
                d = ord(ch) - 97 + 10
            elif "A" <= ch <= "Z":
                d = ord(ch) - 65 + 36
            else:
                raise _V0Error("bad base-62 digit")
            value = value * 62 + d

    def opt_disambiguator(self) -> int:
        return self.base62() + 1 if self.eat("s") else 0

    def decimal(self) -> int:
        start = self.pos
        if self.peek() == "0":
            self.pos += 1
            return 0
        while self.peek().isdigit():
            self.pos += 1
        if start == self.pos:
            raise _V0Error("expected a number")
        return int(self.sym[start:self.pos])

    def ident(self) -> str:
        is_puny = self.eat("u")
        n = self.decimal()
        self.eat("_")  # separates the length from identifiers starting with a digit or "_"
        if self.pos + n > len(self.sym):
            raise _V0Error("identifier past the end")
        raw = self.sym[self.pos:self.pos + n]
        self.pos += n
        if not is_puny:
            return raw
        # Rust punycode uses "_" where RFC 3492 uses "-" as the basic/extended delimiter.
        basic, sep, ext = raw.rpartition("_")
        try:
            return (basic + "-" + ext if sep else "-" + raw).encode().decode("punycode")
        except UnicodeError as exc:
            raise _V0Error("bad punycode") from exc

    def backref(self) -> _V0Parser:
        start = self.pos - 1
        target = self.base62()
        if target >= start:
            raise _V0Error("backref must point backwards")
        sub = _V0Parser(self.sym)
        sub.pos = target
        sub.depth = self.depth
        sub.lifetimes = self.lifetimes
        return sub

    def enter(self) -> None:
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise _V0Error("too deep")

    # path: in_value means generic args print as `::<...>` (expression context)
    def path(self, in_value: bool) -> str:
        self.enter()
        try:
            tag = self.next()
            if tag == "C":
                self.opt_disambiguator()
                return self.ident()
            if tag == "N":
                ns = self.next()
                prefix = self.path(in_value)
                dis = self.opt_disambiguator()
                name = self.ident()
                if ns.isupper():  # special namespaces: closures, shims
                    kind = {"C": "closure", "S": "shim"}.get(ns, ns)
                    label = f"{kind}:{name}" if name else kind
                    return f"{prefix}::{{{label}#{dis}}}"
                return f"{prefix}::{name}" if name else prefix
            if tag in "MXY":
                if tag != "Y":
                    self.opt_disambiguator()
                    self.path(False)  # the impl's own path is not printed
                self_ty = self.type_()
                if tag == "M":
                    return f"<{self_ty}>"
                trait = self.path(False)
                return f"<{self_ty} as {trait}>"
            if tag == "I":
                base = self.path(in_value)
                args = self.generic_args()
                sep = "::" if in_value else ""
                return f"{base}{sep}<{', '.join(args)}>" if args else base
            if tag == "B":
                return self.backref().path(in_value)
            raise _V0Error(f"bad path tag {tag!r}")
        finally:
            self.depth -= 1

    def generic_args(self) -> list[str]:
        args: list[str] = []
        while not self.eat("E"):
            if self.eat("L"):
                args.append(self.lifetime(self.base62()))
            elif self.eat("K"):
                args.append(self.const())
            else:
                args.append(self.type_())
        return args

    def type_(self) -> str:
        self.enter()
        try:
            tag = self.next()
            if tag in _BASIC_TYPES:
                return _BASIC_TYPES[tag]
            if tag in "RQ":
                lt = ""
                if self.eat("L"):
                    index = self.base62()
                    lt = f"{self.lifetime(index)} " if index else ""
                inner = self.type_()
                return f"&{lt}{inner}" if tag == "R" else f"&{lt}mut {inner}"
            if tag == "P":
                return f"*const {self.type_()}"
            if tag == "O":
                return f"*mut {self.type_()}"
            if tag == "A":
                inner = self.type_()
                return f"[{inner}; {self.const()}]"
            if tag == "S":
                return f"[{self.type_()}]"
            if tag == "T":
                items: list[str] = []
                while not self.eat("E"):
                    items.append(self.type_())
                return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
            if tag == "F":
                return self.fn_sig()
            if tag == "D":
                return self.dyn_bounds()
            if tag == "B":
                return self.backref().type_()
            self.pos -= 1
            return self.path(False)
        finally:
            self.depth -= 1

    def lifetime(self, index: int) -> str:
        if index == 0:
            return "'_"
        depth = self.lifetimes - index
        if depth < 0:
            raise _V0Error("unbound lifetime")
        return f"'{chr(97 + depth)}" if depth < 26 else f"'_{depth}"

    def binder(self) -> tuple[str, int]:
        """`for<'a, ...> ` for a `G` binder, and how many lifetimes it bound."""
        if not self.eat("G"):
            return "", 0
        count = self.base62() + 1
        names = []
        for _ in range(count):
            self.lifetimes += 1
            names.append(self.lifetime(1))
        return f"for<{', '.join(names)}> ", count

    def fn_sig(self) -> str:
        out, bound = self.binder()
        if self.eat("U"):
            out += "unsafe "
        if self.eat("K"):
            if self.eat("C"):
                abi = "C"
            else:
                abi = self.ident().replace("_", "-")
            out += f'extern "{abi}" '
        params: list[str] = []
        while not self.eat("E"):
            params.append(self.type_())
        ret = self.type_()
        out += f"fn({', '.join(params)})"
        self.lifetimes -= bound
        return out if ret == "()" else f"{out} -> {ret}"

    def dyn_bounds(self) -> str:
        prefix, bound = self.binder()
        traits: list[str] = []
        while not self.eat("E"):
            trait = self.path(False)
            bindings: list[str] = []
            while self.eat("p"):
                name = self.ident()
                bindings.append(f"{name} = {self.type_()}")
            if bindings:
                trait = (trait[:-1] + ", " if trait.endswith(">") else trait + "<") + \
                    ", ".join(bindings) + ">"
            traits.append(trait)
        self.lifetimes -= bound
        out = "dyn " + prefix + " + ".join(traits)
        if self.eat("L"):
            index = self.base62()
            if index:
                out += " + " + self.lifetime(index)
        return out

    def const(self) -> str:
        self.enter()
        try:
            if self.eat("p"):
                return "_"
            if self.eat("B"):
                return self.backref().const()
            ty = self.next()
            if ty not in _BASIC_TYPES:
                raise _V0Error("unsupported const type")
            negative = ty in _SIGNED and self.eat("n")
            start = self.pos
            while self.peek() and self.peek() != "_":
                self.pos += 1
            digits = self.sym[start:self.pos]
            self.next()
            value = int(digits, 16) if digits else 0
            if ty == "b":
                return "true" if value else "false"
            if ty == "c":
                return repr(chr(value))
            return f"-{value}" if negative else str(value)
        finally:
            self.depth -= 1


def demangle_rust_v0(name: str) -> str | None:
    """`_RNvCs1234_5tiny4work` -> `tiny::work`; None if the symbol does not parse."""
    body = name[2:]
    dot = body.find(".")
    if dot >= 0:
        body = body[:dot]
    parser = _V0Parser(body)
    try:
        if parser.peek().isdigit():
            parser.decimal()  # encoding version
        result = parser.path(True)
        # An instantiating-crate path may follow; it is not part of the printed name.
        return result
    except (_V0Error, RecursionError, ValueError):
        return None
