/* sl_common: superblock, messages and the derived view of cp-sharedlog. */
#include "sl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t sl_region_base(const struct sl_config *c, int region)
{
    return SL_SB_SIZE + (uint64_t)region * c->region_size;
}

int sl_superblock_load(struct wl_dev *dev, struct sl_config *c, char *err,
                       size_t errlen)
{
    uint8_t sb[SL_SB_SIZE];
    uint64_t dsize = wl_dev_size(dev);
    int valid = wl_sb_read(dev, sb, sizeof(sb),
                           SL_SB_SIZE + SL_NREGIONS * 65536, SL_SB_MAGIC,
                           err, errlen);

    if (valid < 0)
        return -1;
    if (valid) {
        int node = (int)wl_get32(sb + 12), nn = (int)wl_get32(sb + 16);
        if (node != c->node || nn != c->nnodes) {
            snprintf(err, errlen, "disk belongs to node %d of %d, "
                     "configured as node %d of %d", node, nn, c->node,
                     c->nnodes);
            return -1;
        }
        c->region_size = wl_get64(sb + 24);
        return 0;
    }
    c->region_size = ((dsize - SL_SB_SIZE) / SL_NREGIONS) & ~(uint64_t)4095;
    memset(sb, 0, sizeof(sb));
    memcpy(sb, SL_SB_MAGIC, 8);
    wl_put32(sb + 8, 1);
    wl_put32(sb + 12, (uint32_t)c->node);
    wl_put32(sb + 16, (uint32_t)c->nnodes);
    wl_put64(sb + 24, c->region_size);
    wl_log("formatting disk: node %d of %d, region %llu bytes", c->node,
           c->nnodes, (unsigned long long)c->region_size);
    return wl_sb_write(dev, sb, sizeof(sb), err, errlen);
}

int sl_msg_encode(const struct sl_msg *m, struct wl_buf *out)
{
    uint8_t h[SL_MSG_HDR];

    memset(h, 0, sizeof(h));
    h[0] = m->type;
    h[1] = m->status;
    wl_put32(h + 4, m->a);
    wl_put64(h + 8, m->b);
    wl_put64(h + 16, m->c);
    wl_put64(h + 24, m->d);
    wl_put32(h + 32, m->dlen);
    if (wl_buf_add(out, h, sizeof(h)) < 0 ||
        wl_buf_add(out, m->data, m->dlen) < 0)
        return -1;
    return 0;
}

int sl_msg_decode(const uint8_t *p, uint32_t len, struct sl_msg *m)
{
    if (len < SL_MSG_HDR)
        return -1;
    m->type = p[0];
    m->status = p[1];
    m->a = wl_get32(p + 4);
    m->b = wl_get64(p + 8);
    m->c = wl_get64(p + 16);
    m->d = wl_get64(p + 24);
    m->dlen = wl_get32(p + 32);
    if ((uint64_t)SL_MSG_HDR + m->dlen != len)
        return -1;
    m->data = p + SL_MSG_HDR;
    return 0;
}

int sl_call(int fd, const struct sl_msg *req, struct sl_msg *rep,
            uint8_t **body)
{
    struct wl_buf b = { 0 };
    uint32_t len;
    int rc = -1;

    *body = NULL;
    if (sl_msg_encode(req, &b) < 0 ||
        wl_frame_send(fd, b.p, (uint32_t)b.len) < 0 ||
        wl_frame_recv(fd, body, &len, SL_MAX_FRAME) < 0)
        goto cleanup;
    if (sl_msg_decode(*body, len, rep) < 0) {
        free(*body);
        *body = NULL;
        goto cleanup;
    }
    rc = 0;
cleanup:
    wl_buf_free(&b);
    return rc;
}

int sl_reply(int fd, const struct sl_msg *rep)
{
    struct wl_buf b = { 0 };
    int rc = -1;

    if (sl_msg_encode(rep, &b) == 0 &&
        wl_frame_send(fd, b.p, (uint32_t)b.len) == 0)
        rc = 0;
    wl_buf_free(&b);
    return rc;
}

int sl_entries_add(struct wl_buf *out, uint64_t slot, const uint8_t *val,
                   uint32_t len)
{
    uint8_t h[12];

    wl_put64(h, slot);
    wl_put32(h + 8, len);
    if (wl_buf_add(out, h, 12) < 0 || wl_buf_add(out, val, len) < 0)
        return -1;
    return 0;
}

/* ---- view ---- */

int sl_view_init(struct sl_view *v, int nservers)
{
    memset(v, 0, sizeof(*v));
    v->nservers = nservers;
    return 0;
}

