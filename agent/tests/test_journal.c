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

/* Entries of e[0..n) as "kind txn vm" lines in order, for comparing. */
static void
dump(const struct journal_entry *e, int n, char *out, size_t len)
{
    size_t off = 0;

    out[0] = '\0';
    for (int i = 0; i < n && off < len; i++)
        off += (size_t)snprintf(out + off, len - off, "%s %s %s;",
                                e[i].kind == JOURNAL_FROZEN ? "frozen" :
                                e[i].kind == JOURNAL_REDIRECT ? "redirect" :
                                "paused", e[i].txn, e[i].vm);
}

static void
read_file(const char *path, char *out, size_t len)
{
    FILE *f = fopen(path, "r");
    size_t got;

    assert_non_null(f);
    got = fread(out, 1, len - 1, f);
    out[got] = '\0';
    fclose(f);
}

static void
test_paused_and_frozen_roundtrip(void **state)
{
    char dir[] = "/tmp/cp-journal-XXXXXX", path[256], err[256], text[512];
    struct journal *j = NULL;
    struct journal_entry *e, in[3] = {
        {JOURNAL_PAUSED, "t1", "vm1"},
        {JOURNAL_FROZEN, "t1", "vm1"},
        {JOURNAL_PAUSED, "t1", "vm2"},
    };
    int n;

    (void)state;
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/journal", dir);
    assert_int_equal(journal_open(path, &j, err, sizeof(err)), 0);
    assert_int_equal(journal_put(j, in, 3, err, sizeof(err)), 0);
    /* the file says what each line is, one line per (kind, vm) */
    read_file(path, text, sizeof(text));
    assert_string_equal(text, "cutpoint-journal 2\npaused t1 vm1\n"
                        "frozen t1 vm1\npaused t1 vm2\n");
    /* resuming vm1 (journal_remove) leaves its `frozen` line */
    assert_int_equal(journal_remove(j, "vm1", err, sizeof(err)), 0);
    /* a thaw of another txn does not drop the entry of t1 */
    assert_int_equal(journal_remove_kind(j, JOURNAL_FROZEN, "vm1", "t0", err,
                                         sizeof(err)), 0);
    journal_free(j);
    assert_int_equal(journal_open(path, &j, err, sizeof(err)), 0);
    assert_int_equal(journal_entries(j, &e, &n), 0);
    dump(e, n, text, sizeof(text));
    assert_string_equal(text, "paused t1 vm2;frozen t1 vm1;");
    free(e);
    /* a newer freeze of vm1 replaces its entry; the t1 thaw then no
     * longer matches, the t2 one does */
    {
        struct journal_entry f2 = {JOURNAL_FROZEN, "t2", "vm1"};
        assert_int_equal(journal_put(j, &f2, 1, err, sizeof(err)), 0);
    }
    assert_int_equal(journal_remove_kind(j, JOURNAL_FROZEN, "vm1", "t1", err,
                                         sizeof(err)), 0);
    assert_int_equal(journal_entries(j, &e, &n), 0);
    dump(e, n, text, sizeof(text));
    assert_string_equal(text, "paused t1 vm2;frozen t2 vm1;");
    free(e);
    assert_int_equal(journal_remove_kind(j, JOURNAL_FROZEN, "vm1", "t2", err,
                                         sizeof(err)), 0);
    assert_int_equal(journal_remove_kind(j, JOURNAL_PAUSED, "vm2", NULL, err,
                                         sizeof(err)), 0);
    journal_free(j);
    read_file(path, text, sizeof(text));
    assert_string_equal(text, "");
    unlink(path);
    rmdir(dir);
}

/* A `redirect` entry (the redirect cut's overlays) is its own kind: it
 * survives the VM's resume and a reload, and only its txn's merge drops it. */
static void
test_redirect_entry(void **state)
{
    char dir[] = "/tmp/cp-journal-XXXXXX", path[256], err[256], text[512];
    struct journal *j = NULL;
    struct journal_entry *e, in[2] = {
        {JOURNAL_PAUSED, "t1", "vm1"},
        {JOURNAL_REDIRECT, "t1", "vm1"},
    };
    int n;

    (void)state;
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/journal", dir);
    assert_int_equal(journal_open(path, &j, err, sizeof(err)), 0);
    assert_int_equal(journal_put(j, in, 2, err, sizeof(err)), 0);
    read_file(path, text, sizeof(text));
    assert_string_equal(text, "cutpoint-journal 2\npaused t1 vm1\n"
                        "redirect t1 vm1\n");
    assert_int_equal(journal_remove(j, "vm1", err, sizeof(err)), 0);
    assert_int_equal(journal_remove_kind(j, JOURNAL_REDIRECT, "vm1", "t0",
                                         err, sizeof(err)), 0);
    journal_free(j);
    assert_int_equal(journal_open(path, &j, err, sizeof(err)), 0);
    assert_int_equal(journal_entries(j, &e, &n), 0);
    dump(e, n, text, sizeof(text));
    assert_string_equal(text, "redirect t1 vm1;");
    free(e);
    assert_int_equal(journal_remove_kind(j, JOURNAL_REDIRECT, "vm1", "t1",
                                         err, sizeof(err)), 0);
    journal_free(j);
    read_file(path, text, sizeof(text));
    assert_string_equal(text, "");
    unlink(path);
    rmdir(dir);
}

