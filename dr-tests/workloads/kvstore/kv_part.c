/* kv_part: a NoVoHT-style persistent partition; see kv_part.h. */
#include "kv_part.h"

#include <stdlib.h>
#include <string.h>

/* Compact when the live half is this full, or after this many removes
 * (NoVoHT's "how many removes before the file is rewritten"). */
#define COMPACT_FILL 0.5
unsigned kv_compact_removes = 256;

int kv_rec_encode(const struct kv_rec *r, struct wl_buf *out)
{
    uint8_t h[KV_REC_HDR];

    memset(h, 0, sizeof(h));
    wl_put64(h, r->seq);
    wl_put64(h + 8, r->opid);
    h[16] = r->kind;
    wl_put32(h + 20, r->klen);
    wl_put32(h + 24, r->vlen);
    if (wl_buf_add(out, h, sizeof(h)) < 0 ||
        wl_buf_add(out, r->key, r->klen) < 0 ||
        wl_buf_add(out, r->val, r->vlen) < 0)
        return -1;
    return 0;
}

int kv_rec_decode(const uint8_t *p, uint32_t len, struct kv_rec *r)
{
    if (len < KV_REC_HDR)
        return -1;
    r->seq = wl_get64(p);
    r->opid = wl_get64(p + 8);
    r->kind = p[16];
    r->klen = wl_get32(p + 20);
    r->vlen = wl_get32(p + 24);
    if ((uint64_t)KV_REC_HDR + r->klen + r->vlen != len ||
        r->kind < KV_PUT || r->kind > KV_APPEND || r->seq == 0)
        return -1;
    r->key = p + KV_REC_HDR;
    r->val = r->key + r->klen;
    return 0;
}

static size_t bucket(const struct kv_part *p, const uint8_t *key,
                     uint32_t klen)
{
    return (size_t)(wl_fnv64(WL_FNV_INIT, key, klen) & (p->nb - 1));
}

struct kv_entry *kv_part_find(struct kv_part *p, const uint8_t *key,
                              uint32_t klen)
{
    for (struct kv_entry *e = p->b[bucket(p, key, klen)]; e; e = e->next)
        if (e->klen == klen && memcmp(e->key, key, klen) == 0)
            return e;
    return NULL;
}

static int grow(struct kv_part *p)
{
    size_t nb = p->nb * 2;
    struct kv_entry **b = calloc(nb, sizeof(*b));

    if (!b)
        return -1;
    for (size_t i = 0; i < p->nb; i++) {
        struct kv_entry *e = p->b[i], *n;
        for (; e; e = n) {
            n = e->next;
            size_t h = (size_t)(wl_fnv64(WL_FNV_INIT, e->key, e->klen) &
                                (nb - 1));
            e->next = b[h];
            b[h] = e;
        }
    }
    free(p->b);
    p->b = b;
    p->nb = nb;
    return 0;
}

/* Applies r to memory if newer; returns 1 applied, 0 ignored, -1 error. */
static int apply(struct kv_part *p, const struct kv_rec *r)
{
    struct kv_entry *e = kv_part_find(p, r->key, r->klen);
    uint8_t *nv;
    uint32_t nvlen;

    if (e && r->seq <= e->seq)
        return 0;
    if (!e) {
        if (p->n >= 2 * p->nb && grow(p) < 0)
            return -1;
        e = calloc(1, sizeof(*e));
        if (!e || !(e->key = malloc(r->klen ? r->klen : 1))) {
            free(e);
            return -1;
        }
        memcpy(e->key, r->key, r->klen);
        e->klen = r->klen;
        e->dead = 1;
        size_t h = bucket(p, r->key, r->klen);
        e->next = p->b[h];
        p->b[h] = e;
        p->n++;
    }
    if (r->kind == KV_APPEND && !e->dead) {
        nvlen = e->vlen + r->vlen;
        nv = malloc(nvlen ? nvlen : 1);
        if (!nv)
            return -1;
        memcpy(nv, e->val, e->vlen);
        memcpy(nv + e->vlen, r->val, r->vlen);
    } else if (r->kind == KV_DEL) {
        nv = malloc(1);
        nvlen = 0;
        if (!nv)
            return -1;
    } else {
        nvlen = r->vlen;
        nv = malloc(nvlen ? nvlen : 1);
        if (!nv)
            return -1;
        memcpy(nv, r->val, r->vlen);
    }
    free(e->val);
    e->val = nv;
    e->vlen = nvlen;
    e->dead = r->kind == KV_DEL;
    e->seq = r->seq;
    e->opid = r->opid;
    if (r->seq > p->last)
        p->last = r->seq;
    if (r->kind == KV_DEL)
        p->removes++;
    return 1;
}

static int replay_cb(void *arg, const uint8_t *payload, uint32_t len)
{
    struct kv_rec r;

    if (kv_rec_decode(payload, len, &r) < 0)
        return -1;
    return apply(arg, &r) < 0 ? -1 : 0;
}