void sl_view_free(struct sl_view *v)
{
    if (!v)
        return;
    for (size_t i = 0; i < v->ncuts; i++)
        free(v->cuts[i].vec);
    free(v->cuts);
    memset(v, 0, sizeof(*v));
}

uint64_t sl_view_total(const struct sl_view *v)
{
    const uint64_t *l = sl_view_latest(v);
    uint64_t t = 0;

    for (int i = 0; l && i < v->nservers; i++)
        t += l[i];
    return t;
}

const uint64_t *sl_view_latest(const struct sl_view *v)
{
    return v->ncuts ? v->cuts[v->ncuts - 1].vec : NULL;
}

int sl_view_finalized(const struct sl_view *v, int shard)
{
    return v->final_slot[shard] && v->last_slot >= v->final_slot[shard];
}

int sl_view_apply(struct sl_view *v, uint64_t slot, const uint8_t *val,
                  uint32_t len)
{
    if (slot != v->last_slot + 1 || len < 1)
        return -1;
    switch (val[0]) {
    case SL_CMD_NOOP:
        break;
    case SL_CMD_CUT: {
        if (len < 5 || wl_get32(val + 1) != (uint32_t)v->nservers ||
            len != 5 + 8 * (uint32_t)v->nservers)
            return -1;
        if (v->ncuts == v->cap) {
            size_t nc = v->cap ? v->cap * 2 : 64;
            struct sl_cut *n = realloc(v->cuts, nc * sizeof(*n));
            if (!n)
                return -1;
            v->cuts = n;
            v->cap = nc;
        }
        struct sl_cut *cut = &v->cuts[v->ncuts];
        cut->vec = malloc(sizeof(uint64_t) * (size_t)v->nservers);
        if (!cut->vec)
            return -1;
        cut->slot = slot;
        cut->base = sl_view_total(v);
        for (int i = 0; i < v->nservers; i++)
            cut->vec[i] = wl_get64(val + 5 + 8 * i);
        v->ncuts++;
        break;
    }
    case SL_CMD_ADD_SHARD:
        if (len != 5 || wl_get32(val + 1) >= (uint32_t)v->nservers / 2)
            return -1;
        v->active |= 1ULL << wl_get32(val + 1);
        break;
    case SL_CMD_FINALIZE:
        if (len != 13 || wl_get32(val + 1) >= (uint32_t)v->nservers / 2)
            return -1;
        if (!v->final_slot[wl_get32(val + 1)])
            v->final_slot[wl_get32(val + 1)] = wl_get64(val + 5);
        break;
    case SL_CMD_TRIM:
        if (len != 9)
            return -1;
        if (wl_get64(val + 1) > v->trim)
            v->trim = wl_get64(val + 1);
        break;
    default:
        return -1;
    }
    v->last_slot = slot;
    return 0;
}

static uint64_t prev_of(const struct sl_view *v, size_t k, int i)
{
    return k ? v->cuts[k - 1].vec[i] : 0;
}

int64_t sl_view_gsn(const struct sl_view *v, int server, uint64_t idx)
{
    size_t lo = 0, hi = v->ncuts;

    /* first cut whose entry for server exceeds idx */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (v->cuts[mid].vec[server] > idx)
            hi = mid;
        else
            lo = mid + 1;
    }
    if (lo == v->ncuts)
        return -1;
    uint64_t g = v->cuts[lo].base;
    for (int i = 0; i < server; i++)
        g += v->cuts[lo].vec[i] - prev_of(v, lo, i);
    return (int64_t)(g + idx - prev_of(v, lo, server));
}

int sl_view_locate(const struct sl_view *v, uint64_t gsn, int *server,
                   uint64_t *idx)
{
    size_t lo = 0, hi = v->ncuts;

    if (gsn >= sl_view_total(v))
        return -1;
    /* last cut whose base <= gsn and that covers it */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (v->cuts[mid].base > gsn)
            hi = mid;
        else
            lo = mid + 1;
    }
    /* cuts that added nothing share a base; walk forward to the one
     * that actually covers gsn */
    for (size_t k = lo ? lo - 1 : 0; k < v->ncuts; k++) {
        uint64_t g = v->cuts[k].base;
        for (int i = 0; i < v->nservers; i++) {
            uint64_t d = v->cuts[k].vec[i] - prev_of(v, k, i);
            if (gsn < g + d) {
                *server = i;
                *idx = prev_of(v, k, i) + (gsn - g);
                return 0;
            }
            g += d;
        }
    }
    return -1;
}
