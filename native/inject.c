/* inject.c: rsprof._native.Tracee, one thread of another process stopped with ptrace and
 * made to call a function, for `rsprof -p PID` to load the heap shim into a process
 * started without it (collector/heapattach.py drives it; docs/heap-ring.md, "Injected
 * mode").
 *
 * Only one thread is traced (PTRACE_SEIZE, no signal is sent, the other threads keep
 * running) and only while the Python side holds it.  A call saves every register (the
 * general ones and the whole XSAVE state: the thread may have been stopped in the middle
 * of vector code), builds a frame below the red zone whose return address is 0, runs to
 * the SIGSEGV that return raises (the signal is suppressed, never delivered), and puts
 * every register back exactly.  Signals that arrive meanwhile are passed on at once.  A
 * thread stopped inside a system call gets it restarted by the kernel as after any stop:
 * the restored orig_rax and rax say which (ERESTARTSYS & co.); during the call orig_rax is
 * -1 so the kernel restarts nothing under it.
 *
 * ptrace requests must come from the thread that seized: every method checks it. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <elf.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rs_unwind.h"

#ifndef PTRACE_EVENT_STOP
#define PTRACE_EVENT_STOP 128
#endif
#define XSTATE_MAX (64 * 1024) /* the XSAVE area: ~2.7 KiB with AVX-512, ~11 KiB with AMX */
#define RED_ZONE 128

typedef struct {
    PyObject_HEAD
    pid_t tid;
    pid_t tracer; /* the thread that seized: the only one ptrace answers */
    int attached;
    int stopped;      /* in a ptrace stop now */
    int stop_signal;  /* a stop signal (SIGSTOP...) seen during a call: given back at detach */
    uint64_t stop_ns; /* CLOCK_MONOTONIC of the current stop's start */
    uint64_t stopped_ns; /* total time stopped so far */
    rs_space *space;     /* the process's code mappings, for unwind() (CFI) */
} Tracee;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int check_tracer(Tracee *self) {
    if (!self->attached) {
        PyErr_SetString(PyExc_ValueError, "Tracee: detached");
        return -1;
    }
    if ((pid_t)syscall(SYS_gettid) != self->tracer) {
        PyErr_SetString(PyExc_RuntimeError, "Tracee: used from another thread than its tracer");
        return -1;
    }
    return 0;
}

static void set_stopped(Tracee *self) {
    self->stopped = 1;
    self->stop_ns = now_ns();
}

static void set_running(Tracee *self) {
    if (self->stopped) self->stopped_ns += now_ns() - self->stop_ns;
    self->stopped = 0;
}

/* Waits for the next stop of the thread (timeout_ms < 0: forever).  0 and the status, or
 * -1 with errno (ESRCH: the thread is gone; ETIMEDOUT). */
static int wait_stop(pid_t tid, int *status, int timeout_ms) {
    if (timeout_ms < 0) {
        for (;;) {
            pid_t r = waitpid(tid, status, __WALL);
            if (r == tid) break;
            if (r < 0 && errno != EINTR) return -1;
        }
    } else {
        /* Polled: no signal of our own to interrupt a blocking wait, and the Python thread
         * must not block forever on a target that is stuck. 20 us first: a call returns
         * in well under a millisecond. */
        uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000ull;
        long nap_ns = 20000;
        for (;;) {
            pid_t r = waitpid(tid, status, __WALL | WNOHANG);
            if (r == tid) break;
            if (r < 0 && errno != EINTR) return -1;
            if (now_ns() > deadline) {
                errno = ETIMEDOUT;
                return -1;
            }
            struct timespec nap = {0, nap_ns};
            nanosleep(&nap, NULL);
            if (nap_ns < 1000000) nap_ns *= 2;
        }
    }
    if (WIFEXITED(*status) || WIFSIGNALED(*status)) {
        errno = ESRCH;
        return -1;
    }
    return 0;
}

