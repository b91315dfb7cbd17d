/*
 * cmocka tests of hold.c, the live cut's network hold, replaying what a
 * real QEMU answered (tests/qmp-replies/hold-*.txt, made by
 * `tests/record_qmp.py OUTDIR --hold`) over a socketpair: a VM with one
 * NIC (netdev net0) and a device without a netdev, and one with an
 * ivshmem device besides.  A hold_* call that asked QEMU something the
 * recording does not hold would get no answer and fail.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "fakepeer.h"
#include "hold.h"
#include "vm.h"

static struct cfg_vm cv;
static struct vm v;
static struct fakepeer_qmp r;

/* A qmp-driver VM whose monitor is the replay of files (after the
 * greeting and qmp_capabilities). */
static void
start(const char **files)
{
    const char *all[16] = {"greeting.txt", "capabilities.txt"};
    struct qmp_err err;
    int n = 2, fd;

    for (int i = 0; files[i]; i++)
        all[n++] = files[i];
    all[n] = NULL;
    memset(&cv, 0, sizeof(cv));
    snprintf(cv.name, sizeof(cv.name), "vm1");
    snprintf(cv.driver, sizeof(cv.driver), "qmp");
    snprintf(cv.qmp, sizeof(cv.qmp), "/nonexistent/qmp.sock");
    cv.method = CFG_METHOD_QMP;
    assert_int_equal(vm_open(&v, &cv, NULL), 0);
    fd = fakepeer_qmp_start(&r, all, 0, -1);
    assert_int_equal(qmp_open_fd((struct qmp_conn *)v.priv, fd, 2000, &err), 0);
}

static void
finish(void)
{
    vm_close(&v);       /* closes the client's end: the peer returns */
    fakepeer_qmp_finish(&r);
    assert_int_equal(r.mismatches, 0);
}

static void
test_ready_adds_a_filter_per_nic(void **state)
{
    const char *files[] = {"hold-list-nic.txt", "hold-add.txt", NULL};
    char why[256] = "";

    (void)state;
    start(files);
    assert_int_equal(hold_ready(&v, 1000, why, sizeof(why)), 1);
    assert_int_equal(v.nhold, 1);
    assert_string_equal(v.hold_id[0], HOLD_ID_PREFIX "net0");
    /* made once: asked again, it asks QEMU nothing */
    assert_int_equal(hold_ready(&v, 1000, why, sizeof(why)), 1);
    finish();
}

static void
test_an_earlier_runs_filter_is_taken_over(void **state)
{
    const char *files[] = {"hold-list-nic.txt", "hold-taken-over.txt", NULL};
    char why[256] = "";

    (void)state;
    start(files);
    assert_int_equal(hold_ready(&v, 1000, why, sizeof(why)), 1);
    assert_int_equal(v.nhold, 1);
    finish();
}

static void
test_ivshmem_is_not_held(void **state)
{
    const char *files[] = {"hold-list-ivshmem.txt", NULL};
    char why[256] = "";

    (void)state;
    start(files);
    assert_int_equal(hold_ready(&v, 1000, why, sizeof(why)), 0);
    assert_non_null(strstr(why, "ivshmem-plain"));
    assert_int_equal(v.hold_state, -1);
    /* not looked at again before VM_HOLD_TTL_MS: the same why, no QMP */
    why[0] = '\0';
    assert_int_equal(hold_ready(&v, 1000, why, sizeof(why)), 0);
    assert_non_null(strstr(why, "ivshmem-plain"));
    finish();
}

static void
test_on_then_off(void **state)
{
    const char *files[] = {"hold-list-nic.txt", "hold-add.txt",
                           "hold-on-off.txt", NULL};
    struct qmp_err err;
    char why[256];

    (void)state;
    start(files);
    assert_int_equal(hold_ready(&v, 1000, why, sizeof(why)), 1);
    assert_int_equal(hold_on(&v, 1000, &err), 0);
    assert_int_equal(hold_off(&v, 1000, &err), 0);
    finish();
}

static void
test_after_a_restart_the_filters_are_found_by_name(void **state)
{
    const char *files[] = {"hold-discover.txt", NULL};
    struct qmp_err err;

    (void)state;
    start(files);
    /* this run made none (hold_state 0): listed under /objects */
    assert_int_equal(hold_off(&v, 1000, &err), 0);
    finish();
}

static void
test_a_filter_gone_with_its_qemu(void **state)
{
    const char *on[] = {"hold-gone.txt", NULL};
    struct qmp_err err;

    (void)state;
    start(on);
    v.hold_state = 1;
    v.nhold = 1;
    snprintf(v.hold_id[0], sizeof(v.hold_id[0]), HOLD_ID_PREFIX "gone");
    /* refused: nothing held, and the next prepare looks at the VM again */
    assert_int_equal(hold_on(&v, 1000, &err), -1);
    assert_int_equal(err.kind, QMP_E_ERROR);
    assert_int_equal(v.hold_state, 0);
    finish();
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ready_adds_a_filter_per_nic),
        cmocka_unit_test(test_an_earlier_runs_filter_is_taken_over),
        cmocka_unit_test(test_ivshmem_is_not_held),
        cmocka_unit_test(test_on_then_off),
        cmocka_unit_test(test_after_a_restart_the_filters_are_found_by_name),
        cmocka_unit_test(test_a_filter_gone_with_its_qemu),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
