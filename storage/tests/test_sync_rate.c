/* Unit tests of the rate limiter: pure arithmetic on a virtual clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sync_rate.h"

#define SEC 1000000000ULL

static void
test_unlimited(void **state)
{
    struct sync_rate r;

    (void)state;
    sync_rate_init(&r, 0, 0);
    assert_int_equal(sync_rate_take(&r, 0, 1u << 30), 0);
    assert_int_equal(sync_rate_take(&r, 1, 1u << 30), 0);
}

static void
test_paces_exactly(void **state)
{
    struct sync_rate r;

    (void)state;
    /* 1 MB/s, no burst: 500 kB must wait 0.5 s, the next 500 kB sent at
     * the same instant waits 1 s in total. */
    sync_rate_init(&r, 1000000, 0);
    assert_int_equal(sync_rate_take(&r, 10 * SEC, 500000), SEC / 2);
    assert_int_equal(sync_rate_take(&r, 10 * SEC, 500000), SEC);
    /* A sender that slept as told waits again for its own bytes only. */
    assert_int_equal(sync_rate_take(&r, 11 * SEC, 250000), SEC / 4);
}

static void
test_idle_earns_no_flood(void **state)
{
    struct sync_rate r;

    (void)state;
    sync_rate_init(&r, 1000000, 0);
    assert_int_equal(sync_rate_take(&r, 0, 1000000), SEC);
    /* After 100 s idle the next megabyte still costs a second. */
    assert_int_equal(sync_rate_take(&r, 101 * SEC, 1000000), SEC);
}

static void
test_burst(void **state)
{
    struct sync_rate r;

    (void)state;
    sync_rate_init(&r, 1000000, SEC / 10);
    /* 100 kB fits in the 0.1 s burst; the next 100 kB does not. */
    assert_int_equal(sync_rate_take(&r, 5 * SEC, 100000), 0);
    assert_int_equal(sync_rate_take(&r, 5 * SEC, 100000), SEC / 10);
}

static void
test_long_run_average(void **state)
{
    struct sync_rate r;
    uint64_t t = 0;
    int i;

    (void)state;
    /* 1000 chunks of 4 MiB at 8 MB/s take 524.288 s of virtual time. */
    sync_rate_init(&r, 8000000, 0);
    for (i = 0; i < 1000; i++)
        t += sync_rate_take(&r, t, 4u << 20);
    assert_int_equal(t, 524288000000ULL);
}

static void
test_odd_rate_no_overflow(void **state)
{
    struct sync_rate r;

    (void)state;
    /* A huge debit at a tiny rate must not wrap around. */
    sync_rate_init(&r, 3, 0);
    assert_int_equal(sync_rate_take(&r, 0, 3000000000ULL), 1000000000ULL * SEC);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unlimited),
        cmocka_unit_test(test_paces_exactly),
        cmocka_unit_test(test_idle_earns_no_flood),
        cmocka_unit_test(test_burst),
        cmocka_unit_test(test_long_run_average),
        cmocka_unit_test(test_odd_rate_no_overflow),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
