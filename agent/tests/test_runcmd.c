/* cmocka tests of runcmd.c: argv splitting and bounded command runs. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runcmd.h"

static void
test_split(void **state)
{
    char buf[256], *argv[RUNCMD_MAX_ARGS];

    (void)state;
    assert_int_equal(runcmd_split("/bin/echo  a\tb ", buf, sizeof(buf), argv,
                                 RUNCMD_MAX_ARGS), 3);
    assert_string_equal(argv[0], "/bin/echo");
    assert_string_equal(argv[2], "b");
    assert_null(argv[3]);
    /* no PATH search, no empty command, no shell quoting */
    assert_int_equal(runcmd_split("echo a", buf, sizeof(buf), argv,
                                 RUNCMD_MAX_ARGS), -1);
    assert_int_equal(runcmd_split("   ", buf, sizeof(buf), argv,
                                 RUNCMD_MAX_ARGS), -1);
    assert_int_equal(runcmd_split("/bin/echo 'a b'", buf, sizeof(buf), argv,
                                 RUNCMD_MAX_ARGS), 3);
    assert_string_equal(argv[1], "'a");
    /* too many words for argv */
    assert_int_equal(runcmd_split("/bin/x 1 2 3", buf, sizeof(buf), argv, 4),
                     -1);
    assert_int_equal(runcmd_split("/bin/x", buf, 3, argv, 4), -1);
}

static void
test_exit_code_and_output(void **state)
{
    char *argv[] = {"/bin/sh", "-c", "echo to-out; echo to-err >&2; exit 3",
                    NULL};
    struct runcmd_result r;
    char err[256] = "";

    (void)state;
    assert_int_equal(runcmd_run(argv, 10000, &r, err, sizeof(err)), 0);
    assert_int_equal(r.exit_code, 3);
    assert_int_equal(r.timed_out, 0);
    assert_false(runcmd_ok(&r));
    assert_non_null(strstr(r.out, "to-out"));
    assert_non_null(strstr(r.out, "to-err"));

    char *ok[] = {"/bin/true", NULL};
    assert_int_equal(runcmd_run(ok, 10000, &r, err, sizeof(err)), 0);
    assert_true(runcmd_ok(&r));
}

static void
test_missing_program(void **state)
{
    char *argv[] = {"/nonexistent/cp-start", NULL};
    struct runcmd_result r;
    char err[256] = "";

    (void)state;
    assert_int_equal(runcmd_run(argv, 1000, &r, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "/nonexistent/cp-start"));
    assert_non_null(strstr(err, "No such file"));
}

static void
test_deadline_kills_group(void **state)
{
    /* sh and its background sleep share the group: both are killed. */
    char *argv[] = {"/bin/sh", "-c", "/bin/sleep 30 & wait", NULL};
    struct runcmd_result r;
    char err[256] = "";

    (void)state;
    assert_int_equal(runcmd_run(argv, 300, &r, err, sizeof(err)), 0);
    assert_int_equal(r.timed_out, 1);
    assert_int_equal(r.signo, SIGKILL);
    assert_false(runcmd_ok(&r));
}

static void
test_returns_when_child_exits_not_at_eof(void **state)
{
    /* A daemonizing command: the grandchild keeps the output pipe open
     * after the child exited.  Done when the child is, not at the
     * deadline (which would report timed_out). */
    char *argv[] = {"/bin/sh", "-c", "/bin/sleep 20 & echo started", NULL};
    struct runcmd_result r;
    char err[256] = "";

    (void)state;
    assert_int_equal(runcmd_run(argv, 15000, &r, err, sizeof(err)), 0);
    assert_int_equal(r.timed_out, 0);
    assert_true(runcmd_ok(&r));
    assert_non_null(strstr(r.out, "started"));
}

static void
test_signals_reset_for_the_child(void **state)
{
    /* The agent ignores SIGPIPE; the command must start with no ignored
     * and no blocked signal (a QEMU started from it would inherit them). */
    char *argv[] = {"/bin/grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status",
                    NULL};
    struct runcmd_result r;
    sigset_t blk, old;
    char err[256] = "", *ign;

    (void)state;
    signal(SIGPIPE, SIG_IGN);
    sigemptyset(&blk);
    sigaddset(&blk, SIGTERM);
    sigprocmask(SIG_BLOCK, &blk, &old);
    assert_int_equal(runcmd_run(argv, 10000, &r, err, sizeof(err)), 0);
    sigprocmask(SIG_SETMASK, &old, NULL);
    assert_true(runcmd_ok(&r));
    assert_non_null(strstr(r.out, "SigBlk:\t0000000000000000"));
    /* Signals 1..31 only: glibc may leave its internal real-time signals
     * (32, 33) as it likes; exec resets handlers but keeps SIG_IGN. */
    ign = strstr(r.out, "SigIgn:\t");
    assert_non_null(ign);
    assert_int_equal(strtoull(ign + 8, NULL, 16) & 0x7fffffffULL, 0);
}

static void
test_output_keeps_the_tail(void **state)
{
    char *argv[] = {"/bin/sh", "-c", "seq 1 2000; echo the-end", NULL};
    struct runcmd_result r;
    char err[256] = "";

    (void)state;
    assert_int_equal(runcmd_run(argv, 10000, &r, err, sizeof(err)), 0);
    assert_int_equal(strlen(r.out), sizeof(r.out) - 1);
    assert_non_null(strstr(r.out, "1999\n2000\nthe-end\n"));
    assert_null(strstr(r.out, "\n1\n2\n3\n"));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_exit_code_and_output),
        cmocka_unit_test(test_missing_program),
        cmocka_unit_test(test_deadline_kills_group),
        cmocka_unit_test(test_returns_when_child_exits_not_at_eof),
        cmocka_unit_test(test_signals_reset_for_the_child),
        cmocka_unit_test(test_output_keeps_the_tail),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
