#include "sync_job.h"

#include <inttypes.h>
#include <jansson.h>
#include <rados/librados.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sync_diff.h"
#include "sync_identity.h"
#include "sync_util.h"

/* PLAN, the DR image: incremental or full, marked, sized, verify method. */
static int
plan_dr_image(struct sync_job *j)
{
    const struct sync_opts *o = j->o;
    int rc;

    if (j->base != NULL) {
        if (!j->dp.base_ex && !o->full_resync) {
            sync_seterr(j->err, j->errlen, "dr: base snapshot %s@%s is "
                        "missing at DR (pool %s); refusing an incremental "
                        "copy; rerun with --full-resync to copy the whole "
                        "image", o->image, j->base, o->dst.pool);
            return SYNC_ENOBASE;
        }
        j->full = !j->dp.base_ex || o->full_resync;
    }
    j->r->full = j->full;
    /* Before the first write, the DR image gets its creation marker if it
     * has none (created just now, by an older cutpoint-sync, or by
     * someone else), so the record can name the image it describes. */
    if (j->dp.ident.marker[0] == '\0') {
        if (sync_identity_mark(j->dst, &j->dp.ident, j->err, j->errlen) < 0)
            return SYNC_ERR;
        sync_logkv(o, "info", "msg=\"marked dr image\" image=%s id=%s "
                   "marker=%s", o->image, j->dp.ident.id,
                   j->dp.ident.marker);
    }
    if (j->dp.dsize != j->size) {
        rc = rbd_resize(j->dst, j->size);
        if (rc < 0) {
            sync_seterr(j->err, j->errlen, "dr: resize %s to %" PRIu64
                        ": %s", o->image, j->size, strerror(-rc));
            return SYNC_ERR;
        }
        sync_logkv(o, "info", "msg=\"resized dr image\" image=%s from=%"
                   PRIu64 " to=%" PRIu64, o->image, j->dp.dsize, j->size);
    }
    if (sync_verify_choose(o, j->dc.io, j->dst, &j->layout, j->err,
                           j->errlen) < 0)
        return SYNC_ERR;
    j->r->extent_verify = j->layout.osd_verify ? SYNC_VERIFY_OSD
                                               : SYNC_VERIFY_READBACK;
    return SYNC_OK;
}

/*
 * PLAN, the record: it names this copy and our DR client (see
 * sync_lock_break_stale); it is saved before the first write takes the
 * lock.  A record of this very copy keeps its done prefix: we resume from
 * it.  Returns sync_progress_set's result (perr says why on failure).
 */
static int
plan_record(struct sync_job *j, char *perr, size_t perrlen)
{
    const struct sync_opts *o = j->o;
    char why[512], *addrs = NULL;
    int rc;

    rc = sync_progress_set(&j->want, o->dst.pool, o->image,
                           j->full ? "" : j->base, o->target, j->size, perr,
                           perrlen);
    if (rc != 0)
        return rc;
    /* librbd names a lock owner by its client address, e.g.
     * "10.77.0.1:0/1261527113" (the nonce makes it unique per run). */
    if (rados_getaddrs(j->dc.cluster, &addrs) == 0 && addrs != NULL)
        snprintf(j->want.owner, sizeof(j->want.owner), "%s", addrs);
    free(addrs);
    j->want.dr = j->dp.ident;
    /* The done prefix is skipped only if it was written into this very
     * image: a DR image removed and recreated under the same name holds
     * none of it (sync_identity.h). */
    if (j->have_rec && sync_progress_resumable(&j->have, &j->want, why,
                                               sizeof(why))) {
        j->want.done_offset = j->have.done_offset;
        j->want.bytes = j->have.bytes;
        j->want.extents = j->have.extents;
        j->r->resumed_from = j->have.done_offset;
    } else if (j->have_rec) {
        sync_logkv(o, sync_progress_matches(&j->have, &j->want) ? "warn"
                   : "info", "msg=\"progress record discarded, copying "
                   "from the start\" image=%s target=%s done_offset=%"
                   PRIu64 " reason=\"%s\"", o->image, o->target,
                   j->have.done_offset, why);
    }
    if (sync_progress_save(j->prog_path, &j->want, perr, perrlen) < 0)
        sync_logkv(o, "warn", "msg=\"progress record not saved\" "
                   "error=\"%s\"", perr);
    return 0;
}

