/* cfi_scale_cases: CFA programs whose factored offsets overflow 64 bits (malformed CFI can
 * hold any factor and any data alignment) through native/cfi_eval.h's interpreter.  Built
 * by tests/system/test_leb128.py with -fsanitize=undefined -fno-sanitize-recover: a signed
 * multiplication or negation that overflows ends it with an error.  The offsets are the
 * products modulo 2^64 (two's complement), which the callers' range checks refuse.  Prints
 * "cfi scale ok" and exits 0, or names each failed case and exits 1. */
#include "cfi_eval.h"

#include <inttypes.h>
#include <stdio.h>

#define RA 16 /* x86_64's return address column */

typedef struct {
    const char *name;
    int64_t data_align;
    size_t len;
    uint8_t insns[24];
    int field; /* 0: ra_off, 1: cfa_off */
    uint64_t want; /* two's complement bits */
} scale_case;

#define Z8 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80
static const scale_case CASES[] = {
    /* offset r16, 3: 3 * -2^62 = 2^62 (mod 2^64) */
    {"offset", -(INT64_C(1) << 62), 2, {0x80 | RA, 3}, 0, UINT64_C(1) << 62},
    /* offset_extended r16, 2^63 (uleb, 10 bytes): 2^63 * -8 = 0 (mod 2^64) */
    {"offset_extended", -8, 12, {0x05, RA, Z8, 0x80, 0x01}, 0, 0},
    /* offset_extended_sf r16, -2^62 (sleb, 9 bytes): -2^62 * 4 = 0 */
    {"offset_extended_sf", 4, 11, {0x11, RA, Z8, 0x40}, 0, 0},
    /* def_cfa_sf r7, -1: -1 * INT64_MIN = INT64_MIN */
    {"def_cfa_sf", INT64_MIN, 3, {0x12, 7, 0x7f}, 1, UINT64_C(1) << 63},
    /* def_cfa_offset_sf 2: 2 * 2^62 = 2^63 */
    {"def_cfa_offset_sf", INT64_C(1) << 62, 2, {0x13, 2}, 1, UINT64_C(1) << 63},
    /* GNU_negative_offset_extended r16, 2^63: -(2^63) * 1 = 2^63 (the negation overflows) */
    {"GNU_negative_offset_extended", 1, 12, {0x2f, RA, Z8, 0x80, 0x01}, 0, UINT64_C(1) << 63},
};

int main(void) {
    int failed = 0;
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const scale_case *k = &CASES[i];
        cfi_cie cie;
        memset(&cie, 0, sizeof cie);
        cie.code_align = 1;
        cie.data_align = k->data_align;
        cie.ra_reg = RA;
        cfi_state s = {CFI_CFA_RSP, CFI_REG_SAME, CFI_REG_SAME, 0, 0, 8, 0, 0};
        cfi_program pr;
        cfi_program_init(&pr, &cie, k->insns, k->insns + k->len, NULL, 0, 0);
        uint64_t delta = 0;
        int st = cfi_step(&pr, &s, &delta);
        uint64_t got = (uint64_t)(k->field == 0 ? s.ra_off : s.cfa_off);
        if (st != CFI_STEP_END || got != k->want) {
            printf("%s: step %d, got %#" PRIx64 ", want %#" PRIx64 "\n", k->name, st, got,
                   k->want);
            failed = 1;
        }
    }
    if (!failed) printf("cfi scale ok\n");
    return failed;
}
