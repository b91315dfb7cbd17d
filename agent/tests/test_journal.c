/* cmocka tests of journal.c on a real temporary directory. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "journal.h"

static void
test_roundtrip_and_reload(void **state)
{
    char dir[] = "/tmp/cp-journal-XXXXXX", path[256], err[256];
    struct journal *j = NULL;
    struct journal_entry *e;
    int n;

    (void)state;
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/journal", dir);
    assert_int_equal(journal_open(path, &j, err, sizeof(err)), 0);
    {
        const char *vms[] = {"vm1", "vm2"};
        assert_int_equal(journal_add_many(j, "t1", vms, 2, err, sizeof(err)),
                         0);
    }
    assert_int_equal(journal_remove(j, "vm1", err, sizeof(err)), 0);
    assert_int_equal(journal_remove(j, "nope", err, sizeof(err)), 0);
    journal_free(j);
    /* a restarted agent sees exactly the VMs still paused */
    assert_int_equal(journal_open(path, &j, err, sizeof(err)), 0);
    assert_int_equal(journal_entries(j, &e, &n), 0);
    assert_int_equal(n, 1);
    assert_string_equal(e[0].txn, "t1");
    assert_string_equal(e[0].vm, "vm2");
    free(e);
    journal_free(j);
    journal_free(NULL);
    unlink(path);
    rmdir(dir);
}

static void
test_unwritable_reports_step(void **state)
{
    char err[256];
    struct journal *j = NULL;

    (void)state;
    assert_int_equal(journal_open("/nonexistent-dir/journal", &j, err,
                                  sizeof(err)), 0);
    assert_int_equal(journal_add(j, "t", "vm", err, sizeof(err)), -1);
    assert_non_null(strstr(err, "open failed"));
    {
        /* a failed write leaves nothing recorded in memory either */
        struct journal_entry *e;
        int n;
        assert_int_equal(journal_entries(j, &e, &n), 0);
        assert_int_equal(n, 0);
        free(e);
    }
    journal_free(j);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_and_reload),
        cmocka_unit_test(test_unwritable_reports_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