/* After PTRACE_INTERRUPT: waits for the interrupt's stop, passing on any signal the thread
 * was about to take meanwhile (it is delivered, as it would have been). */
static int wait_interrupt_stop(Tracee *self) {
    for (;;) {
        int status;
        if (wait_stop(self->tid, &status, -1) < 0) return -1;
        int sig = WSTOPSIG(status);
        int event = status >> 16;
        if (event == PTRACE_EVENT_STOP) {
            if (sig == SIGTRAP) return 0; /* our interrupt */
            /* A group stop (SIGSTOP...): the thread is stopped, which serves as well. */
            return 0;
        }
        /* A signal-delivery stop: deliver it and ask again. */
        if (ptrace(PTRACE_CONT, self->tid, NULL, (void *)(long)sig) < 0) return -1;
        if (ptrace(PTRACE_INTERRUPT, self->tid, NULL, NULL) < 0) return -1;
    }
}

static int Tracee_init(Tracee *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"tid", NULL};
    int tid;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i", kwlist, &tid)) return -1;
    if (self->attached) {
        PyErr_SetString(PyExc_ValueError, "Tracee: already attached");
        return -1;
    }
    self->tid = tid;
    self->tracer = (pid_t)syscall(SYS_gettid);
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    /* No options: the thread's own children, execs and clones are none of our business. */
    if (ptrace(PTRACE_SEIZE, tid, NULL, NULL) < 0) err = errno;
    Py_END_ALLOW_THREADS
    if (err) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->attached = 1;
    self->stopped = 0;
    self->stop_signal = 0;
    self->stopped_ns = 0;
    /* The code mappings for unwind(), read now: not while the thread is stopped. */
    Py_BEGIN_ALLOW_THREADS
    self->space = rs_space_new(tid);
    if (self->space != NULL && !rs_space_read_proc_maps(self->space)) {
        rs_space_free(self->space);
        self->space = NULL;
    }
    Py_END_ALLOW_THREADS
    return 0;
}

/* interrupt() -> None: stops the thread (PTRACE_INTERRUPT) and waits for the stop. */
static PyObject *Tracee_interrupt(Tracee *self, PyObject *unused) {
    if (check_tracer(self) < 0) return NULL;
    if (self->stopped) Py_RETURN_NONE;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ptrace(PTRACE_INTERRUPT, self->tid, NULL, NULL);
    if (rc == 0) rc = wait_interrupt_stop(self);
    Py_END_ALLOW_THREADS
    if (rc < 0) return PyErr_SetFromErrno(PyExc_OSError);
    set_stopped(self);
    Py_RETURN_NONE;
}

/* resume() -> None: lets the stopped thread run on (between two tries for a safe point). */
static PyObject *Tracee_resume(Tracee *self, PyObject *unused) {
    if (check_tracer(self) < 0) return NULL;
    if (!self->stopped) Py_RETURN_NONE;
    if (ptrace(PTRACE_CONT, self->tid, NULL, NULL) < 0) return PyErr_SetFromErrno(PyExc_OSError);
    set_running(self);
    Py_RETURN_NONE;
}

/* regs() -> (pc, sp, orig_rax, rax) of the stopped thread. */
static PyObject *Tracee_regs(Tracee *self, PyObject *unused) {
    if (check_tracer(self) < 0) return NULL;
    struct user_regs_struct r;
    if (ptrace(PTRACE_GETREGS, self->tid, NULL, &r) < 0) return PyErr_SetFromErrno(PyExc_OSError);
    return Py_BuildValue("(KKLL)", (unsigned long long)r.rip, (unsigned long long)r.rsp,
                         (long long)r.orig_rax, (long long)r.rax);
}

/* Reads what of [addr, addr + len) is readable from its start: one remote iovec per page,
 * since process_vm_readv never splits an iovec (one unmapped page would fail it all). */
