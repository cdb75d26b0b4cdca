/* pybpf.h: the BPF sampler of Python frames (native/bpf/pyperf.bpf.c), as the perf
 * sampler (native/perf.c) drives it: load the program, attach it to each perf event,
 * configure a process, consume its records. Built with libbpf when `pip install` found
 * clang and libbpf's headers (setup.py defines RS_HAVE_BPF); without them every call
 * fails with a reason and the recorder reads Python frames at drain time instead. */
#ifndef RSPROF_PYBPF_H
#define RSPROF_PYBPF_H

#include <stddef.h>
#include <stdint.h>

#include "bpf/pyperf.h"

typedef struct rs_pybpf rs_pybpf;

/* Loads the object file `path` (pyperf.bpf.o) with a ring buffer of ring_bytes (a power
 * of two, >= a page). NULL on failure, with one line saying why in err. */
rs_pybpf *rs_pybpf_open(const char *path, size_t ring_bytes, char *err, size_t errlen);

/* PERF_EVENT_IOC_SET_BPF on a perf event: 0, or an errno value. Events a thread inherits
 * from this one run the program too. */
int rs_pybpf_attach(rs_pybpf *b, int perf_fd);

/* Attaches the program's rs_pyswitch to the sched_switch tracepoint (once; the whole
 * system's switches run it, a map lookup for a process not configured): off-CPU samples'
 * frames are then read at the switch-out. 0, or an errno value. */
int rs_pybpf_attach_switch(rs_pybpf *b);

/* rs_pyswitch reads nothing from now on (a switch storm: the recorder's rate bound). 0, or
 * an errno value. */
int rs_pybpf_pause_switch(rs_pybpf *b);

/* Process tgid's frames are read (cfg) or no longer (cfg NULL): 0 or an errno value. */
int rs_pybpf_configure(rs_pybpf *b, uint32_t tgid, const struct rs_bpf_config *cfg);

/* Calls fn for each record written since the last call; returns how many, or -errno. */
typedef void (*rs_pybpf_fn)(void *ctx, const struct rs_bpf_record *rec, size_t size);
int rs_pybpf_consume(rs_pybpf *b, rs_pybpf_fn fn, void *ctx);

/* The program's counters (RS_BPF_RUNS...), summed over CPUs. */
void rs_pybpf_counters(rs_pybpf *b, uint64_t out[RS_BPF_N_COUNTERS]);

void rs_pybpf_close(rs_pybpf *b);

#endif
