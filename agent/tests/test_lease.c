/* cmocka tests of txn.c: the lease and transaction states, on a fake clock. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "txn.h"

static double fake_now;

static double
fake_clock(void *opaque)
{
    (void)opaque;
    return fake_now;
}

static struct txn_table tab;

static int
setup(void **state)
{
    (void)state;
    fake_now = 1000.0;
    txn_table_init(&tab, fake_clock, NULL);
    return 0;
}

static int
teardown(void **state)
{
    (void)state;
    txn_table_clear(&tab);
    return 0;
}

static struct txn *
prepare(const char *id, const char *vm1, const char *vm2, double lease)
{
    const char *vms[2] = {vm1, vm2};
    const char *code = NULL;
    char msg[128];
    struct txn *x = txn_begin_prepare(&tab, id, vms, vm2 ? 2 : 1, &code, msg,
                                      sizeof(msg));
    if (x)
        txn_prepared(&tab, x, lease, json_object());
    return x;
}

static void
test_lease_expires_on_time(void **state)
{
    struct txn *x;

    (void)state;
    assert_true(lease_next_in(&tab) < 0);          /* nothing armed */
    x = prepare("t1", "vm1", "vm2", 500);
    assert_non_null(x);
    assert_int_equal(x->state, TXN_PREPARED);
    assert_true(lease_next_in(&tab) == 500);
    fake_now += 499.9;
    assert_null(lease_claim_due(&tab));
    fake_now += 0.1;                               /* exactly the deadline */
    assert_ptr_equal(lease_claim_due(&tab), x);
    assert_int_equal(x->state, TXN_EXPIRING);
    assert_null(lease_claim_due(&tab));            /* claimed only once */
    txn_finish_expire(&tab, x);
    assert_int_equal(x->state, TXN_EXPIRED);
    /* a late commit must not be able to claim it */
    assert_int_equal(txn_claim_commit(&tab, x), TXN_CLAIM_NONE);
    assert_true(lease_next_in(&tab) < 0);
}

static void
test_commit_before_deadline_disarms(void **state)
{
    struct txn *x;

    (void)state;
    x = prepare("t1", "vm1", NULL, 100);
    fake_now += 99;
    assert_int_equal(txn_claim_commit(&tab, x), TXN_CLAIM_COMMIT);
    assert_int_equal(x->state, TXN_COMMITTING);
    fake_now += 10000;                             /* long snapshot */
    assert_null(lease_claim_due(&tab));            /* lease no longer fires */
    txn_finish_commit(&tab, x, json_object(), NULL, NULL);
    assert_int_equal(x->state, TXN_COMMITTED);
}

static void
test_commit_after_deadline_expires(void **state)
{
    struct txn *x;

    (void)state;
    /* the reaper has not run yet, but the deadline has passed: the commit
     * must not win the race */
    x = prepare("t1", "vm1", NULL, 100);
    fake_now += 100;
    assert_int_equal(txn_claim_commit(&tab, x), TXN_CLAIM_EXPIRE);
    assert_int_equal(x->state, TXN_EXPIRING);
    assert_null(lease_claim_due(&tab));
}

static void
test_busy_and_independent_leases(void **state)
{
    struct txn *a, *b;
    const char *vms[] = {"vm2"};
    const char *code = NULL;
    char msg[128];

    (void)state;
    a = prepare("a", "vm1", "vm2", 300);
    assert_null(txn_begin_prepare(&tab, "b", vms, 1, &code, msg, sizeof(msg)));
    assert_string_equal(code, "BUSY");
    assert_non_null(strstr(msg, "vm2"));
    fake_now += 100;
    b = prepare("b", "vm3", NULL, 100);
    assert_non_null(b);
    assert_true(lease_next_in(&tab) == 100);      /* b is due first */
    fake_now += 100;
    assert_ptr_equal(lease_claim_due(&tab), b);
    txn_finish_expire(&tab, b);
    assert_null(lease_claim_due(&tab));            /* a still has 100 ms */
    fake_now += 100;
    assert_ptr_equal(lease_claim_due(&tab), a);
    txn_finish_expire(&tab, a);
    /* vm2 is free again once a is finished */
    assert_non_null(prepare("c", "vm2", NULL, 10));
}

static void
test_failed_prepare_forgets(void **state)
{
    const char *vms[] = {"vm1"};
    const char *code;
    char msg[64];
    struct txn *x;

    (void)state;
    x = txn_begin_prepare(&tab, "t", vms, 1, &code, msg, sizeof(msg));
    txn_fail_prepare(&tab, x);
    assert_null(txn_find(&tab, "t"));
    assert_true(lease_next_in(&tab) < 0);
}

static void
test_abort_unknown_and_gc(void **state)
{
    struct txn *x;

    (void)state;
    struct txn *y;
    int was;

    x = txn_begin_abort(&tab, "ghost", &was);
    assert_non_null(x);
    assert_false(was);
    assert_int_equal(x->state, TXN_ABORTING);
    txn_finish_abort(&tab, x);
    assert_int_equal(x->state, TXN_ABORTED);
    assert_ptr_equal(txn_find(&tab, "ghost"), x);
    x = prepare("t", "vm1", NULL, 50);
    assert_ptr_equal(txn_begin_abort(&tab, "t", &was), x);
    assert_true(was);
    /* while aborting, vm1 is still taken: a new prepare must wait */
    {
        const char *vms[] = {"vm1"};
        const char *code;
        char msg[64];
        assert_null(txn_begin_prepare(&tab, "u", vms, 1, &code, msg,
                                      sizeof(msg)));
    }
    fake_now += 100;
    assert_null(lease_claim_due(&tab));            /* aborting: no lease */
    /* a second abort while the first runs is told to wait */
    assert_null(txn_begin_abort(&tab, "t", &was));
    txn_finish_abort(&tab, x);
    y = txn_begin_abort(&tab, "t", &was);          /* idempotent */
    assert_ptr_equal(y, x);
    assert_false(was);
    txn_finish_abort(&tab, y);
    /* ghost finished 100 ms before t: each goes at its own time */
    fake_now += TXN_KEEP_MS - 1;
    assert_int_equal(txn_gc(&tab), 1);
    assert_non_null(txn_find(&tab, "t"));
    fake_now += 2;
    assert_int_equal(txn_gc(&tab), 1);
    assert_null(txn_find(&tab, "ghost"));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_lease_expires_on_time, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_commit_before_deadline_disarms,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_commit_after_deadline_expires,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_busy_and_independent_leases,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_prepare_forgets, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_abort_unknown_and_gc, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