/* PLAN, the work list: the drift to repair, then the diff; split at chunk
 * boundaries; the prefix a resumed record has done is skipped. */
static int
plan_work(struct sync_job *j)
{
    const struct sync_opts *o = j->o;
    struct sync_result *r = j->r;

    r->bytes_changed = sync_extents_bytes(&j->diff, 0);
    if (sync_extents_uncovered(&j->diff, &j->drift,
                               j->full ? SYNC_ZERO : SYNC_DATA,
                               &j->work) < 0) {
        sync_seterr(j->err, j->errlen, "out of memory");
        return SYNC_ERR;
    }
    r->bytes_repaired = sync_extents_bytes(&j->work, 0);
    for (size_t i = 0; i < j->diff.n; i++) {
        if (sync_extents_add(&j->work, j->diff.v[i].off, j->diff.v[i].len,
                             j->diff.v[i].kind) < 0) {
            sync_seterr(j->err, j->errlen, "out of memory");
            return SYNC_ERR;
        }
    }
    if (sync_extents_normalize(&j->work) < 0 ||
        sync_extents_split(&j->work, o->chunk, &j->items) < 0) {
        sync_seterr(j->err, j->errlen, "cannot build the work list");
        return SYNC_ERR;
    }
    r->total = sync_extents_bytes(&j->items, 0);
    if (r->resumed_from > 0) {
        while (j->first < j->items.n &&
               j->items.v[j->first].off + j->items.v[j->first].len <=
               r->resumed_from)
            j->first++;
        sync_logkv(o, "info", "msg=\"resuming\" image=%s target=%s offset=%"
                   PRIu64 " skipped_extents=%zu", o->image, o->target,
                   r->resumed_from, j->first);
    }
    return SYNC_OK;
}

/* PLAN: the DR image, the record, both diffs, the work list. */
int
sync_plan(struct sync_job *j)
{
    const struct sync_opts *o = j->o;
    struct sync_diff_job dj;
    pthread_t tdj;
    char perr[512];
    int ret, rc, joined;

    if ((ret = plan_dr_image(j)) != SYNC_OK)
        return ret;
    /* The primary's diff runs on a thread while this one saves the
     * record and lists the drift at DR: different clusters. */
    memset(&dj, 0, sizeof(dj));
    dj.img = j->src;
    dj.from = j->full ? NULL : j->base;
    dj.size = j->size;
    dj.kind = 0;
    dj.l = &j->diff;
    joined = sync_start_or_run(&tdj, sync_diff_job_run, &dj);
    rc = plan_record(j, perr, sizeof(perr));
    /*
     * Whatever changed at DR since the base (an interrupted run of some
     * other copy, a stray writer) must be put back too: for an
     * incremental copy the primary's target holds the right bytes there;
     * for a full copy anything the primary does not have must read as
     * zeroes.
     */
    if (rc == 0)
        rc = sync_diff_collect(j->dst, j->full ? NULL : j->base, j->size,
                               SYNC_ZERO, 1, &j->drift, "dr", perr,
                               sizeof(perr));
    if (joined)
        pthread_join(tdj, NULL);
    if (dj.rc < 0) {
        sync_seterr(j->err, j->errlen, "%s", dj.err);
        return SYNC_ERR;
    }
    if (rc < 0) {
        sync_seterr(j->err, j->errlen, "%s", perr);
        return SYNC_ERR;
    }
    if ((ret = plan_work(j)) != SYNC_OK)
        return ret;
    sync_emit(o, json_pack("{s:s,s:s,s:s?,s:s,s:s,s:I,s:I,s:I,s:I,s:I}",
                           "event", "start", "image", o->image, "base",
                           j->full ? NULL : j->base, "target", o->target,
                           "mode", j->full ? "full" : "incremental", "size",
                           (json_int_t)j->size, "total",
                           (json_int_t)j->r->total, "bytes_changed",
                           (json_int_t)j->r->bytes_changed, "extents",
                           (json_int_t)j->items.n, "resume_offset",
                           (json_int_t)j->r->resumed_from));
    sync_phase_end(j->r, SYNC_PH_PLAN, &j->tph);
    return SYNC_OK;
}
