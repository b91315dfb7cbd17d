/* Unit tests of the work-list arithmetic (tables of offset, length). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "sync_extents.h"

#define D SYNC_DATA
#define Z SYNC_ZERO

struct ext { uint64_t off, len; int kind; };

static void
fill(struct sync_extents *l, const struct ext *t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        assert_int_equal(sync_extents_add(l, t[i].off, t[i].len, t[i].kind),
                         0);
}

static void
expect(const struct sync_extents *l, const struct ext *t, size_t n)
{
    assert_int_equal(l->n, n);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(l->v[i].off, t[i].off);
        assert_int_equal(l->v[i].len, t[i].len);
        assert_int_equal(l->v[i].kind, t[i].kind);
    }
}

static void
test_normalize_merges(void **state)
{
    static const struct ext in[] = {
        {100, 50, D}, {0, 10, D}, {10, 10, D}, {150, 10, D}, {160, 5, Z},
        {300, 10, Z}, {305, 20, Z}, {0, 5, D},
    };
    static const struct ext out[] = {
        {0, 20, D}, {100, 60, D}, {160, 5, Z}, {300, 25, Z},
    };
    struct sync_extents l = {0};

    (void)state;
    fill(&l, in, sizeof(in) / sizeof(in[0]));
    assert_int_equal(sync_extents_add(&l, 999, 0, D), 0);   /* ignored */
    assert_int_equal(sync_extents_normalize(&l), 0);
    expect(&l, out, sizeof(out) / sizeof(out[0]));
    assert_int_equal(sync_extents_bytes(&l, 0), 110);
    assert_int_equal(sync_extents_bytes(&l, D), 80);
    assert_int_equal(sync_extents_bytes(&l, Z), 30);
    sync_extents_clear(&l);
    sync_extents_clear(NULL);
}

static void
test_normalize_rejects_kind_overlap(void **state)
{
    struct sync_extents l = {0};

    (void)state;
    assert_int_equal(sync_extents_add(&l, 0, 100, D), 0);
    assert_int_equal(sync_extents_add(&l, 50, 100, Z), 0);
    assert_int_equal(sync_extents_normalize(&l), -1);
    sync_extents_clear(&l);
}

static void
test_uncovered(void **state)
{
    static const struct ext base[] = {
        {100, 100, D}, {300, 50, Z}, {1000, 10, D},
    };
    static const struct ext extra[] = {
        {0, 50, Z},       /* entirely outside base */
        {90, 300, Z},     /* straddles two base extents */
        {1000, 10, Z},    /* exactly covered */
        {2000, 1, Z},
    };
    static const struct ext out[] = {
        {0, 50, D}, {90, 10, D}, {200, 100, D}, {350, 40, D}, {2000, 1, D},
    };
    struct sync_extents b = {0}, e = {0}, o = {0};

    (void)state;
    fill(&b, base, 3);
    fill(&e, extra, 4);
    assert_int_equal(sync_extents_uncovered(&b, &e, D, &o), 0);
    expect(&o, out, sizeof(out) / sizeof(out[0]));
    sync_extents_clear(&o);
    /* Nothing uncovered when extra is a subset of base. */
    sync_extents_clear(&e);
    assert_int_equal(sync_extents_add(&e, 120, 30, Z), 0);
    assert_int_equal(sync_extents_uncovered(&b, &e, D, &o), 0);
    assert_int_equal(o.n, 0);
    sync_extents_clear(&b);
    sync_extents_clear(&e);
    sync_extents_clear(&o);
}

static void
test_split_aligned(void **state)
{
    static const struct ext in[] = {{1000, 9000, D}, {12288, 4096, Z}};
    static const struct ext out[] = {
        {1000, 3096, D}, {4096, 4096, D}, {8192, 1808, D}, {12288, 4096, Z},
    };
    struct sync_extents i = {0}, o = {0};

    (void)state;
    fill(&i, in, 2);
    assert_int_equal(sync_extents_split(&i, 4096, &o), 0);
    expect(&o, out, sizeof(out) / sizeof(out[0]));
    assert_int_equal(sync_extents_split(&i, 0, &o), -1);
    sync_extents_clear(&i);
    sync_extents_clear(&o);
}

static void
test_add_rejects_wrap(void **state)
{
    struct sync_extents l = {0};

    (void)state;
    assert_int_equal(sync_extents_add(&l, UINT64_MAX - 1, 10, D), -1);
    sync_extents_clear(&l);
}

/*
 * A sparse object written at a few places reads as zeroes elsewhere: only
 * the non-zero blocks are data.  The extent starts and ends off a block
 * boundary; a block with a single non-zero byte is data.
 */
static void
test_add_runs_zero_blocks(void **state)
{
    static char buf[6 * 4096];
    static const struct ext out[] = {
        {1000, 3096, Z}, {4096, 4096, D}, {8192, 8192, Z},
        {16384, 4096, D}, {20480, 4096, Z}, {24576, 1000, D},
    };
    struct sync_extents o = {0};

    (void)state;
    memset(buf, 0, sizeof(buf));
    /* buf[k] holds image offset 1000 + k. */
    buf[4096 - 1000 + 7] = 1;            /* block 4096 */
    buf[16384 - 1000 + 4095] = 2;        /* last byte of block 16384 */
    buf[24576 - 1000 + 999] = 3;         /* partial last block */
    assert_int_equal(sync_extents_add_runs(&o, buf, 1000, 24576, 4096), 0);
    expect(&o, out, sizeof(out) / sizeof(out[0]));
    sync_extents_clear(&o);
    /* All zero: one ZERO run; no zero byte: one DATA run. */
    memset(buf, 0, sizeof(buf));
    assert_int_equal(sync_extents_add_runs(&o, buf, 0, 8192, 4096), 0);
    expect(&o, (const struct ext[]){{0, 8192, Z}}, 1);
    sync_extents_clear(&o);
    memset(buf, 0x5a, sizeof(buf));
    assert_int_equal(sync_extents_add_runs(&o, buf, 4090, 9000, 4096), 0);
    expect(&o, (const struct ext[]){{4090, 9000, D}}, 1);
    assert_int_equal(sync_extents_add_runs(&o, buf, 0, 10, 0), -1);
    sync_extents_clear(&o);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_normalize_merges),
        cmocka_unit_test(test_normalize_rejects_kind_overlap),
        cmocka_unit_test(test_uncovered),
        cmocka_unit_test(test_split_aligned),
        cmocka_unit_test(test_add_rejects_wrap),
        cmocka_unit_test(test_add_runs_zero_blocks),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
