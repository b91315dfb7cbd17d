/* Unit tests of the per-extent checksum and the streaming image hash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "sync_digest.h"

/* FIPS 180-2 test vectors. */
static void
test_vectors(void **state)
{
    unsigned char d[SYNC_DIGEST_LEN];
    char hex[SYNC_DIGEST_HEX];

    (void)state;
    assert_int_equal(sync_digest_buf("abc", 3, d), 0);
    sync_digest_hex(d, hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223"
                             "b00361a396177a9cb410ff61f20015ad");
    assert_int_equal(sync_digest_buf("", 0, d), 0);
    sync_digest_hex(d, hex);
    assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb924"
                             "27ae41e4649b934ca495991b7852b855");
}

/* Hashing in pieces equals hashing at once (the full-image hash feeds
 * chunks in offset order). */
static void
test_stream_equals_oneshot(void **state)
{
    size_t n = 3 * 1024 * 1024 + 17, i, off;
    unsigned char *buf = malloc(n), a[SYNC_DIGEST_LEN], b[SYNC_DIGEST_LEN];
    struct sync_hash *h = sync_hash_new();

    (void)state;
    assert_non_null(buf);
    assert_non_null(h);
    for (i = 0; i < n; i++)
        buf[i] = (unsigned char)(i * 2654435761u >> 13);
    assert_int_equal(sync_digest_buf(buf, n, a), 0);
    for (off = 0; off < n; off += 65537)
        assert_int_equal(sync_hash_update(h, buf + off,
                                          n - off < 65537 ? n - off : 65537),
                         0);
    assert_int_equal(sync_hash_final(h, b), 0);
    assert_memory_equal(a, b, SYNC_DIGEST_LEN);
    /* One flipped bit changes the checksum. */
    buf[n / 2] ^= 1;
    assert_int_equal(sync_digest_buf(buf, n, b), 0);
    assert_memory_not_equal(a, b, SYNC_DIGEST_LEN);
    sync_hash_free(h);
    free(buf);
}

static void
test_free_null(void **state)
{
    (void)state;
    sync_hash_free(NULL);
}

static void
test_is_zero(void **state)
{
    static unsigned char z[8192];

    (void)state;
    assert_true(sync_buf_is_zero(z, 0));
    assert_true(sync_buf_is_zero(z, sizeof(z)));
    z[0] = 1;
    assert_false(sync_buf_is_zero(z, sizeof(z)));
    z[0] = 0;
    z[sizeof(z) - 1] = 0x80;
    assert_false(sync_buf_is_zero(z, sizeof(z)));
    assert_true(sync_buf_is_zero(z, sizeof(z) - 1));
    z[sizeof(z) - 1] = 0;
}

/*
 * CRC-32C in Ceph's convention: standard CRC-32C is the raw update from
 * 0xffffffff, inverted.  "123456789" has the standard check value
 * 0xe3069283 (RFC 3720 B.4); an odd length and offset exercise the tail.
 */
static void
test_crc32c(void **state)
{
    static const char nine[] = "123456789";
    unsigned char big[4099];
    uint32_t whole, split;
    size_t i;

    (void)state;
    assert_int_equal(~sync_crc32c(0xffffffffu, nine, 9), 0xe3069283u);
    assert_int_equal(~sync_crc32c_portable(0xffffffffu, nine, 9),
                     0xe3069283u);
    assert_int_equal(sync_crc32c(0xffffffffu, "", 0), 0xffffffffu);
    for (i = 0; i < sizeof(big); i++)
        big[i] = (unsigned char)(i * 7 + 3);
    whole = sync_crc32c(0xffffffffu, big, sizeof(big));
    split = sync_crc32c(sync_crc32c(0xffffffffu, big, 1001), big + 1001,
                        sizeof(big) - 1001);
    assert_int_equal(whole, split);
    assert_int_equal(whole, sync_crc32c_portable(0xffffffffu, big,
                                                 sizeof(big)));
    big[4000] ^= 0x10;
    assert_int_not_equal(whole, sync_crc32c(0xffffffffu, big, sizeof(big)));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors),
        cmocka_unit_test(test_stream_equals_oneshot),
        cmocka_unit_test(test_free_null),
        cmocka_unit_test(test_is_zero),
        cmocka_unit_test(test_crc32c),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
