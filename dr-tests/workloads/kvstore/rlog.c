/* rlog: append-only record log on a raw-disk region; see rlog.h. */
#include "rlog.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define HDR_MAGIC 0x4c484043U  /* "CPHL" */
#define REC_MAGIC 0x43524350U  /* "CPRC" */

static uint32_t new_nonce(void)
{
    static uint32_t ctr;
    struct timespec ts;
    uint32_t x;

    clock_gettime(CLOCK_REALTIME, &ts);
    x = (uint32_t)ts.tv_nsec ^ (uint32_t)ts.tv_sec * 2654435761U ^
        (uint32_t)getpid() << 16 ^ ++ctr * 40503U;
    return x ? x : 1;
}

static uint32_t rec_crc(uint32_t nonce, uint32_t len, const void *p)
{
    uint8_t h[8];

    wl_put32(h, nonce);
    wl_put32(h + 4, len);
    return wl_crc32(wl_crc32(0, h, 8), p, len);
}

static int write_header(struct rlog *l, int half, uint32_t gen,
                        uint32_t nonce)
{
    uint8_t h[RLOG_HDR];

    memset(h, 0, sizeof(h));
    wl_put32(h, HDR_MAGIC);
    wl_put32(h + 4, gen);
    wl_put32(h + 8, nonce);
    wl_put32(h + 12, wl_crc32(0, h, 12));
    return wl_dev_write(l->dev, l->base + (uint64_t)half * l->half, h,
                        sizeof(h));
}

static int read_header(struct rlog *l, int half, uint32_t *gen,
                       uint32_t *nonce)
{
    uint8_t h[16];

    if (wl_dev_read(l->dev, l->base + (uint64_t)half * l->half, h, 16) < 0)
        return -1;
    if (wl_get32(h) != HDR_MAGIC || wl_get32(h + 12) != wl_crc32(0, h, 12))
        return -1;
    *gen = wl_get32(h + 4);
    *nonce = wl_get32(h + 8);
    return 0;
}

static int put_record(struct rlog *l, uint64_t *tail, uint64_t end,
                      uint32_t nonce, const void *payload, uint32_t len)
{
    size_t total = (RLOG_REC_HDR + (size_t)len + 7) & ~(size_t)7;
    uint8_t *r;
    int rc;

    /* keep room for a zero terminator after the last record */
    if (*tail + total + RLOG_REC_HDR > end)
        return RLOG_FULL;
    r = calloc(1, total + RLOG_REC_HDR);
    if (!r)
        return -1;
    wl_put32(r, REC_MAGIC);
    wl_put32(r + 4, nonce);
    wl_put32(r + 8, len);
    wl_put32(r + 12, rec_crc(nonce, len, payload));
    memcpy(r + RLOG_REC_HDR, payload, len);
    /* The trailing zero header makes the end of the log explicit even
     * over stale bytes of the same nonce (never expected, but cheap). */
    rc = wl_dev_write(l->dev, *tail, r, total + RLOG_REC_HDR);
    free(r);
    if (rc == 0)
        *tail += total;
    return rc;
}

int rlog_open(struct rlog *l, struct wl_dev *dev, uint64_t base,
              uint64_t size, int nhalves, rlog_cb cb, void *arg)
{
    uint32_t gen[2] = { 0, 0 }, nonce[2] = { 0, 0 };
    int ok[2] = { 0, 0 };
    uint8_t *buf = NULL;
    uint64_t pos;
    int rc = -1;

    memset(l, 0, sizeof(*l));
    l->dev = dev;
    l->base = base;
    l->size = size;
    l->nhalves = nhalves;
    l->half = (size / (uint64_t)nhalves) & ~(uint64_t)511;
    if (l->half < 4 * RLOG_HDR || base + size > wl_dev_size(dev)) {
        errno = EINVAL;
        goto cleanup;
    }
    for (int h = 0; h < nhalves; h++)
        ok[h] = read_header(l, h, &gen[h], &nonce[h]) == 0;
    if (!ok[0] && !ok[1]) {
        l->cur = 0;
        l->gen = 1;
        l->nonce = new_nonce();
        if (write_header(l, 0, l->gen, l->nonce) < 0 ||
            wl_dev_sync(dev) < 0)
            goto cleanup;
        l->tail = base + RLOG_HDR;
        rc = 0;
        goto cleanup;
    }
    l->cur = (ok[1] && (!ok[0] || gen[1] > gen[0])) ? 1 : 0;
    l->gen = gen[l->cur];
    l->nonce = nonce[l->cur];
    buf = malloc(l->half);
    if (!buf ||
        wl_dev_read(dev, base + (uint64_t)l->cur * l->half, buf, l->half) < 0)
        goto cleanup;
    pos = RLOG_HDR;
    while (pos + RLOG_REC_HDR <= l->half) {
        const uint8_t *r = buf + pos;
        uint32_t len = wl_get32(r + 8);
        if (wl_get32(r) != REC_MAGIC || wl_get32(r + 4) != l->nonce ||
            len > l->half - pos - RLOG_REC_HDR ||
            wl_get32(r + 12) != rec_crc(l->nonce, len, r + RLOG_REC_HDR))
            break;
        if (cb && cb(arg, r + RLOG_REC_HDR, len) < 0)
            goto cleanup;
        pos += (RLOG_REC_HDR + (uint64_t)len + 7) & ~(uint64_t)7;
    }
    l->tail = base + (uint64_t)l->cur * l->half + pos;
    rc = 0;
cleanup:
    free(buf);
    return rc;
}

int rlog_append(struct rlog *l, const void *payload, uint32_t len)
{
    uint64_t end = l->base + (uint64_t)(l->cur + 1) * l->half;
    return put_record(l, &l->tail, end, l->nonce, payload, len);
}

int rlog_sync(struct rlog *l)
{
    return wl_dev_sync(l->dev);
}

double rlog_fill(const struct rlog *l)
{
    uint64_t start = l->base + (uint64_t)l->cur * l->half;
    return (double)(l->tail - start) / (double)l->half;
}

int rlog_compact_begin(struct rlog *l)
{
    if (l->nhalves != 2) {
        errno = EINVAL;
        return -1;
    }
    l->compacting = 1;
    l->cnonce = new_nonce();
    l->ctail = l->base + (uint64_t)(1 - l->cur) * l->half + RLOG_HDR;
    return 0;
}

int rlog_compact_add(struct rlog *l, const void *payload, uint32_t len)
{
    uint64_t end = l->base + (uint64_t)(2 - l->cur) * l->half;
    return put_record(l, &l->ctail, end, l->cnonce, payload, len);
}

int rlog_compact_commit(struct rlog *l)
{
    int target = 1 - l->cur;

    /* fsync the "temp file", then "rename" (header), then "fsync dir" */
    if (wl_dev_sync(l->dev) < 0 ||
        write_header(l, target, l->gen + 1, l->cnonce) < 0 ||
        wl_dev_sync(l->dev) < 0)
        return -1;
    l->cur = target;
    l->gen++;
    l->nonce = l->cnonce;
    l->tail = l->ctail;
    l->compacting = 0;
    return 0;
}
