/* StoppedProcess: every thread of a process stopped for a moment, for `rsprof dump`.
 *
 * `rsprof dump PID` prints each thread's stack now, as py-spy dump does: a thread blocked in
 * a system call gets no CPU sample, so sampling cannot show where it waits.  The threads
 * are stopped with ptrace (PTRACE_SEIZE + PTRACE_INTERRUPT: no signal is sent, and a signal
 * that arrives during the stop is handed back on detach, never lost); their registers and
 * the top of their stacks are copied, unwound by the same CFI unwinder as CPU samples
 * (native/unwind.c), and the caller reads the Python frames while they are stopped.  Then
 * every thread is detached and runs on; a tracer that dies detaches them too (the kernel
 * does it), so a killed rsprof leaves no thread stopped.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>

#include "rs_unwind.h"

#define SNAP_MAX_THREADS 65536
#define SNAP_MAX_DEPTH 256
#define SNAP_LIST_ROUNDS 8 /* re-list the threads until no new one appears */

typedef struct {
    int32_t tid;
    int resume_signal;         /* a signal that stopped it instead of our interrupt */
    bool stopped;              /* was in a ptrace-stop: registers and stack copied */
    bool seized;
    struct user_regs_struct regs;
    uint8_t *stack;            /* the top of its stack from regs.rsp, stack_len bytes */
    uint64_t stack_len;
} snap_thread;

typedef struct {
    PyObject_HEAD
    int32_t pid;
    uint64_t stack_bytes;
    snap_thread *threads;
    size_t n, cap;
    rs_space *space;
    bool resumed;
} StoppedProcess;

static snap_thread *snap_find(StoppedProcess *self, int32_t tid) {
    for (size_t i = 0; i < self->n; i++)
        if (self->threads[i].tid == tid) return &self->threads[i];
    return NULL;
}

/* The thread's registers and the top of its stack, copied while it is stopped (unwound
 * later, after it runs again: parsing a module's CFI the first time takes milliseconds
 * the target need not wait for).  The copy stops at the first unmapped page above sp. */
static int snap_capture(snap_thread *t, int32_t pid, uint64_t max) {
    if (ptrace(PTRACE_GETREGS, t->tid, NULL, &t->regs) != 0) return errno;
    t->stack = malloc(max);
    if (t->stack == NULL) return ENOMEM;
    uint64_t have = 0, page = 4096 - (t->regs.rsp & 4095);
    struct iovec local = {t->stack, max};
    struct iovec remote = {(void *)(uintptr_t)t->regs.rsp, max};
    ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got == (ssize_t)max) {
        have = max;
    } else {
        while (have < max) {
            uint64_t want = max - have < page ? max - have : page;
            struct iovec l = {t->stack + have, want};
            struct iovec r = {(void *)(uintptr_t)(t->regs.rsp + have), want};
            if (process_vm_readv(pid, &l, 1, &r, 1, 0) != (ssize_t)want) break;
            have += want;
            page = 4096;
        }
    }
    t->stack_len = have;
    return 0;
}

