/* leb128.h: LEB128 numbers (DWARF 5, section 7.6), the one decoder behind the DWARF reader
 * (native/dwarf.c: rd_uleb, rd_sleb) and the CFI interpreter (native/cfi_eval.h: cfi_uleb,
 * cfi_sleb), hence also behind the heap shim: static inline, no libc, no Python.
 *
 * Bounded: no byte at or past `end` is read.  A number keeps its low 64 bits: bits an
 * overlong encoding (more than 10 bytes, or a 10th byte above its lowest bit) carries beyond
 * them are dropped.  Every shift is of an unsigned value by less than 64, and a signed
 * result comes from the unsigned one by arithmetic (rs_leb128_signed), never by shifting a
 * signed value: a 9-byte negative number used to sign-extend with `-((int64_t)1 << 63)`,
 * which is undefined behaviour.
 */
#ifndef RSPROF_LEB128_H
#define RSPROF_LEB128_H

#include <stdint.h>

/* Reads one number at *p.  Returns 1, *out its low 64 bits (sign-extended from its last
 * byte when is_signed), *p past its last byte; or 0 when the input ends before a byte
 * without the continuation bit (including *p >= end): *out 0, *p at end (or left where it
 * was if it was past end already). */
static inline int rs_leb128(const uint8_t **p, const uint8_t *end, int is_signed,
                            uint64_t *out) {
    const uint8_t *q = *p;
    uint64_t v = 0;
    unsigned shift = 0; /* stops at 70: cannot wrap however long the input */
    while (q < end) {
        uint8_t b = *q++;
        if (shift < 64) {
            v |= (uint64_t)(b & 0x7f) << shift;
            shift += 7;
        }
        if (!(b & 0x80)) {
            if (is_signed && shift < 64 && (b & 0x40)) v |= ~(uint64_t)0 << shift;
            *p = q;
            *out = v;
            return 1;
        }
    }
    *p = q;
    *out = 0;
    return 0;
}

/* The int64_t whose two's complement bits are v, without an out-of-range conversion. */
static inline int64_t rs_leb128_signed(uint64_t v) {
    return v <= (uint64_t)INT64_MAX ? (int64_t)v : -(int64_t)~v - 1;
}

static inline int rs_uleb128(const uint8_t **p, const uint8_t *end, uint64_t *out) {
    return rs_leb128(p, end, 0, out);
}

static inline int rs_sleb128(const uint8_t **p, const uint8_t *end, int64_t *out) {
    uint64_t v;
    int ok = rs_leb128(p, end, 1, &v);
    *out = rs_leb128_signed(v);
    return ok;
}

#endif
