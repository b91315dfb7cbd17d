/*
 * cmocka tests of the serial deny-list (revoke.h): the forms a serial is
 * written in (openssl's "serial=", lower case, leading zeros) all match
 * peer_serial's form, notes and comments are skipped, a bad line fails the
 * load and leaves the previous list in force.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "revoke.h"

static char path[64];

static void
write_list(const char *text)
{
    FILE *f;

    snprintf(path, sizeof(path), "/tmp/cp-revoke-XXXXXX");
    close(mkstemp(path));
    f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void
test_forms_and_notes(void **state)
{
    struct revoke_list l = {0};
    char err[256];

    (void)state;
    write_list("# revoked by cutpoint host revoke\n"
               "\n"
               "serial=0A1B2C host=hv1 at=2026-11-25T00:00:00Z\n"
               "  00ff\n"
               "3D\thv3\n");
    assert_int_equal(revoke_load(path, &l, err, sizeof(err)), 0);
    assert_int_equal(l.n, 3);
    assert_true(revoke_has(&l, "A1B2C"));
    assert_true(revoke_has(&l, "FF"));
    assert_true(revoke_has(&l, "3D"));
    assert_false(revoke_has(&l, "3"));
    assert_false(revoke_has(&l, "0A1B2C"));   /* callers pass the normal form */
    revoke_clear(&l);
    unlink(path);
}

static void
test_bad_line_keeps_previous(void **state)
{
    struct revoke_list l = {0};
    char err[256];

    (void)state;
    write_list("AB\n");
    assert_int_equal(revoke_load(path, &l, err, sizeof(err)), 0);
    unlink(path);
    write_list("AB\nnot-hex\n");
    assert_int_equal(revoke_load(path, &l, err, sizeof(err)), -1);
    assert_non_null(strstr(err, ":2: not a certificate serial"));
    assert_int_equal(l.n, 1);
    assert_true(revoke_has(&l, "AB"));
    unlink(path);
    assert_int_equal(revoke_load("/nonexistent/revoked", &l, err,
                                 sizeof(err)), -1);
    assert_true(revoke_has(&l, "AB"));
    /* no [tls] revoked: an empty list */
    assert_int_equal(revoke_load("", &l, err, sizeof(err)), 0);
    assert_int_equal(l.n, 0);
    write_list("1123456789012345678901234567890123456789A\n");  /* 41 digits */
    assert_int_equal(revoke_load(path, &l, err, sizeof(err)), -1);
    unlink(path);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forms_and_notes),
        cmocka_unit_test(test_bad_line_keeps_previous),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
