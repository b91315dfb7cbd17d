/*
 * libFuzzer target: the input is a cutpoint-sync progress record file (the
 * state a rerun resumes from, sync_progress.h), decoded as a rerun does.
 * A random record almost never carries a right CRC, so the input is also
 * decoded a second time with its crc32 line recomputed: that is how the
 * fuzzer reaches the checks behind the CRC.  A record that decodes must
 * encode again and decode to the same fields; a version 1 record (no DR
 * image identity) must never be resumable, and must not encode.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "sync_progress.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
check_roundtrip(const struct sync_progress *p)
{
    char buf[SYNC_PROGRESS_MAX + 1], err[256];
    struct sync_progress q;
    int n;

    if (p->version == 1) {
        if (p->dr.id[0] || p->dr.marker[0] ||
            sync_progress_resumable(p, p, err, sizeof(err)) ||
            sync_progress_encode(p, buf, sizeof(buf), err, sizeof(err)) >= 0)
            abort();
        return;
    }
    if (p->version != SYNC_PROGRESS_VERSION ||
        !sync_progress_resumable(p, p, err, sizeof(err)))
        abort();
    n = sync_progress_encode(p, buf, sizeof(buf), err, sizeof(err));
    if (n < 0 || sync_progress_decode(buf, (size_t)n, &q, err,
                                      sizeof(err)) < 0)
        abort();
    if (strcmp(p->pool, q.pool) || strcmp(p->image, q.image) ||
        strcmp(p->base, q.base) || strcmp(p->target, q.target) ||
        strcmp(p->owner, q.owner) || strcmp(p->dr.id, q.dr.id) ||
        strcmp(p->dr.marker, q.dr.marker) || p->size != q.size ||
        p->done_offset != q.done_offset || p->bytes != q.bytes ||
        p->extents != q.extents || !sync_progress_matches(p, &q))
        abort();
    if (p->done_offset > p->size || !p->image[0] || !p->target[0])
        abort();
}

static void
decode(const char *buf, size_t len)
{
    struct sync_progress p;
    char err[256];

    if (sync_progress_decode(buf, len, &p, err, sizeof(err)) == 0)
        check_roundtrip(&p);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data, *crc = NULL;
    char *fixed;
    size_t at;

    decode(s, size);
    /* The last "\ncrc32=" line, recomputed over everything before it. */
    for (size_t i = size; i-- > 0;)
        if (size - i >= 7 && memcmp(s + i, "\ncrc32=", 7) == 0) {
            crc = s + i + 1;
            break;
        }
    if (!crc || size > SYNC_PROGRESS_MAX)
        return 0;
    at = (size_t)(crc - s);
    fixed = malloc(at + 16);
    if (!fixed)
        return 0;
    memcpy(fixed, s, at);
    snprintf(fixed + at, 16, "crc32=%08lx\n",
             crc32(0L, (const Bytef *)s, (uInt)at));
    decode(fixed, at + 15);
    free(fixed);
    return 0;
}