static size_t read_mem(pid_t tid, uint64_t addr, void *buf, size_t len) {
    enum { PAGES = 64 };
    struct iovec local = {buf, len}, remote[PAGES];
    size_t n = 0, cnt = 0;
    for (uint64_t a = addr; n < len && cnt < PAGES; cnt++) {
        size_t chunk = 4096 - (a & 4095);
        if (chunk > len - n) chunk = len - n;
        remote[cnt] = (struct iovec){(void *)(uintptr_t)a, chunk};
        a += chunk, n += chunk;
    }
    local.iov_len = n;
    ssize_t got = process_vm_readv(tid, &local, 1, remote, cnt, 0);
    return got < 0 ? 0 : (size_t)got;
}

/* read(addr, size) -> bytes: what of [addr, addr + size) is readable (maybe less). */
static PyObject *Tracee_read(Tracee *self, PyObject *args) {
    unsigned long long addr;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "Kn", &addr, &size)) return NULL;
    if (check_tracer(self) < 0) return NULL;
    if (size < 0 || size > 64 * 4096) {
        PyErr_SetString(PyExc_ValueError, "Tracee.read: size out of range");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL) return NULL;
    size_t n = read_mem(self->tid, addr, PyBytes_AS_STRING(out), (size_t)size);
    if (_PyBytes_Resize(&out, (Py_ssize_t)n) < 0) return NULL;
    return out;
}

/* unwind(max_frames=128) -> (frames, truncated): the stopped thread's stack by CFI, as the
 * CPU sampler walks it (native/unwind.c): frames[0] is the pc, then return addresses. */
