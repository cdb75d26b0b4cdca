"""The [waiting for the GIL] rule (storage.samples.gil_wait_caller / offcpu_stack) on
synthetic off-CPU stacks as the recorder stores them (leaf first, the [kernel] leaf on
top), and --gil's option checks. The real waits are tests/system/test_gil.py."""

from __future__ import annotations

import pytest
from rsprof.storage.callsite import PYTHON_ADDRESS_BASE
from rsprof.storage.samples import GIL_WAIT, Frame, gil_wait_caller, offcpu_stack

from unit.synthetic import frame

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
DEBIAN = "/usr/bin/python3.11"  # stripped: take_gil is an address
PYENV = "/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0"
KERNEL = frame("[kernel]", module="[kernel]")


def py(name: str, n: int = 0) -> Frame:
    return frame(name, module="/app/work.py", address=PYTHON_ADDRESS_BASE | (0x100 + n))


def native(name: str, module: str) -> Frame:
    return frame(name, module=module, address=0x4000)


def functions(stack: tuple[Frame, ...]) -> list[str]:
    return [f.lines[0].function for f in stack]


# the kernel function waited in (main's off-CPU kernel frame), then libc's wait
LIBC_COND = (native("futex_do_wait", "[kernel.kallsyms]"),
             native("__futex_abstimed_wait_common64", LIBC),
             native("__pthread_cond_wait_common", LIBC))


@pytest.mark.parametrize(("wait", "interpreter"), [
    ("___pthread_cond_timedwait64", native("python3.11+0xf92c0", DEBIAN)),  # Debian, stripped
    ("pthread_cond_timedwait", native("take_gil", PYENV)),  # libc without debug info
    ("___pthread_cond_wait", native("python3.11+0x234310", DEBIAN)),  # drop_gil's switch
    ("pthread_cond_clockwait", native("take_gil", "/usr/lib/libpython3.13.so")),
])
def test_a_cond_wait_called_by_the_interpreter_is_the_gil_under_the_python_frame(
        wait: str, interpreter: Frame) -> None:
    stack = (KERNEL, *LIBC_COND, native(wait, LIBC), interpreter,
             native("_PyEval_EvalFrameDefault", DEBIAN), py("spin", 1), py("worker", 2))
    assert gil_wait_caller(stack[1:]) == 6
    assert functions(offcpu_stack(stack, "S")) == [GIL_WAIT, "spin", "worker"]


def test_restoring_the_thread_after_a_blocking_call_waits_for_the_gil_too() -> None:
    """time.sleep returned and the thread takes the GIL back (PyEval_RestoreThread): that
    wait is the GIL's, under the Python frame that called sleep."""
    stack = (KERNEL, *LIBC_COND, native("pthread_cond_timedwait", LIBC),
             native("take_gil", PYENV), native("PyEval_RestoreThread", PYENV),
             native("time_sleep", PYENV), py("sleeper"))
    assert functions(offcpu_stack(stack, "S")) == [GIL_WAIT, "sleeper"]


def test_without_a_python_frame_the_gil_sits_under_the_interpreter_frame() -> None:
    """A new thread attaching to the interpreter, before any Python frame."""
    stack = (KERNEL, native("pthread_cond_timedwait", LIBC), native("take_gil", PYENV),
             native("PyEval_AcquireThread", PYENV), native("thread_run", PYENV))
    assert functions(offcpu_stack(stack, "S")) == [
        GIL_WAIT, "take_gil", "PyEval_AcquireThread", "thread_run"]


@pytest.mark.parametrize("stack", [
    # time.sleep
    (KERNEL, native("__GI___clock_nanosleep", LIBC), native("pysleep", PYENV), py("sleeper")),
    # threading.Lock / Condition / Event / queue.get: semaphores
    (KERNEL, native("__futex_abstimed_wait_common", LIBC), native("__new_sem_wait_slow64", LIBC),
     native("PyThread_acquire_lock_timed", PYENV), py("Condition.wait")),
    # select
    (KERNEL, native("__select", LIBC), native("select_select", PYENV), py("poll")),
    # a C extension's own condition variable
    (KERNEL, native("pthread_cond_wait", LIBC), native("worker_wait", "/app/_ext.so"), py("f")),
    # the cond wait's caller is another libc function
    (KERNEL, native("pthread_cond_wait", LIBC), native("some_libc", LIBC),
     native("take_gil", PYENV), py("f")),
    # Python code between the leaf and the wait: not the interpreter's own wait
    (KERNEL, py("f"), native("pthread_cond_wait", LIBC), native("take_gil", PYENV)),
    # a cond wait at the bottom, with no caller
    (KERNEL, native("pthread_cond_wait", LIBC)),
    # a program that is not Python
    (KERNEL, native("pthread_cond_wait", LIBC), native("main", "/usr/bin/app")),
])
def test_other_waits_are_not_the_gil(stack: tuple[Frame, ...]) -> None:
    assert gil_wait_caller(stack[1:]) is None
    assert offcpu_stack(stack, "S")[0].lines[0].function == "[sleeping]"


def test_only_sleeps_are_gil_waits() -> None:
    """Preempted inside take_gil (woken, not run yet) is preemption, as for any code."""
    stack = (KERNEL, native("pthread_cond_timedwait", LIBC), native("take_gil", PYENV), py("f"))
    assert functions(offcpu_stack(stack, "R"))[0] == "[preempted]"
    assert functions(offcpu_stack(stack, "D"))[0] == "[uninterruptible wait]"


def test_gil_needs_python_frames_read_at_sample_time() -> None:
    import click

    from rsprof.cli import _check_record_options
    _check_record_options(99, 1.0, True, "on")
    for python in ("off", "drain"):
        with pytest.raises(click.BadParameter, match="needs --python on"):
            _check_record_options(99, 1.0, True, python)