int kv_part_open(struct kv_part *p, int id, enum kv_role role,
                 struct wl_dev *dev, uint64_t base, uint64_t size)
{
    memset(p, 0, sizeof(*p));
    pthread_mutex_init(&p->mu, NULL);
    p->id = id;
    p->role = role;
    p->repl_fd = -1;
    p->nb = 64;
    p->b = calloc(p->nb, sizeof(*p->b));
    if (!p->b)
        return -1;
    if (rlog_open(&p->log, dev, base, size, 2, replay_cb, p) < 0)
        return -1;
    p->removes = 0;
    return 0;
}

void kv_part_close(struct kv_part *p)
{
    if (!p || !p->b)
        return;
    for (size_t i = 0; i < p->nb; i++) {
        struct kv_entry *e = p->b[i], *n;
        for (; e; e = n) {
            n = e->next;
            free(e->key);
            free(e->val);
            free(e);
        }
    }
    free(p->b);
    p->b = NULL;
    pthread_mutex_destroy(&p->mu);
}

static int entry_rec(const struct kv_entry *e, struct wl_buf *out)
{
    struct kv_rec r = {
        .seq = e->seq, .opid = e->opid,
        .kind = e->dead ? KV_DEL : KV_PUT,
        .klen = e->klen, .vlen = e->vlen, .key = e->key, .val = e->val,
    };
    return kv_rec_encode(&r, out);
}

static int compact(struct kv_part *p)
{
    struct wl_buf b = { 0 };
    int rc = -1;

    if (rlog_compact_begin(&p->log) < 0)
        goto cleanup;
    /* Tombstones are kept: they carry the seq and op id of the remove,
     * which the recovery checker needs (a departure from NoVoHT). */
    for (size_t i = 0; i < p->nb; i++)
        for (struct kv_entry *e = p->b[i]; e; e = e->next) {
            b.len = 0;
            if (entry_rec(e, &b) < 0 ||
                rlog_compact_add(&p->log, b.p, (uint32_t)b.len) != 0)
                goto cleanup;
        }
    if (rlog_compact_commit(&p->log) < 0)
        goto cleanup;
    wl_log("partition %d compacted: gen %u, %zu keys, last seq %llu", p->id,
           p->log.gen, p->n, (unsigned long long)p->last);
    p->removes = 0;
    rc = 0;
cleanup:
    wl_buf_free(&b);
    if (rc < 0)
        wl_log("partition %d: compaction failed", p->id);
    return rc;
}

int kv_part_take(struct kv_part *p, const struct kv_rec *r)
{
    struct wl_buf b = { 0 };
    struct kv_entry *e = kv_part_find(p, r->key, r->klen);
    int rc = -1;

    if (e && r->seq <= e->seq) {
        rc = 0;
        goto cleanup;
    }
    if (kv_rec_encode(r, &b) < 0)
        goto cleanup;
    rc = rlog_append(&p->log, b.p, (uint32_t)b.len);
    if (rc == RLOG_FULL) {
        /* compact what is applied so far, then log r in the new half */
        if (compact(p) < 0)
            goto cleanup;
        rc = rlog_append(&p->log, b.p, (uint32_t)b.len);
    }
    if (rc != 0) {
        rc = -1;
        goto cleanup;
    }
    rc = apply(p, r);
cleanup:
    wl_buf_free(&b);
    return rc;
}

int kv_part_sync(struct kv_part *p)
{
    if (rlog_sync(&p->log) < 0)
        return -1;
    if (rlog_fill(&p->log) > COMPACT_FILL || p->removes >= kv_compact_removes)
        return compact(p);
    return 0;
}

int kv_part_dump(struct kv_part *p, uint64_t after, struct wl_buf *out)
{
    struct wl_buf b = { 0 };
    int rc = 0;

    for (size_t i = 0; i < p->nb && rc == 0; i++)
        for (struct kv_entry *e = p->b[i]; e && rc == 0; e = e->next) {
            uint8_t l[4];
            if (e->seq <= after)
                continue;
            b.len = 0;
            if (entry_rec(e, &b) < 0)
                rc = -1;
            wl_put32(l, (uint32_t)b.len);
            if (rc == 0 && (wl_buf_add(out, l, 4) < 0 ||
                            wl_buf_add(out, b.p, b.len) < 0))
                rc = -1;
        }
    wl_buf_free(&b);
    return rc;
}

int kv_part_load_dump(struct kv_part *p, const uint8_t *b, uint32_t len)
{
    uint32_t pos = 0;
    int n = 0;

    while (pos < len) {
        struct kv_rec r;
        uint32_t l;
        if (len - pos < 4)
            return -1;
        l = wl_get32(b + pos);
        pos += 4;
        if (l > len - pos || kv_rec_decode(b + pos, l, &r) < 0)
            return -1;
        int t = kv_part_take(p, &r);
        if (t < 0)
            return -1;
        n += t;
        pos += l;
    }
    return n;
}

uint64_t kv_part_digest(struct kv_part *p)
{
    uint64_t d = 0;

    for (size_t i = 0; i < p->nb; i++)
        for (struct kv_entry *e = p->b[i]; e; e = e->next) {
            if (e->dead)
                continue;
            uint64_t h = wl_fnv64(WL_FNV_INIT, e->key, e->klen);
            h = wl_fnv64(h, "", 1);
            d += wl_fnv64(h, e->val, e->vlen);
        }
    return d;
}
