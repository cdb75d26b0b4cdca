"""C calling back into Python, five ways, a round of each: a generator driven by sum(),
class creation through a metaclass and __init_subclass__ (type_call), sorted(key=...),
map() and re.sub() with a function. For bench/bench_pyaccuracy.py."""
import re
import sys

from pyacc_timing import main


class Meta(type):
    def __new__(mcls, name, bases, namespace):
        namespace["tag"] = name.lower()
        return super().__new__(mcls, name, bases, namespace)


class Base(metaclass=Meta):
    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.fields = tuple(k for k in vars(cls) if not k.startswith("_"))  # type: ignore[attr-defined]


def squares(n):
    return sum(x * x for x in range(n))


def make_classes(n):
    made = []
    for i in range(n):
        class Made(Base):
            a = i
            b = i * 2

            def value(self):
                return self.a
        made.append(Made)
    return made


def key(x):
    return (x * 7919) % 1009


def sort_keyed(n):
    return sorted(range(n), key=key)


def double(x):
    return x * 2 + 1


def mapped(n):
    return sum(map(double, range(n)))


WORD = re.compile(r"[a-z]+")
TEXT = " ".join(["lorem", "ipsum", "dolor", "sit", "amet", "consectetur"] * 300)


def shout(match):
    return match.group(0).upper()


def substitute(text):
    return WORD.sub(shout, text)


def work(rounds):
    for _ in range(rounds):
        squares(20000)
        make_classes(150)
        sort_keyed(6000)
        mapped(20000)
        substitute(TEXT)


if __name__ == "__main__":
    sys.setrecursionlimit(10000)
    main(work)