static PyObject *Tracee_unwind(Tracee *self, PyObject *args) {
    int max = 128;
    if (!PyArg_ParseTuple(args, "|i", &max)) return NULL;
    if (check_tracer(self) < 0) return NULL;
    if (max < 2 || max > 1024) {
        PyErr_SetString(PyExc_ValueError, "Tracee.unwind: max_frames out of range");
        return NULL;
    }
    struct user_regs_struct r;
    if (ptrace(PTRACE_GETREGS, self->tid, NULL, &r) < 0) return PyErr_SetFromErrno(PyExc_OSError);
    enum { STACK = 64 * 1024 };
    uint8_t *stack = PyMem_Malloc(STACK);
    uint64_t *out = PyMem_Malloc(sizeof(uint64_t) * (size_t)max);
    if (stack == NULL || out == NULL) {
        PyMem_Free(stack);
        PyMem_Free(out);
        return PyErr_NoMemory();
    }
    uint32_t n = 0;
    bool truncated = true;
    bool ok = true;
    Py_BEGIN_ALLOW_THREADS
    if (self->space == NULL) {
        self->space = rs_space_new(self->tid);
        ok = self->space != NULL && rs_space_read_proc_maps(self->space);
    }
    if (ok) {
        size_t len = read_mem(self->tid, r.rsp, stack, STACK);
        n = rs_unwind(self->space, r.rip, r.rsp, r.rbp, stack, len, out, (uint32_t)max,
                      &truncated);
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(stack);
    if (!ok) {
        PyMem_Free(out);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject *list = PyList_New(n);
    for (uint32_t i = 0; list != NULL && i < n; i++)
        PyList_SET_ITEM(list, i, PyLong_FromUnsignedLongLong(out[i]));
    PyMem_Free(out);
    if (list == NULL) return NULL;
    return Py_BuildValue("(NO)", list, truncated ? Py_True : Py_False);
}

static int write_mem(pid_t tid, uintptr_t addr, const void *buf, size_t len) {
    struct iovec local = {(void *)buf, len}, remote = {(void *)addr, len};
    if (process_vm_writev(tid, &local, 1, &remote, 1, 0) == (ssize_t)len) return 0;
    /* Word by word through ptrace (also where process_vm_writev is not allowed). */
    const unsigned char *p = buf;
    for (size_t off = 0; off < len; off += sizeof(long)) {
        long word = 0;
        size_t n = len - off < sizeof word ? len - off : sizeof word;
        if (n < sizeof word) {
            errno = 0;
            word = ptrace(PTRACE_PEEKDATA, tid, (void *)(addr + off), NULL);
            if (errno) return -1;
        }
        memcpy(&word, p + off, n);
        if (ptrace(PTRACE_POKEDATA, tid, (void *)(addr + off), (void *)word) < 0) return -1;
    }
    return 0;
}

typedef struct {
    struct user_regs_struct regs;
    unsigned char *xstate;
    size_t xstate_len;
} saved_state;

static int save_state(pid_t tid, saved_state *s) {
    if (ptrace(PTRACE_GETREGS, tid, NULL, &s->regs) < 0) return -1;
    struct iovec iov = {s->xstate, XSTATE_MAX};
    if (ptrace(PTRACE_GETREGSET, tid, (void *)NT_X86_XSTATE, &iov) < 0) {
        /* No XSAVE (very old CPU): the legacy FXSAVE area holds x87 and SSE. */
        if (ptrace(PTRACE_GETFPREGS, tid, NULL, s->xstate) < 0) return -1;
        s->xstate_len = 0;
    } else {
        s->xstate_len = iov.iov_len;
    }
    return 0;
}

static int restore_state(pid_t tid, const saved_state *s) {
    if (s->xstate_len) {
        struct iovec iov = {s->xstate, s->xstate_len};
        if (ptrace(PTRACE_SETREGSET, tid, (void *)NT_X86_XSTATE, &iov) < 0) return -1;
    } else if (ptrace(PTRACE_SETFPREGS, tid, NULL, s->xstate) < 0) {
        return -1;
    }
    return ptrace(PTRACE_SETREGS, tid, NULL, &s->regs);
}

/* The call itself, without the GIL.  0 with *result, or -1 with errno and *why. */
static int do_call(Tracee *self, uint64_t fn, const uint64_t *argv, int argc, const char *data,
                   size_t data_len, int timeout_ms, uint64_t *result, const char **why) {
    pid_t tid = self->tid;
    saved_state saved;
    saved.xstate = PyMem_RawMalloc(XSTATE_MAX);
    if (saved.xstate == NULL) {
        errno = ENOMEM;
        *why = "no memory";
        return -1;
    }
    int rc = -1;
    if (save_state(tid, &saved) < 0) {
        *why = "cannot read the thread's registers";
        goto out;
    }
    uint64_t sp = saved.regs.rsp;
    uint64_t data_addr = (sp - RED_ZONE - data_len) & ~15ull;
    /* At the function's entry rsp + 8 is 16-aligned, as after a call. */
    uint64_t new_sp = ((data_addr - 64) & ~15ull) - 8;
    uint64_t zero = 0;
    if ((data_len && write_mem(tid, data_addr, data, data_len) < 0) ||
        write_mem(tid, new_sp, &zero, sizeof zero) < 0) {
        *why = "cannot write below the thread's stack pointer";
        goto out;
    }
    struct user_regs_struct r = saved.regs;
    uint64_t args[6] = {0};
    int k = 0;
    if (data_len) args[k++] = data_addr;
    for (int i = 0; i < argc && k < 6; i++) args[k++] = argv[i];
    r.rdi = args[0], r.rsi = args[1], r.rdx = args[2], r.rcx = args[3], r.r8 = args[4],
    r.r9 = args[5];
    r.rip = fn;
    r.rsp = new_sp;
    r.rax = 0;          /* no vector registers used by a variadic callee */
    r.orig_rax = -1;    /* not in a system call: the kernel restarts nothing under the call */
    r.eflags &= ~0x400ull; /* DF clear, as the ABI wants at a call */
    if (ptrace(PTRACE_SETREGS, tid, NULL, &r) < 0) {
        *why = "cannot set the thread's registers";
        goto out;
    }
    if (ptrace(PTRACE_CONT, tid, NULL, NULL) < 0) {
        *why = "cannot resume the thread";
        goto restore;
    }
    set_running(self);
    for (;;) {
        int status;
        if (wait_stop(tid, &status, timeout_ms) < 0) {
            if (errno == ESRCH) {
                *why = "the thread exited during the call";
                goto out;
            }
            /* A call that does not come back: stop it where it is and put the thread back
             * as it was (what it holds stays held: said as an error). */
            int saved_errno = errno;
            if (ptrace(PTRACE_INTERRUPT, tid, NULL, NULL) == 0 && wait_interrupt_stop(self) == 0) {
                set_stopped(self);
                restore_state(tid, &saved);
            }
            errno = saved_errno;
            *why = "the call did not return";
            goto out;
        }
        set_stopped(self);
        int sig = WSTOPSIG(status);
        int event = status >> 16;
        if (event == PTRACE_EVENT_STOP) {
            if (sig != SIGTRAP) self->stop_signal = sig; /* a group stop: given back at detach */
        } else if (sig == SIGSEGV) {
            struct user_regs_struct now;
            if (ptrace(PTRACE_GETREGS, tid, NULL, &now) < 0) {
                *why = "cannot read the thread's registers";
                goto restore;
            }
            if (now.rip == 0 && now.rsp == new_sp + 8) {
                *result = now.rax;
                rc = 0;
                goto restore; /* the signal is never delivered: resumed with 0 later */
            }
            errno = EFAULT;
            *why = "the call faulted";
            goto restore;
        } else {
            /* Any other signal is the program's: delivered now, its handler runs on top. */
            if (ptrace(PTRACE_CONT, tid, NULL, (void *)(long)sig) < 0) {
                *why = "cannot resume the thread";
                goto restore;
            }
            set_running(self);
            continue;
        }
        if (ptrace(PTRACE_CONT, tid, NULL, NULL) < 0) {
            *why = "cannot resume the thread";
            goto restore;
        }
        set_running(self);
    }
restore:
    if (restore_state(tid, &saved) < 0 && rc == 0) {
        rc = -1;
        *why = "cannot restore the thread's registers";
    }
out:
    PyMem_RawFree(saved.xstate);
    return rc;
}

/* call(fn, args, data=b"", timeout_ms=10000) -> int: fn(args...) in the stopped thread;
 * with data, a copy of it on the thread's stack is the first argument.  Returns rax. */
static PyObject *Tracee_call(Tracee *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"fn", "args", "data", "timeout_ms", NULL};
    unsigned long long fn;
    PyObject *seq;
    const char *data = NULL;
    Py_ssize_t data_len = 0;
    int timeout_ms = 10000;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "KO|y#i", kwlist, &fn, &seq, &data, &data_len,
                                     &timeout_ms))
        return NULL;
    if (check_tracer(self) < 0) return NULL;
    if (!self->stopped) {
        PyErr_SetString(PyExc_ValueError, "Tracee.call: the thread is not stopped");
        return NULL;
    }
    PyObject *fast = PySequence_Fast(seq, "Tracee.call: args must be a sequence");
    if (fast == NULL) return NULL;
    Py_ssize_t argc = PySequence_Fast_GET_SIZE(fast);
    if (argc > 6 - (data_len ? 1 : 0)) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "Tracee.call: at most 6 register arguments");
        return NULL;
    }
    uint64_t argv[6] = {0};
    for (Py_ssize_t i = 0; i < argc; i++) {
        argv[i] = PyLong_AsUnsignedLongLongMask(PySequence_Fast_GET_ITEM(fast, i));
        if (PyErr_Occurred()) {
            Py_DECREF(fast);
            return NULL;
        }
    }
    Py_DECREF(fast);
    uint64_t result = 0;
    const char *why = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = do_call(self, fn, argv, (int)argc, data, (size_t)data_len, timeout_ms, &result, &why);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        if (errno == ESRCH) self->attached = 0, self->stopped = 0;
        PyErr_Format(PyExc_OSError, "%s: %s", why ? why : "call failed", strerror(errno));
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(result);
}

