/*
 * cmocka tests of lvcall.c: a call that does not answer by its deadline
 * fails in time (LVCALL_TIMEOUT), its slot stays busy (LVCALL_BUSY, no
 * second thread) until the abandoned call returns, which then frees what
 * it got and records how it ended.  The "libvirt call" here is a function
 * that waits on a pipe, standing for libvirtd or QEMU not answering.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lvcall.h"
#include "mono.h"

static int gate[2];     /* a byte written to gate[1] lets the call return */
static int dropped;

struct arg {
    int value;
    char *got;          /* what the call hands back */
};

static int
slow_call(virConnectPtr conn, void *p)
{
    struct arg *a = p;
    char c;

    (void)conn;
    if (read(gate[0], &c, 1) != 1)
        return -1;
    a->value = 42;
    a->got = strdup("reply");
    return 0;
}

static void
drop(void *p)
{
    free(((struct arg *)p)->got);
    dropped++;
}

static void
test_answer_in_time(void **state)
{
    struct lvcall_slot slot;
    struct lvcall_err e;
    struct arg a = {0};

    (void)state;
    lvcall_slot_init(&slot);
    assert_int_equal(pipe(gate), 0);
    assert_int_equal(write(gate[1], "x", 1), 1);
    assert_int_equal(lvcall_run(&slot, "call", NULL, slow_call, &a,
                                sizeof(a), drop, 2000, &e), 0);
    assert_int_equal(a.value, 42);
    assert_string_equal(a.got, "reply");
    free(a.got);
    assert_int_equal(lvcall_slot_busy(&slot), 0);
    close(gate[0]);
    close(gate[1]);
}

static void
test_deadline_then_busy_then_late_answer(void **state)
{
    struct lvcall_slot slot;
    struct lvcall_err e;
    struct arg a = {0};
    double t0, end;

    (void)state;
    lvcall_slot_init(&slot);
    dropped = 0;
    assert_int_equal(pipe(gate), 0);
    t0 = mono_ms();
    assert_int_equal(lvcall_run(&slot, "virDomainSuspend", NULL, slow_call,
                                &a, sizeof(a), drop, 200, &e), -1);
    assert_true(mono_ms() - t0 >= 190 && mono_ms() - t0 < 1000);
    assert_int_equal(e.kind, LVCALL_TIMEOUT);
    assert_non_null(strstr(e.msg, "virDomainSuspend: no answer from libvirt "
                           "within 200 ms"));
    assert_int_equal(a.value, 0);               /* untouched */
    /* the worker still hangs: the next call fails at once, no thread */
    assert_int_equal(lvcall_slot_busy(&slot), 1);
    t0 = mono_ms();
    assert_int_equal(lvcall_run(&slot, "virDomainResume", NULL, slow_call,
                                &a, sizeof(a), drop, 2000, &e), -1);
    assert_true(mono_ms() - t0 < 100);
    assert_int_equal(e.kind, LVCALL_BUSY);
    assert_non_null(strstr(e.msg, "an earlier virDomainSuspend has not "
                           "returned"));
    /* the hung call returns: the slot frees, what it got is dropped */
    assert_int_equal(write(gate[1], "x", 1), 1);
    end = mono_ms() + 2000;
    while (lvcall_slot_busy(&slot) && mono_ms() < end)
        usleep(1000);
    assert_int_equal(lvcall_slot_busy(&slot), 0);
    assert_int_equal(dropped, 1);
    assert_int_equal(slot.late.seq, 1);          /* the abandoned call */
    assert_int_equal(slot.late.kind, LVCALL_OK);
    close(gate[0]);
    close(gate[1]);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_answer_in_time),
        cmocka_unit_test(test_deadline_then_busy_then_late_answer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
