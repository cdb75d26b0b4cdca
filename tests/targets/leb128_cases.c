/* leb128_cases: LEB128 edge cases through the CFI interpreter's cursors (native/cfi_eval.h:
 * cfi_uleb, cfi_sleb, cfi_encoded), whose decoder (native/leb128.h) the DWARF reader shares.
 * Built by tests/system/test_leb128.py with -fsanitize=undefined -fno-sanitize-recover (and
 * address): undefined behaviour, or a read past the input, ends it with an error.  Each
 * input is copied to a block of exactly its size.  Prints "leb128 ok" and exits 0, or
 * names each failed case and exits 1. */
#include "cfi_eval.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    const char *name;
    int is_signed;
    size_t len;
    uint8_t bytes[24];
    int ok;         /* 0: truncated, the cursor goes bad */
    uint64_t value; /* signed cases: the two's complement bits */
    size_t used;    /* bytes consumed */
} leb_case;

#define FF8 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff
#define Z8 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80

static const leb_case CASES[] = {
    {"u 0", 0, 1, {0x00}, 1, 0, 1},
    {"u 127", 0, 1, {0x7f}, 1, 127, 1},
    {"u 128", 0, 2, {0x80, 0x01}, 1, 128, 2},
    {"u 624485", 0, 3, {0xe5, 0x8e, 0x26}, 1, 624485, 3},
    {"u stops at its last byte", 0, 3, {0x02, 0x7f, 0x7f}, 1, 2, 1},
    {"u max (10 bytes)", 0, 10, {FF8, 0xff, 0x01}, 1, UINT64_MAX, 10},
    {"u 2^63 (10 bytes)", 0, 10, {Z8, 0x80, 0x01}, 1, UINT64_C(1) << 63, 10},
    {"u 10th byte's high bits dropped", 0, 10, {FF8, 0xff, 0x7f}, 1, UINT64_MAX, 10},
    {"u overlong 0 (11 bytes)", 0, 11, {Z8, 0x80, 0x80, 0x00}, 1, 0, 11},
    {"u overlong 5 (12 bytes)", 0, 12, {0x85, Z8, 0x80, 0x80, 0x00}, 1, 5, 12},
    {"u 21 bytes of ones", 0, 21, {FF8, FF8, 0xff, 0xff, 0xff, 0xff, 0x01}, 1, UINT64_MAX, 21},
    {"u empty", 0, 0, {0}, 0, 0, 0},
    {"u truncated", 0, 2, {0x80, 0x80}, 0, 0, 2},
    {"u truncated after 10 bytes", 0, 10, {FF8, 0xff, 0xff}, 0, 0, 10},

    {"s 0", 1, 1, {0x00}, 1, 0, 1},
    {"s 63", 1, 1, {0x3f}, 1, 63, 1},
    {"s -64", 1, 1, {0x40}, 1, (uint64_t)-64, 1},
    {"s 0x7f is -1", 1, 1, {0x7f}, 1, UINT64_MAX, 1},
    {"s 127", 1, 2, {0xff, 0x00}, 1, 127, 2},
    {"s -128", 1, 2, {0x80, 0x7f}, 1, (uint64_t)-128, 2},
    {"s -123456", 1, 3, {0xc0, 0xbb, 0x78}, 1, (uint64_t)-123456, 3},
    /* 9 bytes carry 63 bits: the sign extends by one bit, from bit 63 (was 1 << 63, signed) */
    {"s -2^62 (9 bytes)", 1, 9, {Z8, 0x40}, 1, (uint64_t)0 - (UINT64_C(1) << 62), 9},
    {"s -1 (9 bytes)", 1, 9, {FF8, 0x7f}, 1, UINT64_MAX, 9},
    {"s 2^62-1 (9 bytes)", 1, 9, {FF8, 0x3f}, 1, (UINT64_C(1) << 62) - 1, 9},
    {"s int64 max (10 bytes)", 1, 10, {FF8, 0xff, 0x00}, 1, (uint64_t)INT64_MAX, 10},
    {"s int64 min (10 bytes)", 1, 10, {Z8, 0x80, 0x7f}, 1, (uint64_t)1 << 63, 10},
    {"s -1 (10 bytes)", 1, 10, {FF8, 0xff, 0x7f}, 1, UINT64_MAX, 10},
    {"s overlong -1 (11 bytes)", 1, 11, {FF8, 0xff, 0xff, 0x7f}, 1, UINT64_MAX, 11},
    {"s overlong 0 (11 bytes)", 1, 11, {Z8, 0x80, 0x80, 0x00}, 1, 0, 11},
    {"s overlong -2 (12 bytes)", 1, 12, {0xfe, FF8, 0xff, 0xff, 0x7f}, 1, (uint64_t)-2, 12},
    {"s empty", 1, 0, {0}, 0, 0, 0},
    {"s truncated", 1, 1, {0xff}, 0, 0, 1},
    {"s truncated after 9 bytes", 1, 9, {FF8, 0xff}, 0, 0, 9},
};

