"""Benchmark target: heavy() and light() at 3:1 for argv[1] seconds of wall time; prints
`ready` once running and the number of rounds done at the end (its throughput)."""
import sys
import time


def heavy():
    s = 0
    for i in range(3000):
        s += i * i
    return s


def light():
    s = 0
    for i in range(1000):
        s += i * i
    return s


print("ready", flush=True)
rounds = 0
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    heavy()
    light()
    rounds += 1
print(rounds, flush=True)
