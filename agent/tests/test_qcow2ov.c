/* cmocka tests of qcow2ov.c: an image in memory, read through the same
 * callback the agent gives librbd's reads.  The header is the one QEMU
 * writes for an empty qcow2 image of 1 GiB (`qemu-img create -f qcow2 a
 * 1G`, QEMU 7.2, the same as the agent's blockdev-create of an overlay
 * with default options): L1 table of 2 entries at 0x30000. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2ov.h"

static const unsigned char real_header[104] = {
    0x51, 0x46, 0x49, 0xfb, 0x00, 0x00, 0x00, 0x03, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00,
    0x00, 0x00, 0, 0, 0, 0, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x00,
    0x00, 0x04, 0x00, 0x00, 0x00, 0x70,
};

#define IMG_SIZE (4u << 20)
#define L1_AT 0x30000

struct mem {
    unsigned char *b;
    size_t size;
    int fail_at_l1;         /* a read of the L1 table fails */
};

static int
mem_read(void *ctx, uint64_t off, size_t len, void *buf, char *err,
         size_t errlen)
{
    struct mem *m = ctx;

    if (off + len > m->size || (m->fail_at_l1 && off >= L1_AT)) {
        snprintf(err, errlen, "read at %llu failed", (unsigned long long)off);
        return -1;
    }
    memcpy(buf, m->b + off, len);
    return 0;
}

static struct mem *
image(void)
{
    struct mem *m = calloc(1, sizeof(*m));

    m->size = IMG_SIZE;
    m->b = calloc(1, IMG_SIZE);
    memcpy(m->b, real_header, sizeof(real_header));
    return m;
}

static void
mem_free(struct mem *m)
{
    free(m->b);
    free(m);
}

static int
check(struct mem *m, int *written, char *err)
{
    *written = -1;
    return qcow2ov_written(mem_read, m, m->size, written, err, 256);
}

static void
test_empty_overlay_holds_nothing(void **state)
{
    struct mem *m = image();
    char err[256];
    int w;

    (void)state;
    assert_int_equal(check(m, &w, err), 0);
    assert_int_equal(w, 0);
    mem_free(m);
}

static void
test_an_l1_entry_is_a_write(void **state)
{
    struct mem *m = image();
    char err[256];
    int w;

    (void)state;
    /* what `qemu-io -c "write -P 0xab 300M 64k"` left in the L1 table:
     * the second entry would be as good as the first */
    static const unsigned char e[8] = {0x80, 0, 0, 0, 0, 0x04, 0, 0};
    memcpy(m->b + L1_AT + 8, e, 8);
    assert_int_equal(check(m, &w, err), 0);
    assert_int_equal(w, 1);
    /* the COPIED flag alone (bit 63) names no L2 table */
    memset(m->b + L1_AT, 0, 16);
    m->b[L1_AT] = 0x80;
    assert_int_equal(check(m, &w, err), 0);
    assert_int_equal(w, 0);
    mem_free(m);
}

static void
test_never_formatted_holds_nothing(void **state)
{
    struct mem *m = image();
    char err[256];
    int w;

    (void)state;
    memset(m->b, 0, sizeof(real_header));
    assert_int_equal(check(m, &w, err), 0);
    assert_int_equal(w, 0);
    m->size = 10;               /* shorter than a header */
    assert_int_equal(check(m, &w, err), 0);
    assert_int_equal(w, 0);
    mem_free(m);
}

static void
test_unknown_content_is_an_error(void **state)
{
    struct mem *m = image();
    char err[256];
    int w;

    (void)state;
    m->b[0] = 'X';                          /* another magic */
    assert_int_equal(check(m, &w, err), -1);
    assert_non_null(strstr(err, "not a qcow2 image"));
    memcpy(m->b, real_header, sizeof(real_header));
    m->b[35] = 1;                           /* encrypted */
    assert_int_equal(check(m, &w, err), -1);
    memcpy(m->b, real_header, sizeof(real_header));
    m->b[43] = 0x80;                        /* L1 past the image's end */
    assert_int_equal(check(m, &w, err), -1);
    assert_non_null(strstr(err, "not inside the image"));
    memcpy(m->b, real_header, sizeof(real_header));
    m->b[47] = 0x08;                        /* L1 not cluster aligned */
    assert_int_equal(check(m, &w, err), -1);
    memcpy(m->b, real_header, sizeof(real_header));
    m->fail_at_l1 = 1;                      /* Ceph fails the read */
    assert_int_equal(check(m, &w, err), -1);
    assert_non_null(strstr(err, "read at"));
    mem_free(m);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_overlay_holds_nothing),
        cmocka_unit_test(test_an_l1_entry_is_a_write),
        cmocka_unit_test(test_never_formatted_holds_nothing),
        cmocka_unit_test(test_unknown_content_is_an_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