/* Seizes and interrupts one thread; waits for its stop.  0, or an errno (ESRCH: it left). */
static int snap_stop_one(snap_thread *t, int32_t pid, uint64_t stack_bytes) {
    if (ptrace(PTRACE_SEIZE, t->tid, NULL, NULL) != 0) return errno;
    t->seized = true;
    if (ptrace(PTRACE_INTERRUPT, t->tid, NULL, NULL) != 0) return errno;
    for (;;) {
        int status;
        pid_t got = waitpid(t->tid, &status, __WALL);
        if (got < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (WIFEXITED(status) || WIFSIGNALED(status)) {
            t->seized = false; /* gone: nothing to detach */
            return ESRCH;
        }
        if (!WIFSTOPPED(status)) continue;
        int sig = WSTOPSIG(status);
        int event = status >> 16;
        /* A signal-delivery-stop (a signal arrived before our interrupt): keep the signal
         * to deliver it on detach.  PTRACE_EVENT_STOP is our interrupt, or a group-stop
         * (SIGSTOP & co.), which detaching leaves as it is. */
        if (event == 0 && sig != SIGTRAP) t->resume_signal = sig;
        int rc = snap_capture(t, pid, stack_bytes);
        if (rc == ESRCH) return ESRCH; /* killed meanwhile */
        t->stopped = rc == 0;
        return rc;
    }
}

static void snap_resume(StoppedProcess *self) {
    if (self->resumed) return;
    self->resumed = true;
    for (size_t i = 0; i < self->n; i++) {
        snap_thread *t = &self->threads[i];
        if (!t->seized) continue;
        /* Detaching a running (not yet stopped) tracee fails with ESRCH: interrupt it, wait,
         * and detach from the stop. */
        if (ptrace(PTRACE_DETACH, t->tid, NULL, (void *)(intptr_t)t->resume_signal) != 0 &&
            errno == ESRCH && !t->stopped) {
            if (ptrace(PTRACE_INTERRUPT, t->tid, NULL, NULL) == 0) {
                int status;
                while (waitpid(t->tid, &status, __WALL) < 0 && errno == EINTR) {
                }
                ptrace(PTRACE_DETACH, t->tid, NULL, (void *)(intptr_t)t->resume_signal);
            }
        }
        t->seized = false;
    }
}

static bool snap_add(StoppedProcess *self, int32_t tid) {
    if (self->n == self->cap) {
        size_t cap = self->cap ? self->cap * 2 : 16;
        snap_thread *grown = realloc(self->threads, cap * sizeof *grown);
        if (grown == NULL) return false;
        self->threads = grown;
        self->cap = cap;
    }
    memset(&self->threads[self->n], 0, sizeof self->threads[0]);
    self->threads[self->n++].tid = tid;
    return true;
}

/* Stops every thread, listing /proc/PID/task again until a round finds no new thread (a
 * thread started meanwhile by a running one).  0, or an errno for the whole process. */
static int snap_stop_all(StoppedProcess *self) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)self->pid);
    for (int round = 0; round < SNAP_LIST_ROUNDS; round++) {
        DIR *dir = opendir(path);
        if (dir == NULL) return errno == ENOENT ? ESRCH : errno;
        bool found_new = false;
        int error = 0;
        struct dirent *e;
        while ((e = readdir(dir)) != NULL) {
            char *end;
            long tid = strtol(e->d_name, &end, 10);
            if (*end != '\0' || tid <= 0 || snap_find(self, (int32_t)tid) != NULL) continue;
            if (self->n >= SNAP_MAX_THREADS || !snap_add(self, (int32_t)tid)) {
                error = ENOMEM;
                break;
            }
            found_new = true;
            int rc = snap_stop_one(&self->threads[self->n - 1], self->pid, self->stack_bytes);
            if (rc == ESRCH) continue; /* the thread left */
            if (rc != 0) {
                error = rc;
                break;
            }
        }
        closedir(dir);
        if (error) return error;
        if (!found_new) return 0;
    }
    return 0;
}

