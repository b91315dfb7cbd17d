/*
 * Unit tests of the progress record: round trip, and every kind of
 * corruption refused with its own error (one fault per case).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "sync_progress.h"

static void
sample(struct sync_progress *p)
{
    char err[256];

    assert_int_equal(sync_progress_set(p, "rbd", "vm1-disk0", "cp.g.41",
                                       "cp.g.42", 67108864, err,
                                       sizeof(err)), 0);
    strcpy(p->owner, "client.4181");
    strcpy(p->dr.id, "10b3e1f4a2c9");
    strcpy(p->dr.marker, "5c0f3a9d2b7e4f61a8c0d9e2b3f4a5c6");
    p->done_offset = 8388608;
    p->bytes = 8388608;
    p->extents = 2;
}

static void
test_roundtrip(void **state)
{
    struct sync_progress p, q;
    char buf[SYNC_PROGRESS_MAX], err[256];
    int n;

    (void)state;
    sample(&p);
    n = sync_progress_encode(&p, buf, sizeof(buf), err, sizeof(err));
    assert_true(n > 0);
    assert_int_equal(sync_progress_decode(buf, (size_t)n, &q, err,
                                          sizeof(err)), 0);
    assert_memory_equal(&p, &q, sizeof(p));
    assert_true(sync_progress_matches(&q, &p));
    /* A different target is a different copy. */
    strcpy(q.target, "cp.g.43");
    assert_false(sync_progress_matches(&q, &p));
}

static void
test_full_copy_empty_base(void **state)
{
    struct sync_progress p, q;
    char buf[SYNC_PROGRESS_MAX], err[256];
    int n;

    (void)state;
    assert_int_equal(sync_progress_set(&p, "rbd", "img", NULL, "s1", 4096,
                                       err, sizeof(err)), 0);
    strcpy(p.dr.id, "abc1");
    strcpy(p.dr.marker, "m1");
    n = sync_progress_encode(&p, buf, sizeof(buf), err, sizeof(err));
    assert_true(n > 0);
    assert_non_null(strstr(buf, "\nbase=\n"));
    assert_int_equal(sync_progress_decode(buf, (size_t)n, &q, err,
                                          sizeof(err)), 0);
    assert_string_equal(q.base, "");
}

static void
test_rejects_newline_in_name(void **state)
{
    struct sync_progress p;
    char err[256];

    (void)state;
    assert_int_equal(sync_progress_set(&p, "rbd", "img\ndone_offset=9",
                                       NULL, "s1", 1, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "image"));
}

/* Each row: a mutation of a valid record and the error text it must give. */
struct corruption {
    const char *from;
    const char *to;
    const char *expect;
};

static void
test_corruptions(void **state)
{
    static const struct corruption rows[] = {
        {"cutpoint-sync-progress 2", "cutpoint-sync-progress 3", "magic"},
        /* A version 2 body under the version 1 magic: no identity lines
         * expected, so the first one is misplaced. */
        {"cutpoint-sync-progress 2", "cutpoint-sync-progress 1",
         "expected key 'size'"},
        {"image_id=10b3e1f4a2c9\n", "", "expected key 'image_id'"},
        {"marker=5c0f3a9d2b7e4f61a8c0d9e2b3f4a5c6\n", "",
         "expected key 'marker'"},
        {"marker=5c0f", "marker=5c/f", "invalid image_id or marker"},
        {"image_id=10b3e1f4a2c9", "image_id=", "invalid image_id or marker"},
        {"pool=rbd", "pool=rbe", "crc32 mismatch"},
        {"done_offset=8388608", "done_offset=8388609", "crc32 mismatch"},
        {"size=", "sise=", "expected key 'size'"},
        {"bytes=8388608", "bytes=-1", "bad number in 'bytes'"},
        {"bytes=8388608", "bytes=08", "bad number in 'bytes'"},
        {"extents=2", "extents=2x", "bad number in 'extents'"},
        {"crc32=", "crc33=", "expected key 'crc32'"},
        {"owner=client.4181\n", "", "expected key 'owner'"},
        {"image=vm1-disk0\nbase", "image=vm1-disk0\nimage=x\nbase",
         "expected key 'base'"},
    };
    struct sync_progress p, q;
    char buf[SYNC_PROGRESS_MAX], mut[SYNC_PROGRESS_MAX + 64], err[256];
    size_t i;

    (void)state;
    sample(&p);
    assert_true(sync_progress_encode(&p, buf, sizeof(buf), err,
                                     sizeof(err)) > 0);
    for (i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        const char *at = strstr(buf, rows[i].from);
        size_t pre;

        assert_non_null(at);
        pre = (size_t)(at - buf);
        memcpy(mut, buf, pre);
        strcpy(mut + pre, rows[i].to);
        strcat(mut, at + strlen(rows[i].from));
        err[0] = '\0';
        assert_int_equal(sync_progress_decode(mut, strlen(mut), &q, err,
                                              sizeof(err)), -1);
        if (strstr(err, rows[i].expect) == NULL)
            fail_msg("row %zu: error '%s' lacks '%s'", i, err,
                     rows[i].expect);
    }
}

