#include "sync_extents.h"

#include <stdlib.h>

#include "sync_digest.h"

int
sync_extents_add(struct sync_extents *l, uint64_t off, uint64_t len, int kind)
{
    struct sync_extent *v;
    size_t cap;

    if (len == 0)
        return 0;
    if (off + len < off)
        return -1;
    if (l->n == l->cap) {
        cap = l->cap ? l->cap * 2 : 64;
        v = realloc(l->v, cap * sizeof(*v));
        if (v == NULL)
            return -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n].off = off;
    l->v[l->n].len = len;
    l->v[l->n].kind = kind;
    l->n++;
    return 0;
}

static int
extent_cmp(const void *a, const void *b)
{
    const struct sync_extent *x = a, *y = b;

    if (x->off != y->off)
        return x->off < y->off ? -1 : 1;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return x->kind - y->kind;
}

int
sync_extents_normalize(struct sync_extents *l)
{
    size_t i, w = 0;
    uint64_t end;

    if (l->n == 0)
        return 0;
    qsort(l->v, l->n, sizeof(*l->v), extent_cmp);
    for (i = 1; i < l->n; i++) {
        struct sync_extent *cur = &l->v[w];
        struct sync_extent *nx = &l->v[i];

        end = cur->off + cur->len;
        if (nx->off > end) {
            l->v[++w] = *nx;
            continue;
        }
        if (nx->kind != cur->kind) {
            if (nx->off < end)
                return -1;
            l->v[++w] = *nx;   /* touching, different kinds: keep apart */
            continue;
        }
        if (nx->off + nx->len > end)
            cur->len = nx->off + nx->len - cur->off;
    }
    l->n = w + 1;
    return 0;
}

int
sync_extents_uncovered(const struct sync_extents *base,
                       const struct sync_extents *extra, int kind,
                       struct sync_extents *out)
{
    size_t i, j = 0;

    for (i = 0; i < extra->n; i++) {
        uint64_t pos = extra->v[i].off;
        uint64_t end = pos + extra->v[i].len;

        /* Skip base extents that end before this one starts; base is
         * sorted, so j only moves forward. */
        while (j < base->n && base->v[j].off + base->v[j].len <= pos)
            j++;
        for (size_t k = j; k < base->n && pos < end; k++) {
            uint64_t bo = base->v[k].off, be = bo + base->v[k].len;

            if (bo >= end)
                break;
            if (bo > pos && sync_extents_add(out, pos, bo - pos, kind) < 0)
                return -1;
            if (be > pos)
                pos = be;
        }
        if (pos < end && sync_extents_add(out, pos, end - pos, kind) < 0)
            return -1;
    }
    return 0;
}

int
sync_extents_split(const struct sync_extents *in, uint64_t chunk,
                   struct sync_extents *out)
{
    size_t i;

    if (chunk == 0)
        return -1;
    for (i = 0; i < in->n; i++) {
        uint64_t pos = in->v[i].off, end = pos + in->v[i].len;

        while (pos < end) {
            uint64_t next = (pos / chunk + 1) * chunk;
            uint64_t stop = next < end ? next : end;

            if (sync_extents_add(out, pos, stop - pos, in->v[i].kind) < 0)
                return -1;
            pos = stop;
        }
    }
    return 0;
}

int
sync_extents_add_runs(struct sync_extents *out, const char *buf,
                      uint64_t off, uint64_t len, uint64_t block)
{
    uint64_t pos = off, end = off + len, run = off;
    int kind = 0;

    if (block == 0 || end < off)
        return -1;
    while (pos < end) {
        uint64_t next = (pos / block + 1) * block;
        uint64_t stop = next < end ? next : end;
        int k = sync_buf_is_zero(buf + (pos - off), stop - pos) ? SYNC_ZERO
                                                                : SYNC_DATA;

        if (kind != 0 && k != kind) {
            if (sync_extents_add(out, run, pos - run, kind) < 0)
                return -1;
            run = pos;
        }
        kind = k;
        pos = stop;
    }
    if (kind != 0 && sync_extents_add(out, run, end - run, kind) < 0)
        return -1;
    return 0;
}

uint64_t
sync_extents_bytes(const struct sync_extents *l, int kind)
{
    uint64_t sum = 0;
    size_t i;

    for (i = 0; i < l->n; i++)
        if (kind == 0 || l->v[i].kind == kind)
            sum += l->v[i].len;
    return sum;
}

void
sync_extents_clear(struct sync_extents *l)
{
    if (l == NULL)
        return;
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}
