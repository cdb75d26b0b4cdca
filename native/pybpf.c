/* pybpf.c: loads and drives the BPF sampler of Python frames (pybpf.h). libbpf does the
 * loading (ELF relocations, maps, BTF), the ring buffer's consumer side and the per-CPU
 * map reads: a hand-written loader would repeat it for no measured gain. */
#include "pybpf.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#ifdef RS_HAVE_BPF
#include <linux/perf_event.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

struct rs_pybpf {
    struct bpf_object *obj;
    int prog_fd, configs_fd, counters_fd;
    struct bpf_link *switch_link; /* rs_pyswitch on sched_switch, once attached */
    struct ring_buffer *ring;
    rs_pybpf_fn fn;              /* set for the duration of rs_pybpf_consume */
    void *ctx;
};

/* libbpf prints the verifier's log on stderr by default: the recorder says in one line
 * why the BPF mode is off instead (rs_pybpf_open's err). */
static int rs_pybpf_quiet(enum libbpf_print_level level, const char *fmt, va_list args) {
    return 0;
}

rs_pybpf *rs_pybpf_open(const char *path, size_t ring_bytes, char *err, size_t errlen) {
    libbpf_set_print(rs_pybpf_quiet);
    rs_pybpf *b = calloc(1, sizeof *b);
    if (b == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    b->obj = bpf_object__open_file(path, NULL);
    if (b->obj == NULL) {
        int e = errno;
        snprintf(err, errlen, "cannot open %s: %s%s", path, strerror(e),
                 e == ENOENT ? " (not built: clang or libbpf-dev was missing at install)" : "");
        free(b);
        return NULL;
    }
    struct bpf_map *records = bpf_object__find_map_by_name(b->obj, "records");
    if (records != NULL) bpf_map__set_max_entries(records, (uint32_t)ring_bytes);
    int rc = bpf_object__load(b->obj);
    if (rc < 0) {
        int e = -rc;
        snprintf(err, errlen, "loading the BPF program failed: %s%s", strerror(e),
                 e == EPERM || e == EACCES ? " (needs root or CAP_BPF with CAP_PERFMON)" : "");
        rs_pybpf_close(b);
        return NULL;
    }
    struct bpf_program *prog = bpf_object__find_program_by_name(b->obj, "rs_pyperf");
    b->prog_fd = prog ? bpf_program__fd(prog) : -1;
    b->configs_fd = bpf_object__find_map_fd_by_name(b->obj, "configs");
    b->counters_fd = bpf_object__find_map_fd_by_name(b->obj, "counters");
    int records_fd = bpf_object__find_map_fd_by_name(b->obj, "records");
    if (b->prog_fd < 0 || b->configs_fd < 0 || b->counters_fd < 0 || records_fd < 0) {
        snprintf(err, errlen, "%s is not rsprof's BPF program (a map or the program is missing)",
                 path);
        rs_pybpf_close(b);
        return NULL;
    }
    return b;
}

int rs_pybpf_attach(rs_pybpf *b, int perf_fd) {
    return ioctl(perf_fd, PERF_EVENT_IOC_SET_BPF, b->prog_fd) < 0 ? errno : 0;
}

int rs_pybpf_attach_switch(rs_pybpf *b) {
    if (b->switch_link != NULL) return 0;
    struct bpf_program *prog = bpf_object__find_program_by_name(b->obj, "rs_pyswitch");
    if (prog == NULL) return ENOENT;
    struct bpf_link *link = bpf_program__attach_raw_tracepoint(prog, "sched_switch");
    if (link == NULL) return errno ? errno : EINVAL;
    b->switch_link = link;
    return 0;
}

int rs_pybpf_pause_switch(rs_pybpf *b) {
    int fd = bpf_object__find_map_fd_by_name(b->obj, "switch_paused");
    uint32_t zero = 0, one = 1;
    if (fd < 0) return ENOENT;
    return bpf_map_update_elem(fd, &zero, &one, BPF_ANY) < 0 ? errno : 0;
}

int rs_pybpf_configure(rs_pybpf *b, uint32_t tgid, const struct rs_bpf_config *cfg) {
    int rc = cfg != NULL ? bpf_map_update_elem(b->configs_fd, &tgid, cfg, BPF_ANY)
                         : bpf_map_delete_elem(b->configs_fd, &tgid);
    if (rc < 0 && cfg == NULL && errno == ENOENT) return 0;
    return rc < 0 ? errno : 0;
}

static int rs_pybpf_record(void *ctx, void *data, size_t size) {
    rs_pybpf *b = ctx;
    if (size >= RS_BPF_RECORD_HEADER) b->fn(b->ctx, data, size);
    return 0;
}

int rs_pybpf_consume(rs_pybpf *b, rs_pybpf_fn fn, void *ctx) {
    if (b->ring == NULL) {
        /* Created on first use: ring_buffer__new maps the buffer. */
        int fd = bpf_object__find_map_fd_by_name(b->obj, "records");
        b->ring = ring_buffer__new(fd, rs_pybpf_record, b, NULL);
        if (b->ring == NULL) return -errno;
    }
    b->fn = fn;
    b->ctx = ctx;
    int n = ring_buffer__consume(b->ring);
    b->fn = NULL;
    return n;
}

void rs_pybpf_counters(rs_pybpf *b, uint64_t out[RS_BPF_N_COUNTERS]) {
    int cpus = libbpf_num_possible_cpus();
    memset(out, 0, RS_BPF_N_COUNTERS * sizeof out[0]);
    if (cpus <= 0) return;
    uint64_t *values = calloc((size_t)cpus, sizeof *values);
    if (values == NULL) return;
    for (uint32_t k = 0; k < RS_BPF_N_COUNTERS; k++) {
        if (bpf_map_lookup_elem(b->counters_fd, &k, values) < 0) continue;
        for (int c = 0; c < cpus; c++) out[k] += values[c];
    }
    free(values);
}

void rs_pybpf_close(rs_pybpf *b) {
    if (b == NULL) return;
    bpf_link__destroy(b->switch_link);
    ring_buffer__free(b->ring);
    bpf_object__close(b->obj);
    free(b);
}

#else /* built without libbpf: the drain-time reader is the only one */

struct rs_pybpf {
    int unused;
};

rs_pybpf *rs_pybpf_open(const char *path, size_t ring_bytes, char *err, size_t errlen) {
    snprintf(err, errlen, "rsprof was built without BPF support (clang and libbpf-dev were "
                          "missing at install)");
    return NULL;
}

int rs_pybpf_attach(rs_pybpf *b, int perf_fd) { return ENOSYS; }

int rs_pybpf_attach_switch(rs_pybpf *b) { return ENOSYS; }

int rs_pybpf_pause_switch(rs_pybpf *b) { return ENOSYS; }

int rs_pybpf_configure(rs_pybpf *b, uint32_t tgid, const struct rs_bpf_config *cfg) {
    return ENOSYS;
}

int rs_pybpf_consume(rs_pybpf *b, rs_pybpf_fn fn, void *ctx) { return -ENOSYS; }

void rs_pybpf_counters(rs_pybpf *b, uint64_t out[RS_BPF_N_COUNTERS]) {
    memset(out, 0, RS_BPF_N_COUNTERS * sizeof out[0]);
}

void rs_pybpf_close(rs_pybpf *b) {}

#endif
