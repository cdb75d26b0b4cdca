"""A forked child runs heavy(), its parent light(), each for argv[1] seconds."""
import os
import sys
import time


def heavy():
    s = 0
    for i in range(30000):
        s += i * i
    return s


def light():
    s = 0
    for i in range(10000):
        s += i * i
    return s


def spin(work, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        work()


seconds = float(sys.argv[1])
child = os.fork()
if child == 0:
    spin(heavy, seconds)
    os._exit(0)
spin(light, seconds)
os.waitpid(child, 0)
