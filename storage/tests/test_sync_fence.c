/* Unit tests of the fencing verdict: which copy may write into a DR image
 * that carries a fencing epoch (sync_fence.h's table), without Ceph. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "sync_engine.h"
#include "sync_fence.h"

static void
test_parse(void **state)
{
    uint64_t v = 99;

    (void)state;
    assert_int_equal(sync_fence_parse("0", &v), 0);
    assert_int_equal(v, 0);
    assert_int_equal(sync_fence_parse("17", &v), 0);
    assert_int_equal(v, 17);
    assert_int_equal(sync_fence_parse("9007199254740991", &v), 0);
    assert_true(v == SYNC_FENCE_MAX);
    v = 5;
    assert_int_equal(sync_fence_parse("9007199254740992", &v), -1);
    assert_int_equal(sync_fence_parse("18446744073709551616", &v), -1);
    assert_int_equal(sync_fence_parse("", &v), -1);
    assert_int_equal(sync_fence_parse(NULL, &v), -1);
    assert_int_equal(sync_fence_parse("-1", &v), -1);
    assert_int_equal(sync_fence_parse("+1", &v), -1);
    assert_int_equal(sync_fence_parse(" 1", &v), -1);
    assert_int_equal(sync_fence_parse("1 ", &v), -1);
    assert_int_equal(sync_fence_parse("0x10", &v), -1);
    assert_int_equal(v, 5);  /* untouched on error */
}

static void
test_no_key_writes(void **state)
{
    uint64_t e = 7;
    char err[256] = "";

    (void)state;
    assert_int_equal(sync_fence_judge("img", NULL, 0, &e, err, sizeof(err)), 0);
    assert_int_equal(e, 0);
    assert_string_equal(err, "");
}

static void
test_older_image_epoch_writes(void **state)
{
    uint64_t e = 0;
    char err[256] = "";

    (void)state;
    /* Live since epoch 1, demoted by the failback of epoch 2. */
    assert_int_equal(sync_fence_judge("img", "1", 2, &e, err, sizeof(err)), 0);
    assert_int_equal(e, 1);
}

static void
test_same_or_newer_epoch_is_refused(void **state)
{
    uint64_t e = 0;
    char err[256] = "";

    (void)state;
    /* The old primary (epoch 0) against the image failover 1 made live. */
    assert_int_equal(sync_fence_judge("vm1-disk0", "1", 0, &e, err,
                                      sizeof(err)), SYNC_EFENCED);
    assert_int_equal(e, 1);
    assert_non_null(strstr(err, "fenced: dr image vm1-disk0 is the live copy "
                                "since fencing epoch 1; this copy runs under "
                                "epoch 0"));
    /* The site that became active at 1 does not replicate into its own
     * live images either. */
    assert_int_equal(sync_fence_judge("img", "1", 1, &e, err, sizeof(err)),
                     SYNC_EFENCED);
    assert_int_equal(sync_fence_judge("img", "12", 3, &e, err, sizeof(err)),
                     SYNC_EFENCED);
    assert_int_equal(e, 12);
}

static void
test_malformed_is_refused(void **state)
{
    uint64_t e = 3;
    char err[256] = "";

    (void)state;
    assert_int_equal(sync_fence_judge("img", "two", 5, &e, err, sizeof(err)),
                     SYNC_EFENCED);
    assert_int_equal(e, 0);
    assert_non_null(strstr(err, "unreadable cutpoint.fencing_epoch 'two'"));
    assert_int_equal(sync_fence_judge("img", "", 5, &e, err, sizeof(err)),
                     SYNC_EFENCED);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_no_key_writes),
        cmocka_unit_test(test_older_image_epoch_writes),
        cmocka_unit_test(test_same_or_newer_epoch_is_refused),
        cmocka_unit_test(test_malformed_is_refused),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
