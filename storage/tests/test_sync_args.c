/* Unit tests of sync_args: the command line main() runs, parsed twice in
 * one process as the fuzz target does (getopt's state must not leak). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <getopt.h>
#include <string.h>

#include "sync_args.h"

#define ARGC(a) ((int)(sizeof(a) / sizeof(a[0])) - 1)

static void
test_full_line(void **state)
{
    char *argv[] = {"cutpoint-sync", "--src-conf", "/a", "--dst-conf=/b",
                    "--image", "img", "--snap", "s2", "--base", "s1",
                    "--jobs", "8", "--chunk-kib", "1024", "--rate-mbps",
                    "2.5", "--extent-verify", "readback", "--op-timeout",
                    "30", NULL};
    struct sync_opts o;
    const char *bad;

    (void)state;
    assert_int_equal(sync_args_parse(ARGC(argv), argv, &o, &bad),
                     SYNC_ARGS_RUN);
    assert_null(bad);
    assert_string_equal(o.src.conf, "/a");
    assert_string_equal(o.dst.conf, "/b");
    assert_string_equal(o.src.id, "admin");
    assert_string_equal(o.dst.pool, "rbd");
    assert_string_equal(o.base, "s1");
    assert_int_equal(o.workers, 8);
    assert_int_equal(o.chunk, 1024 * 1024);
    assert_true(o.rate_mbps == 2.5);
    assert_int_equal(o.extent_verify, SYNC_VERIFY_READBACK);
    assert_int_equal(o.op_timeout_s, 30);
}

/* A second parse starts from argv[1] with the defaults again. */
static void
test_second_parse_is_fresh(void **state)
{
    char *bad_line[] = {"cutpoint-sync", "--src-conf", "/a", "--jobs", "65",
                        NULL};
    char *good_line[] = {"cutpoint-sync", "--src-conf", "/a", "--dst-conf",
                         "/b", "--image", "i", "--snap", "s", NULL};
    struct sync_opts o;
    const char *bad;

    (void)state;
    assert_int_equal(sync_args_parse(ARGC(bad_line), bad_line, &o, &bad),
                     SYNC_ARGS_USAGE);
    assert_string_equal(bad, "--jobs wants an integer from 1 to 64");
    assert_int_equal(sync_args_parse(ARGC(good_line), good_line, &o, &bad),
                     SYNC_ARGS_RUN);
    assert_null(bad);
    assert_int_equal(o.workers, 16);
    assert_null(o.base);
    assert_int_equal(sync_args_parse(ARGC(good_line), good_line, &o, &bad),
                     SYNC_ARGS_RUN);
    assert_string_equal(o.image, "i");
}

static void
test_help_version_unknown(void **state)
{
    char *help[] = {"cutpoint-sync", "-h", NULL};
    char *version[] = {"cutpoint-sync", "--version", NULL};
    char *unknown[] = {"cutpoint-sync", "--no-such", NULL};
    struct sync_opts o;
    const char *bad;

    (void)state;
    assert_int_equal(sync_args_parse(ARGC(help), help, &o, &bad),
                     SYNC_ARGS_HELP);
    assert_int_equal(sync_args_parse(ARGC(version), version, &o, &bad),
                     SYNC_ARGS_VERSION);
    opterr = 0;
    assert_int_equal(sync_args_parse(ARGC(unknown), unknown, &o, &bad),
                     SYNC_ARGS_USAGE);
    assert_null(bad);   /* getopt's own reason */
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_line),
        cmocka_unit_test(test_second_parse_is_fresh),
        cmocka_unit_test(test_help_version_unknown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