static int failures;

static void fail(const char *name, const char *what, uint64_t got, uint64_t want) {
    printf("FAIL %s: %s %#" PRIx64 ", expected %#" PRIx64 "\n", name, what, got, want);
    failures++;
}

int main(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const leb_case *k = &CASES[i];
        uint8_t *block = malloc(k->len ? k->len : 1);
        if (block == NULL) return 2;
        memcpy(block, k->bytes, k->len);
        cfi_cursor c = {block, block + k->len, 0};
        uint64_t got = k->is_signed ? (uint64_t)cfi_sleb(&c) : cfi_uleb(&c);
        if (c.bad != !k->ok) fail(k->name, "bad", (uint64_t)c.bad, (uint64_t)!k->ok);
        if (got != k->value) fail(k->name, "value", got, k->value);
        if ((size_t)(c.p - block) != k->used)
            fail(k->name, "bytes used", (uint64_t)(c.p - block), k->used);
        /* A cursor already bad reads nothing more. */
        cfi_cursor b = {block, block + k->len, 1};
        got = k->is_signed ? (uint64_t)cfi_sleb(&b) : cfi_uleb(&b);
        if (got != 0 || !b.bad) fail(k->name, "read from a bad cursor", got, 0);
        free(block);
    }

    /* A cursor moved past its end by a caller (skipping an operand) reads nothing. */
    uint8_t bytes[4] = {0x01, 0x02, 0x03, 0x04};
    cfi_cursor past = {bytes + 3, bytes + 2, 0};
    uint64_t got = cfi_uleb(&past);
    if (got != 0 || !past.bad || past.p != bytes + 3) fail("u past end", "value", got, 0);
    past = (cfi_cursor){bytes + 3, bytes + 2, 0};
    got = (uint64_t)cfi_sleb(&past);
    if (got != 0 || !past.bad || past.p != bytes + 3) fail("s past end", "value", got, 0);

    /* Numbers in a row: each read leaves the cursor at the next one. */
    const uint8_t row[] = {0x7f, 0xff, 0x00, Z8, 0x40, 0xe5, 0x8e, 0x26};
    cfi_cursor c = {row, row + sizeof row, 0};
    if ((got = (uint64_t)cfi_sleb(&c)) != UINT64_MAX) fail("row 1", "value", got, UINT64_MAX);
    if ((got = (uint64_t)cfi_sleb(&c)) != 127) fail("row 2", "value", got, 127);
    uint64_t want = (uint64_t)0 - (UINT64_C(1) << 62);
    if ((got = (uint64_t)cfi_sleb(&c)) != want) fail("row 3", "value", got, want);
    if ((got = cfi_uleb(&c)) != 624485) fail("row 4", "value", got, 624485);
    if (c.bad || c.p != row + sizeof row) fail("row", "end", (uint64_t)c.bad, 0);

    /* DW_EH_PE_sleb128 pointers decode through cfi_sleb. */
    const uint8_t enc[] = {FF8, 0x7f};
    c = (cfi_cursor){enc, enc + sizeof enc, 0};
    if ((got = cfi_encoded(&c, 0x09, 0, 0)) != UINT64_MAX || c.bad)
        fail("DW_EH_PE_sleb128", "value", got, UINT64_MAX);

    if (failures) return 1;
    puts("leb128 ok");
    return 0;
}
