/*
 * Unit tests of the DR image identity in the progress record: a record
 * round-trips its identity, a rerun resumes only onto the same image (id
 * and marker), and a version 1 record (no identity) still decodes but is
 * never resumed from.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <cmocka.h>

#include "sync_identity.h"
#include "sync_progress.h"

#define ID_A "10b3e1f4a2c9"
#define ID_B "10b3e1f4a2ca"
#define MARK_A "5c0f3a9d2b7e4f61a8c0d9e2b3f4a5c6"
#define MARK_B "9e2b3f4a5c65c0f3a9d2b7e4f61a8c0d"

/* A record of a full copy of rbd/vm1-disk0@s2 into image (id, marker). */
static void
record(struct sync_progress *p, const char *id, const char *marker)
{
    char err[256];

    assert_int_equal(sync_progress_set(p, "rbd", "vm1-disk0", NULL, "s2",
                                       67108864, err, sizeof(err)), 0);
    strcpy(p->owner, "10.77.0.1:0/1261527113");
    snprintf(p->dr.id, sizeof(p->dr.id), "%s", id);
    snprintf(p->dr.marker, sizeof(p->dr.marker), "%s", marker);
    p->done_offset = 8388608;
    p->bytes = 8388608;
    p->extents = 2;
}

static void
test_identity_roundtrip(void **state)
{
    struct sync_progress p, q;
    char buf[SYNC_PROGRESS_MAX], err[256];
    int n;

    (void)state;
    record(&p, ID_A, MARK_A);
    n = sync_progress_encode(&p, buf, sizeof(buf), err, sizeof(err));
    assert_true(n > 0);
    assert_non_null(strstr(buf, "cutpoint-sync-progress 2\n"));
    assert_non_null(strstr(buf, "\nimage_id=" ID_A "\nmarker=" MARK_A "\n"));
    assert_int_equal(sync_progress_decode(buf, (size_t)n, &q, err,
                                          sizeof(err)), 0);
    assert_memory_equal(&p, &q, sizeof(p));
    assert_int_equal(q.version, 2);
    assert_string_equal(q.dr.id, ID_A);
    assert_string_equal(q.dr.marker, MARK_A);
}

static void
test_encode_refuses_a_record_without_identity(void **state)
{
    struct sync_progress p;
    char buf[SYNC_PROGRESS_MAX], err[256];

    (void)state;
    record(&p, ID_A, "");
    assert_int_equal(sync_progress_encode(&p, buf, sizeof(buf), err,
                                          sizeof(err)), -1);
    assert_non_null(strstr(err, "identity"));
    record(&p, "", MARK_A);
    assert_int_equal(sync_progress_encode(&p, buf, sizeof(buf), err,
                                          sizeof(err)), -1);
    /* A newline in the marker would forge a line of the record. */
    record(&p, ID_A, "m\ndone_offset=1");
    assert_int_equal(sync_progress_encode(&p, buf, sizeof(buf), err,
                                          sizeof(err)), -1);
}

/* Each row: the identity a rerun finds at DR, and whether it resumes. */
struct resume_case {
    const char *id;
    const char *marker;
    int resumes;
    const char *why;
};

static void
test_resumes_only_onto_the_same_image(void **state)
{
    static const struct resume_case rows[] = {
        {ID_A, MARK_A, 1, ""},
        {ID_B, MARK_A, 0, "image id changed"},      /* removed, recreated */
        {ID_A, MARK_B, 0, "marker changed"},        /* replaced, same id */
        {ID_B, MARK_B, 0, "image id changed"},
        {ID_A, "", 0, "no creation marker"},
        {"", MARK_A, 0, "no id"},
    };
    struct sync_progress have, want;
    char why[256];
    size_t i;

    (void)state;
    record(&have, ID_A, MARK_A);
    for (i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        record(&want, rows[i].id, rows[i].marker);
        want.done_offset = want.bytes = want.extents = 0;
        why[0] = '\0';
        assert_int_equal(sync_progress_resumable(&have, &want, why,
                                                 sizeof(why)),
                         rows[i].resumes);
        if (strstr(why, rows[i].why) == NULL)
            fail_msg("row %zu: reason '%s' lacks '%s'", i, why, rows[i].why);
    }
    /* Another copy of the same image is not resumed either. */
    record(&want, ID_A, MARK_A);
    strcpy(want.target, "s3");
    assert_int_equal(sync_progress_resumable(&have, &want, why, sizeof(why)),
                     0);
    assert_non_null(strstr(why, "another copy"));
}

static void
test_version1_record_decodes_but_never_resumes(void **state)
{
    static const char body[] =
        "cutpoint-sync-progress 1\n"
        "pool=rbd\nimage=vm1-disk0\nbase=\ntarget=s2\n"
        "owner=10.77.0.1:0/1261527113\n"
        "size=67108864\ndone_offset=8388608\nbytes=8388608\nextents=2\n";
    char buf[SYNC_PROGRESS_MAX], err[256], why[256];
    struct sync_progress have, want;
    int n;

    (void)state;
    n = snprintf(buf, sizeof(buf), "%scrc32=%08lx\n", body,
                 crc32(0L, (const Bytef *)body, (uInt)strlen(body)));
    assert_int_equal(sync_progress_decode(buf, (size_t)n, &have, err,
                                          sizeof(err)), 0);
    assert_int_equal(have.version, 1);
    /* The owner of a killed run's lock is still known... */
    assert_string_equal(have.owner, "10.77.0.1:0/1261527113");
    assert_string_equal(have.dr.id, "");
    /* ...but the done prefix is never trusted. */
    record(&want, ID_A, MARK_A);
    assert_true(sync_progress_matches(&have, &want));
    assert_int_equal(sync_progress_resumable(&have, &want, why, sizeof(why)),
                     0);
    assert_non_null(strstr(why, "version 1"));
}

static void
test_token_syntax(void **state)
{
    char longest[SYNC_IDENTITY_MAX + 1];

    (void)state;
    assert_true(sync_identity_token_ok(ID_A));
    assert_true(sync_identity_token_ok("a.b_c-D9"));
    assert_false(sync_identity_token_ok(""));
    assert_false(sync_identity_token_ok("a b"));
    assert_false(sync_identity_token_ok("a=b"));
    memset(longest, 'a', sizeof(longest) - 1);
    longest[SYNC_IDENTITY_MAX - 1] = '\0';
    assert_true(sync_identity_token_ok(longest));
    longest[SYNC_IDENTITY_MAX - 1] = 'a';
    longest[SYNC_IDENTITY_MAX] = '\0';
    assert_false(sync_identity_token_ok(longest));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identity_roundtrip),
        cmocka_unit_test(test_encode_refuses_a_record_without_identity),
        cmocka_unit_test(test_resumes_only_onto_the_same_image),
        cmocka_unit_test(test_version1_record_decodes_but_never_resumes),
        cmocka_unit_test(test_token_syntax),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