static void
test_old_format_loads(void **state)
{
    char dir[] = "/tmp/cp-journal-XXXXXX", path[256], err[256], text[512];
    struct journal *j = NULL;
    struct journal_entry *e;
    FILE *f;
    int n;

    (void)state;
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/journal", dir);
    /* as written by agents before `frozen` existed, plus a hand edit */
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("paused t7 vmA\npaused t7 vmB\nthawed t7 vmA\n# note\n", f);
    fclose(f);
    assert_int_equal(journal_open(path, &j, err, sizeof(err)), 0);
    assert_int_equal(journal_entries(j, &e, &n), 0);
    dump(e, n, text, sizeof(text));
    assert_string_equal(text, "paused t7 vmA;paused t7 vmB;");
    free(e);
    assert_int_equal(journal_remove(j, "vmA", err, sizeof(err)), 0);
    journal_free(j);
    read_file(path, text, sizeof(text));
    /* rewritten in the framed format */
    assert_string_equal(text, "cutpoint-journal 2\npaused t7 vmB\n");
    unlink(path);
    rmdir(dir);
}

/* Names with any bytes round-trip: blanks, newlines, '%', non-UTF-8. */
static void
test_names_with_any_bytes_roundtrip(void **state)
{
    char dir[] = "/tmp/cp-journal-XXXXXX", path[256], err[256], text[1024];
    struct journal *j = NULL;
    struct journal_entry *e, in[] = {
        {JOURNAL_PAUSED, "t 1", "my vm"},
        {JOURNAL_FROZEN, "t 1", "my vm"},
        {JOURNAL_PAUSED, "t2", "tab\there"},
        {JOURNAL_PAUSED, "t2", "two\nlines"},
        {JOURNAL_PAUSED, "t2", "bin\xff\xfe\x01"},
        {JOURNAL_PAUSED, "t%41", "pct%41 %"},
        {JOURNAL_PAUSED, "t2", " lead and trail "},
    };
    int n, nin = (int)(sizeof(in) / sizeof(in[0])), lines = 0;

    (void)state;
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/journal", dir);
    assert_int_equal(journal_open(path, &j, err, sizeof(err)), 0);
    assert_int_equal(journal_put(j, in, nin, err, sizeof(err)), 0);
    journal_free(j);
    read_file(path, text, sizeof(text));
    for (char *c = text; *c; c++)
        lines += *c == '\n';
    assert_int_equal(lines, 1 + nin);           /* one line per entry */
    assert_int_equal(journal_open(path, &j, err, sizeof(err)), 0);
    assert_int_equal(journal_entries(j, &e, &n), 0);
    assert_int_equal(n, nin);
    for (int i = 0; i < nin; i++) {
        assert_int_equal(e[i].kind, in[i].kind);
        assert_string_equal(e[i].txn, in[i].txn);
        assert_string_equal(e[i].vm, in[i].vm);
    }
    free(e);
    /* removal finds them by the same bytes */
    assert_int_equal(journal_remove(j, "my vm", err, sizeof(err)), 0);
    assert_int_equal(journal_remove_kind(j, JOURNAL_FROZEN, "my vm", "t 1",
                                         err, sizeof(err)), 0);
    assert_int_equal(journal_entries(j, &e, &n), 0);
    assert_int_equal(n, nin - 2);
    free(e);
    journal_free(j);
    unlink(path);
    rmdir(dir);
}

/* A framed file: malformed lines are skipped, good ones kept. */
static void
test_framed_malformed_lines_skipped(void **state)
{
    static const char buf[] =
        "cutpoint-journal 2\n"
        "paused t1 ok%20vm\n"
        "paused t1 bad%2\n"            /* cut escape */
        "paused t1 bad%zz\n"           /* not hex */
        "paused t1 nul%00\n"           /* NUL */
        "paused t1 two  blanks\n"      /* 4 fields */
        "paused  t1 vm\n"              /* empty txn */
        "paused t1 \n"                 /* empty vm */
        "thawed t1 vm\n"               /* unknown kind */
        "frozen t%3 vm\n"
        "frozen t1 last";               /* no final newline */
    struct journal_entry *e;
    int n;

    (void)state;
    assert_int_equal(journal_parse(buf, sizeof(buf) - 1, &e, &n), 0);
    assert_int_equal(n, 2);
    assert_string_equal(e[0].vm, "ok vm");
    assert_string_equal(e[1].vm, "last");
    assert_int_equal(e[1].kind, JOURNAL_FROZEN);
    free(e);
    assert_int_equal(journal_parse("", 0, &e, &n), 0);
    assert_int_equal(n, 0);
    free(e);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_and_reload),
        cmocka_unit_test(test_unwritable_reports_step),
        cmocka_unit_test(test_paused_and_frozen_roundtrip),
        cmocka_unit_test(test_redirect_entry),
        cmocka_unit_test(test_old_format_loads),
        cmocka_unit_test(test_names_with_any_bytes_roundtrip),
        cmocka_unit_test(test_framed_malformed_lines_skipped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