/* detach() -> None: lets the thread go (a stop signal seen during a call is given back). */
static PyObject *Tracee_detach(Tracee *self, PyObject *unused) {
    if (!self->attached) Py_RETURN_NONE;
    if (check_tracer(self) < 0) return NULL;
    if (!self->stopped) {
        /* PTRACE_DETACH needs a stopped tracee. */
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = ptrace(PTRACE_INTERRUPT, self->tid, NULL, NULL);
        if (rc == 0) rc = wait_interrupt_stop(self);
        Py_END_ALLOW_THREADS
        if (rc < 0) {
            if (errno == ESRCH) {
                self->attached = 0;
                Py_RETURN_NONE;
            }
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        set_stopped(self);
    }
    long sig = self->stop_signal;
    if (ptrace(PTRACE_DETACH, self->tid, NULL, (void *)sig) < 0 && errno != ESRCH)
        return PyErr_SetFromErrno(PyExc_OSError);
    set_running(self);
    self->attached = 0;
    Py_RETURN_NONE;
}

static void Tracee_dealloc(Tracee *self) {
    /* Never left traced: a tracee whose tracer forgot it would stay stopped. */
    if (self->attached && (pid_t)syscall(SYS_gettid) == self->tracer) {
        PyObject *r = Tracee_detach(self, NULL);
        Py_XDECREF(r);
        PyErr_Clear();
    }
    if (self->space != NULL) rs_space_free(self->space);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Tracee_get_stopped_ns(Tracee *self, void *closure) {
    uint64_t total = self->stopped_ns + (self->stopped ? now_ns() - self->stop_ns : 0);
    return PyLong_FromUnsignedLongLong(total);
}

static PyMethodDef Tracee_methods[] = {
    {"interrupt", (PyCFunction)Tracee_interrupt, METH_NOARGS,
     "interrupt() -> None: stop the thread and wait for the stop."},
    {"resume", (PyCFunction)Tracee_resume, METH_NOARGS, "resume() -> None: let it run on."},
    {"regs", (PyCFunction)Tracee_regs, METH_NOARGS, "regs() -> (pc, sp, orig_rax, rax)."},
    {"read", (PyCFunction)Tracee_read, METH_VARARGS, "read(addr, size) -> bytes."},
    {"unwind", (PyCFunction)Tracee_unwind, METH_VARARGS,
     "unwind(max_frames=128) -> (frames, truncated): the stopped thread's stack by CFI."},
    {"call", (PyCFunction)(void (*)(void))Tracee_call, METH_VARARGS | METH_KEYWORDS,
     "call(fn, args, data=b'', timeout_ms=10000) -> int: call fn in the stopped thread."},
    {"detach", (PyCFunction)Tracee_detach, METH_NOARGS, "detach() -> None."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Tracee_members[] = {
    {"tid", T_INT, offsetof(Tracee, tid), READONLY, "the traced thread"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef Tracee_getset[] = {
    {"stopped_ns", (getter)Tracee_get_stopped_ns, NULL,
     "nanoseconds the thread has been stopped by us so far", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TraceeType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "rsprof._native.Tracee",
    .tp_basicsize = sizeof(Tracee),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Tracee(tid): one thread seized with ptrace (see docs/native.md).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Tracee_init,
    .tp_dealloc = (destructor)Tracee_dealloc,
    .tp_methods = Tracee_methods,
    .tp_members = Tracee_members,
    .tp_getset = Tracee_getset,
};

int rsprof_inject_register(PyObject *module) {
    if (PyType_Ready(&TraceeType) < 0) return -1;
    Py_INCREF(&TraceeType);
    if (PyModule_AddObject(module, "Tracee", (PyObject *)&TraceeType) < 0) {
        Py_DECREF(&TraceeType);
        return -1;
    }
    return 0;
}