static void StoppedProcess_dealloc(StoppedProcess *self) {
    snap_resume(self);
    if (self->space) rs_space_free(self->space);
    for (size_t i = 0; i < self->n; i++) free(self->threads[i].stack);
    free(self->threads);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *StoppedProcess_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"pid", "stack_bytes", NULL};
    int pid;
    unsigned long long stack_bytes = 65536;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i|K:StoppedProcess", kwlist, &pid,
                                     &stack_bytes))
        return NULL;
    if (pid <= 0) {
        PyErr_SetString(PyExc_ValueError, "pid must be positive");
        return NULL;
    }
    if (stack_bytes < 64 || stack_bytes > (1u << 20)) {
        PyErr_SetString(PyExc_ValueError, "stack_bytes must be 64 B to 1 MiB");
        return NULL;
    }
    StoppedProcess *self = (StoppedProcess *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->pid = pid;
    self->stack_bytes = stack_bytes;
    self->space = rs_space_new(pid);
    if (self->space == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    int error;
    Py_BEGIN_ALLOW_THREADS
    error = snap_stop_all(self);
    Py_END_ALLOW_THREADS
    if (error == 0 && !rs_space_read_proc_maps(self->space)) error = errno ? errno : ESRCH;
    if (error != 0) {
        snap_resume(self);
        errno = error;
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyObject *StoppedProcess_threads(StoppedProcess *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *lst = PyList_New(0);
    if (lst == NULL) return NULL;
    for (size_t i = 0; i < self->n; i++) {
        if (!self->threads[i].stopped) continue;
        PyObject *tid = PyLong_FromLong(self->threads[i].tid);
        if (tid == NULL || PyList_Append(lst, tid) < 0) {
            Py_XDECREF(tid);
            Py_DECREF(lst);
            return NULL;
        }
        Py_DECREF(tid);
    }
    return lst;
}

/* stack(tid) -> (addresses, truncated, syscall): the thread's user stack when it was
 * stopped, leaf first, unwound as CPU samples are; syscall: the system call it was in
 * (orig_rax), or -1.  Works after resume(): it reads the copy. */
static PyObject *StoppedProcess_stack(StoppedProcess *self, PyObject *arg) {
    long tid = PyLong_AsLong(arg);
    if (tid == -1 && PyErr_Occurred()) return NULL;
    snap_thread *t = snap_find(self, (int32_t)tid);
    if (t == NULL || !t->stopped) {
        PyErr_Format(PyExc_KeyError, "thread %ld was not stopped", tid);
        return NULL;
    }
    uint64_t out[SNAP_MAX_DEPTH];
    uint32_t depth;
    bool truncated = false;
    Py_BEGIN_ALLOW_THREADS
    depth = rs_unwind(self->space, t->regs.rip, t->regs.rsp, t->regs.rbp, t->stack,
                      t->stack_len, out, SNAP_MAX_DEPTH, &truncated);
    Py_END_ALLOW_THREADS
    PyObject *lst = PyList_New((Py_ssize_t)depth);
    if (lst == NULL) return NULL;
    for (uint32_t i = 0; i < depth; i++) {
        PyObject *a = PyLong_FromUnsignedLongLong(out[i]);
        if (a == NULL) {
            Py_DECREF(lst);
            return NULL;
        }
        PyList_SET_ITEM(lst, (Py_ssize_t)i, a);
    }
    return Py_BuildValue("(NOL)", lst, truncated ? Py_True : Py_False,
                         (long long)t->regs.orig_rax);
}

static PyObject *StoppedProcess_resume(StoppedProcess *self, PyObject *Py_UNUSED(ignored)) {
    Py_BEGIN_ALLOW_THREADS
    snap_resume(self);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *StoppedProcess_enter(StoppedProcess *self, PyObject *Py_UNUSED(ignored)) {
    return Py_NewRef(self);
}

static PyObject *StoppedProcess_exit(StoppedProcess *self, PyObject *Py_UNUSED(args)) {
    return StoppedProcess_resume(self, NULL);
}

static PyObject *StoppedProcess_get_pid(StoppedProcess *self, void *Py_UNUSED(closure)) {
    return PyLong_FromLong(self->pid);
}

static PyMethodDef StoppedProcess_methods[] = {
    {"threads", (PyCFunction)StoppedProcess_threads, METH_NOARGS,
     "threads() -> list[int]\n\nThe threads that are stopped (those that left are not)."},
    {"stack", (PyCFunction)StoppedProcess_stack, METH_O,
     "stack(tid) -> (list[int], truncated, syscall)\n\nThe thread's user stack when it was "
     "stopped, leaf first, unwound by CFI as CPU samples are; the system call it was in, or "
     "-1."},
    {"resume", (PyCFunction)StoppedProcess_resume, METH_NOARGS,
     "resume() -> None\n\nDetaches every thread (signals that arrived meanwhile delivered)."},
    {"__enter__", (PyCFunction)StoppedProcess_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)StoppedProcess_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef StoppedProcess_getset[] = {
    {"pid", (getter)StoppedProcess_get_pid, NULL, "The process.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject StoppedProcessType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "rsprof._native.StoppedProcess",
    .tp_basicsize = sizeof(StoppedProcess),
    .tp_dealloc = (destructor)StoppedProcess_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "StoppedProcess(pid, stack_bytes=65536)\n\nEvery thread of pid stopped with "
              "ptrace until resume() (or the object's end): their stacks now.",
    .tp_methods = StoppedProcess_methods,
    .tp_getset = StoppedProcess_getset,
    .tp_new = StoppedProcess_new,
};

int rsprof_snapshot_register(PyObject *module) {
    if (PyType_Ready(&StoppedProcessType) < 0) return -1;
    return PyModule_AddObjectRef(module, "StoppedProcess", (PyObject *)&StoppedProcessType);
}
