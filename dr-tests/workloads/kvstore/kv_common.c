/* kv_common: ring, superblock and wire encoding of cp-kvstore. */
#include "kv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kv_partition_of(const struct kv_config *c, const void *key,
                    uint32_t klen)
{
    uint64_t h = wl_fnv64(WL_FNV_INIT, key, klen);
    /* equal ranges of the 64-bit ring, ZHT section 2.2.2 */
    uint64_t width = UINT64_MAX / (uint64_t)c->nparts + 1;
    return (int)(h / width);
}

int kv_primary_of(const struct kv_config *c, int part)
{
    return part % c->nnodes;
}

int kv_secondary_of(const struct kv_config *c, int part)
{
    return c->nnodes > 1 ? (part + 1) % c->nnodes : -1;
}

uint64_t kv_region_base(const struct kv_config *c, int region)
{
    return KV_SB_SIZE + (uint64_t)region * c->region_size;
}

static void sb_encode(const struct kv_config *c, uint8_t *sb)
{
    memset(sb, 0, KV_SB_SIZE);
    memcpy(sb, KV_SB_MAGIC, 8);
    wl_put32(sb + 8, 1);
    wl_put32(sb + 12, (uint32_t)c->node);
    wl_put32(sb + 16, (uint32_t)c->nparts);
    wl_put32(sb + 20, (uint32_t)c->nnodes);
    wl_put64(sb + 24, c->region_size);
    wl_put64(sb + 32, c->epoch);
    for (int i = 0; i < c->nnodes; i++) {
        uint8_t *e = sb + 64 + 32 * i;
        memcpy(e, c->members[i].addr.host, strlen(c->members[i].addr.host));
        wl_put32(e + 24, (uint32_t)c->members[i].addr.port);
    }
    /* the CRC in the last 4 bytes is wl_sb_write's */
}

int kv_superblock_load(struct wl_dev *dev, struct kv_config *c, char *err,
                       size_t errlen)
{
    uint8_t sb[KV_SB_SIZE];
    uint64_t dsize = wl_dev_size(dev);
    int changed = 0;
    int valid = wl_sb_read(dev, sb, sizeof(sb),
                           KV_SB_SIZE + (uint64_t)(c->nparts + 1) * 8192,
                           KV_SB_MAGIC, err, errlen);

    if (valid < 0)
        return -1;
    if (valid) {
        int node = (int)wl_get32(sb + 12);
        int np = (int)wl_get32(sb + 16);
        int nn = (int)wl_get32(sb + 20);
        if (node != c->node || np != c->nparts || nn != c->nnodes) {
            snprintf(err, errlen,
                     "disk belongs to node %d of %d (%d partitions), "
                     "configured as node %d of %d (%d partitions)",
                     node, nn, np, c->node, c->nnodes, c->nparts);
            return -1;
        }
        c->region_size = wl_get64(sb + 24);
        c->epoch = wl_get64(sb + 32);
        for (int i = 0; i < nn; i++) {
            const uint8_t *e = sb + 64 + 32 * i;
            if (strncmp((const char *)e, c->members[i].addr.host, 24) ||
                (int)wl_get32(e + 24) != c->members[i].addr.port)
                changed = 1;
        }
        if (changed) {
            c->epoch++;
            wl_log("membership changed: new epoch %llu",
                   (unsigned long long)c->epoch);
        }
    } else {
        c->epoch = 1;
        c->region_size = ((dsize - KV_SB_SIZE) / (uint64_t)(c->nparts + 1)) &
                         ~(uint64_t)4095;
        changed = 1;
        wl_log("formatting disk: node %d, %d partitions, region %llu bytes",
               c->node, c->nparts, (unsigned long long)c->region_size);
    }
    if (changed) {
        sb_encode(c, sb);
        if (wl_sb_write(dev, sb, sizeof(sb), err, errlen) < 0)
            return -1;
    }
    return 0;
}

int kv_req_encode(const struct kv_req *r, struct wl_buf *out)
{
    uint8_t h[KV_REQ_HDR];

    memset(h, 0, sizeof(h));
    h[0] = r->op;
    wl_put32(h + 4, r->epoch);
    wl_put64(h + 8, r->opid);
    wl_put32(h + 16, r->klen);
    wl_put32(h + 20, r->vlen);
    wl_put32(h + 24, r->v2len);
    wl_put32(h + 28, r->timeout_ms);
    if (wl_buf_add(out, h, sizeof(h)) < 0 ||
        wl_buf_add(out, r->key, r->klen) < 0 ||
        wl_buf_add(out, r->val, r->vlen) < 0 ||
        wl_buf_add(out, r->val2, r->v2len) < 0)
        return -1;
    return 0;
}

int kv_req_decode(const uint8_t *b, uint32_t len, struct kv_req *r)
{
    uint64_t need;

    /* size and type are checked before anything is trusted */
    if (len < KV_REQ_HDR)
        return -1;
    r->op = b[0];
    r->epoch = wl_get32(b + 4);
    r->opid = wl_get64(b + 8);
    r->klen = wl_get32(b + 16);
    r->vlen = wl_get32(b + 20);
    r->v2len = wl_get32(b + 24);
    r->timeout_ms = wl_get32(b + 28);
    need = (uint64_t)KV_REQ_HDR + r->klen + r->vlen + r->v2len;
    if (need != len || r->op < KV_OP_INSERT || r->op > KV_OP_TABLE)
        return -1;
    r->key = b + KV_REQ_HDR;
    r->val = r->key + r->klen;
    r->val2 = r->val + r->vlen;
    return 0;
}

int kv_rep_encode(uint8_t status, uint32_t epoch, uint64_t seq,
                  const void *val, uint32_t vlen, struct wl_buf *out)
{
    uint8_t h[KV_REP_HDR];

    memset(h, 0, sizeof(h));
    h[0] = status;
    wl_put32(h + 4, epoch);
    wl_put64(h + 8, seq);
    wl_put32(h + 16, vlen);
    if (wl_buf_add(out, h, sizeof(h)) < 0 || wl_buf_add(out, val, vlen) < 0)
        return -1;
    return 0;
}