static void
test_truncated_and_trailing(void **state)
{
    struct sync_progress p, q;
    char buf[SYNC_PROGRESS_MAX + 8], err[256];
    int n, cut;

    (void)state;
    sample(&p);
    n = sync_progress_encode(&p, buf, sizeof(buf), err, sizeof(err));
    /* Every strict prefix is refused: a torn write never decodes. */
    for (cut = 0; cut < n; cut++)
        assert_int_equal(sync_progress_decode(buf, (size_t)cut, &q, err,
                                              sizeof(err)), -1);
    memcpy(buf + n, "x\n", 2);
    assert_int_equal(sync_progress_decode(buf, (size_t)n + 2, &q, err,
                                          sizeof(err)), -1);
    assert_non_null(strstr(err, "trailing"));
}

static void
test_done_beyond_size(void **state)
{
    struct sync_progress p, q;
    char buf[SYNC_PROGRESS_MAX], err[256];
    int n;

    (void)state;
    sample(&p);
    p.done_offset = p.size + 1;
    n = sync_progress_encode(&p, buf, sizeof(buf), err, sizeof(err));
    assert_int_equal(sync_progress_decode(buf, (size_t)n, &q, err,
                                          sizeof(err)), -1);
    assert_non_null(strstr(err, "beyond size"));
}

static void
test_path_escapes(void **state)
{
    char out[256];

    (void)state;
    assert_int_equal(sync_progress_path(out, sizeof(out), "/d", "rbd",
                                        "a/b c"), 0);
    assert_string_equal(out, "/d/rbd%40a%2Fb%20c.progress");
    assert_int_equal(sync_progress_path(out, sizeof(out), "/d", "..", "x"),
                     -1);
    assert_int_equal(sync_progress_path(out, 12, "/d", "rbd", "long-name"),
                     -1);
}

static void
test_save_load_remove(void **state)
{
    char dir[] = "/tmp/cp-sync-test-XXXXXX", path[512], err[256];
    struct sync_progress p, q;
    struct stat st;
    FILE *f;

    (void)state;
    assert_non_null(mkdtemp(dir));
    assert_int_equal(sync_progress_path(path, sizeof(path), dir, "rbd",
                                        "vm1-disk0"), 0);
    assert_int_equal(sync_progress_load(path, &q, err, sizeof(err)),
                     SYNC_PROGRESS_ENOENT);
    sample(&p);
    assert_int_equal(sync_progress_save(path, &p, err, sizeof(err)), 0);
    assert_int_equal(sync_progress_load(path, &q, err, sizeof(err)), 0);
    assert_memory_equal(&p, &q, sizeof(p));
    /* No temp file is left behind. */
    {
        char tmp[600];

        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        assert_int_not_equal(stat(tmp, &st), 0);
    }
    /* Overwrite: the newer record wins. */
    p.done_offset = 16777216;
    assert_int_equal(sync_progress_save(path, &p, err, sizeof(err)), 0);
    assert_int_equal(sync_progress_load(path, &q, err, sizeof(err)), 0);
    assert_int_equal(q.done_offset, 16777216);
    /* A corrupted file is reported, not trusted. */
    f = fopen(path, "r+");
    assert_non_null(f);
    fseek(f, 30, SEEK_SET);
    fputc('#', f);
    fclose(f);
    assert_int_equal(sync_progress_load(path, &q, err, sizeof(err)), -1);
    assert_int_equal(sync_progress_remove(path, err, sizeof(err)), 0);
    assert_int_equal(sync_progress_remove(path, err, sizeof(err)), 0);
    assert_int_not_equal(stat(path, &st), 0);
    /* Saving into a missing directory names the failed step. */
    assert_int_equal(sync_progress_save("/nonexistent-dir/x.progress", &p,
                                        err, sizeof(err)), -1);
    assert_non_null(strstr(err, "open"));
    rmdir(dir);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_full_copy_empty_base),
        cmocka_unit_test(test_rejects_newline_in_name),
        cmocka_unit_test(test_corruptions),
        cmocka_unit_test(test_truncated_and_trailing),
        cmocka_unit_test(test_done_beyond_size),
        cmocka_unit_test(test_path_escapes),
        cmocka_unit_test(test_save_load_remove),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
