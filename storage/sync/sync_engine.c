#include "sync_engine.h"

#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <rados/librados.h>
#include <rbd/librbd.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sync_conn.h"
#include "sync_copy.h"
#include "sync_extents.h"
#include "sync_job.h"
#include "sync_lock.h"
#include "sync_progress.h"
#include "sync_site.h"
#include "sync_util.h"
#include "sync_verify.h"

void
sync_opts_init(struct sync_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->chunk = 4u << 20;
    o->workers = 16;
    o->progress_ms = 500;
    o->op_timeout_s = 60;
    o->state_dir = "/var/lib/cutpoint/sync";
}

static json_t *
done_event(const struct sync_opts *o, const struct sync_result *r)
{
    json_t *j = json_pack("{s:s,s:s,s:s?,s:s,s:b,s:b,s:I,s:I,s:I,s:I,s:I,"
                          "s:I,s:I,s:I,s:I,s:I,s:I,s:f}",
                          "event", "done", "image", o->image, "base",
                          r->full ? NULL : o->base, "target", o->target,
                          "full", r->full, "already", r->already,
                          "size", (json_int_t)r->size,
                          "total", (json_int_t)r->total,
                          "bytes_changed", (json_int_t)r->bytes_changed,
                          "bytes_shipped", (json_int_t)r->bytes_shipped,
                          "bytes_zeroed", (json_int_t)r->bytes_zeroed,
                          "bytes_zero_data", (json_int_t)r->bytes_zero_data,
                          "bytes_zero_skipped",
                          (json_int_t)r->bytes_zero_skipped,
                          "bytes_repaired", (json_int_t)r->bytes_repaired,
                          "bytes_shipped_total",
                          (json_int_t)r->bytes_shipped_total,
                          "extents", (json_int_t)r->extents,
                          "resumed_from", (json_int_t)r->resumed_from,
                          "seconds", r->seconds);

    if (j != NULL) {
        static const char *const names[SYNC_PH_COUNT] = {
            "start", "connect", "open", "plan", "copy", "snap", "verify",
            "finish"};
        json_t *ph = json_object();

        for (int i = 0; ph != NULL && i < SYNC_PH_COUNT; i++)
            json_object_set_new(ph, names[i],
                                json_real(((double)(int64_t)(r->phase_ms[i]
                                           * 10.0 + 0.5)) / 10.0));
        json_object_set_new(j, "phase_ms", ph);
    }
    if (j != NULL && !r->already)
        json_object_set_new(j, "extent_verify", json_string(
            r->extent_verify == SYNC_VERIFY_OSD ? "osd-crc32c"
                                                : "readback-sha256"));
    if (j != NULL && r->src_hash[0] != '\0') {
        json_object_set_new(j, "verified_full", json_boolean(r->verified_full));
        json_object_set_new(j, "primary_sha256", json_string(r->src_hash));
        json_object_set_new(j, "dr_sha256", json_string(r->dst_hash));
    }
    return j;
}

/* START: options, the run lock, the record of an earlier run. */
static int
run_start(struct sync_job *j)
{
    const struct sync_opts *o = j->o;
    char perr[512];
    int rc;

    if (o->image == NULL || o->target == NULL || o->chunk == 0 ||
        o->workers < 1 || o->rate_mbps < 0) {
        sync_seterr(j->err, j->errlen, "invalid options");
        return SYNC_ERR;
    }
    if (sync_progress_path(j->prog_path, sizeof(j->prog_path), o->state_dir,
                           o->dst.pool, o->image) < 0) {
        sync_seterr(j->err, j->errlen, "progress path too long or invalid "
                    "pool name");
        return SYNC_ERR;
    }
    if (!o->verify_only && sync_lock_take(j->prog_path, &j->lock_fd, j->err,
                                          j->errlen) < 0)
        return SYNC_ERR;
    rc = sync_progress_load(j->prog_path, &j->have, perr, sizeof(perr));
    if (rc == 0) {
        j->have_rec = 1;
    } else if (rc == -1) {
        sync_logkv(o, "warn", "msg=\"ignoring unreadable progress record\" "
                   "path=%s error=\"%s\"", j->prog_path, perr);
    }
    sync_phase_end(j->r, SYNC_PH_START, &j->tph);
    return SYNC_OK;
}

/* CONNECT: both sites at once (sync_site.h), judged primary first. */
static int
run_connect(struct sync_job *j)
{
    const struct sync_opts *o = j->o;
    pthread_t tsp;
    int joined;

    j->full = j->base == NULL || o->full_resync;
    j->sp.o = j->dp.o = o;
    j->sp.c = &j->sc;
    j->dp.c = &j->dc;
    j->sp.base = j->dp.base = j->base;
    j->dp.have = j->have_rec ? &j->have : NULL;
    j->dp.open = !o->verify_only;
    joined = sync_start_or_run(&tsp, sync_site_src_prep, &j->sp);
    sync_site_dst_prep(&j->dp);
    if (joined)
        pthread_join(tsp, NULL);
    j->src = j->sp.img;
    j->dst = j->dp.img;
    sync_phase_end(j->r, SYNC_PH_CONNECT, &j->tph);
    if (j->sp.conn_rc < 0 || j->dp.conn_rc < 0) {
        sync_seterr(j->err, j->errlen, "%s",
                    j->sp.conn_rc < 0 ? j->sp.err : j->dp.err);
        return SYNC_ERR;
    }
    if (j->sp.ret != SYNC_OK) {
        sync_seterr(j->err, j->errlen, "%s", j->sp.err);
        return j->sp.ret;
    }
    j->size = j->sp.info.size;
    j->r->size = j->size;
    return SYNC_OK;
}

/* Open the DR target snapshot as j->dsnap and hash it against the
 * primary's (sync_verify_hash_both). */
static int
hash_target(struct sync_job *j, const char *what)
{
    const struct sync_opts *o = j->o;
    int rc;

    rc = rbd_open_read_only(j->dc.io, o->image, &j->dsnap, o->target);
    if (rc < 0) {
        j->dsnap = NULL;
        sync_seterr(j->err, j->errlen, "dr: %s %s@%s: %s", what, o->image,
                    o->target, strerror(-rc));
        return SYNC_ERR;
    }
    return sync_verify_hash_both(o, j->src, j->dsnap, j->size, j->r, j->err,
                                 j->errlen);
}

/* --verify-only: compare the two snapshots, write nothing. */
static int
run_compare(struct sync_job *j)
{
    int ret = hash_target(j, "snapshot");

    j->r->already = 1;
    sync_phase_end(j->r, SYNC_PH_VERIFY, &j->tph);
    return ret;
}

/* OPEN: the DR image (created for a full copy only), judged. */
static int
run_open(struct sync_job *j)
{
    const struct sync_opts *o = j->o;
    int rc;

    if (j->dp.missing && !j->full) {
        sync_seterr(j->err, j->errlen, "dr: base snapshot %s@%s is missing "
                    "at DR (the image does not exist in pool %s); refusing "
                    "an incremental copy; rerun with --full-resync to copy "
                    "the whole image", o->image, j->base, o->dst.pool);
        return SYNC_ENOBASE;
    }
    if (j->dp.missing) {
        int order = (int)j->sp.info.order;

        rc = rbd_create(j->dc.io, o->image, j->size, &order);
        if (rc < 0) {
            sync_seterr(j->err, j->errlen, "dr: create image %s/%s: %s",
                        o->dst.pool, o->image, strerror(-rc));
            return SYNC_ERR;
        }
        sync_logkv(o, "info", "msg=\"created dr image\" image=%s size=%"
                   PRIu64 " order=%d", o->image, j->size, order);
        rc = rbd_open(j->dc.io, o->image, &j->dp.img, NULL);
        if (rc < 0) {
            j->dp.img = NULL;
            sync_seterr(j->err, j->errlen, "dr: open image %s/%s: %s",
                        o->dst.pool, o->image, strerror(-rc));
            return SYNC_ERR;
        }
        j->dst = j->dp.img;
        j->dp.ret = sync_site_dst_lookups(&j->dp);
    }
    if (j->dp.ret != SYNC_OK) {
        sync_seterr(j->err, j->errlen, "%s", j->dp.err);
        return j->dp.ret;
    }
    /* Idempotence: the snapshot is created only after every extent was
     * verified, so its presence means a completed copy. */
    j->r->already = j->dp.target_ex;
    sync_phase_end(j->r, SYNC_PH_OPEN, &j->tph);
    return SYNC_OK;
}

/* The target is at DR already: forget the record, hash if asked. */
static int
run_already(struct sync_job *j)
{
    const struct sync_opts *o = j->o;
    char perr[512];
    int ret;

    j->r->full = j->full;
    sync_logkv(o, "info", "msg=\"target already at dr\" image=%s target=%s",
               o->image, o->target);
    if (j->have_rec)
        sync_progress_remove(j->prog_path, perr, sizeof(perr));
    sync_phase_end(j->r, SYNC_PH_FINISH, &j->tph);
    if (!o->verify_full)
        return SYNC_OK;
    ret = hash_target(j, "open");
    sync_phase_end(j->r, SYNC_PH_VERIFY, &j->tph);
    return ret;
}

/* COPY (sync_copy.h). */
static int
run_copy(struct sync_job *j)
{
    int ret;

    ret = sync_copy_all(j->o, j->src, j->dst, &j->layout,
                        j->items.v + j->first, j->items.n - j->first,
                        j->r->total, j->prog_path, &j->want, j->r,
                        &j->end_offset, j->err, j->errlen);
    sync_phase_end(j->r, SYNC_PH_COPY, &j->tph);
    return ret;
}

/* SNAP: only now may the DR snapshot exist. */
static int
run_snap(struct sync_job *j)
{
    const struct sync_opts *o = j->o;
    struct sync_result *r = j->r;
    int rc;

    /* Without --verify-full the primary is done with: close it while
     * the DR snapshot is taken. */
    if (!o->verify_full) {
        j->src_close.img = j->src;
        j->src = NULL;
        j->closing = sync_start_or_run(&j->tclose, sync_site_close_run,
                                       &j->src_close);
    }
    if ((rc = rbd_flush(j->dst)) < 0) {
        sync_seterr(j->err, j->errlen, "dr: flush %s: %s", o->image,
                    strerror(-rc));
        return SYNC_ERR;
    }
    if ((rc = rbd_snap_create(j->dst, o->target)) < 0) {
        sync_seterr(j->err, j->errlen, "dr: create snapshot %s@%s: %s",
                    o->image, o->target, strerror(-rc));
        return SYNC_ERR;
    }
    /* The copy is complete and durable (the snapshot is its marker):
     * the final progress event (see sync_copy_all). */
    sync_emit(o, sync_copy_progress_event(r->bytes_shipped, r->extents,
                                          j->end_offset, r->total,
                                          r->bytes_zeroed));
    sync_phase_end(r, SYNC_PH_SNAP, &j->tph);
    return SYNC_OK;
}

/* VERIFY: --verify-full; never leave a snapshot at DR that failed it. */
static int
run_verify(struct sync_job *j)
{
    const struct sync_opts *o = j->o;
    int ret, rc;

    if (o->verify_full && (ret = hash_target(j, "open")) != SYNC_OK) {
        if (j->dsnap == NULL) {        /* it did not open */
            rbd_snap_remove(j->dst, o->target);
            return ret;
        }
        rbd_close(j->dsnap);
        j->dsnap = NULL;
        rc = rbd_snap_remove(j->dst, o->target);
        if (rc < 0)
            sync_logkv(o, "error", "msg=\"cannot remove unverified dr "
                       "snapshot\" image=%s target=%s error=\"%s\"",
                       o->image, o->target, strerror(-rc));
        return ret;
    }
    sync_phase_end(j->r, SYNC_PH_VERIFY, &j->tph);
    return SYNC_OK;
}

/* FINISH: the copy needs its record no more. */
static int
run_finish(struct sync_job *j)
{
    char perr[512];

    if (sync_progress_remove(j->prog_path, perr, sizeof(perr)) < 0)
        sync_logkv(j->o, "warn", "msg=\"progress record not removed\" "
                   "error=\"%s\"", perr);
    sync_phase_end(j->r, SYNC_PH_FINISH, &j->tph);
    return SYNC_OK;
}

/* Every run that got past START ends here: the done event on success,
 * then both sites closed in parallel (the primary may be closing
 * already), the run lock given back. */
static void
run_end(struct sync_job *j, int ret)
{
    struct sync_result *r = j->r;

    r->seconds = (double)(sync_now_ns() - j->t0) / 1e9;
    if (ret == SYNC_OK)
        sync_emit(j->o, done_event(j->o, r));
    j->tph = sync_now_ns();
    if (!j->closing) {
        j->src_close.img = j->src;
        j->closing = sync_start_or_run(&j->tclose, sync_site_close_run,
                                       &j->src_close);
    }
    j->src = NULL;
    if (j->dsnap != NULL)
        rbd_close(j->dsnap);
    if (j->dst != NULL)
        rbd_close(j->dst);
    sync_conn_close(&j->dc);
    if (j->closing)
        pthread_join(j->tclose, NULL);
    if (j->lock_fd >= 0)
        close(j->lock_fd);
    sync_extents_clear(&j->diff);
    sync_extents_clear(&j->drift);
    sync_extents_clear(&j->work);
    sync_extents_clear(&j->items);
    r->teardown_ms = (double)(sync_now_ns() - j->tph) / 1e6;
    r->seconds = (double)(sync_now_ns() - j->t0) / 1e9;
}

int
sync_run(const struct sync_opts *o, struct sync_result *r, char *err,
         size_t errlen)
{
    struct sync_job j;
    int ret;

    memset(&j, 0, sizeof(j));
    memset(r, 0, sizeof(*r));
    j.o = o;
    j.r = r;
    j.err = err;
    j.errlen = errlen;
    j.base = o->base != NULL && o->base[0] != '\0' ? o->base : NULL;
    j.lock_fd = -1;
    j.src_close.c = &j.sc;
    j.t0 = j.tph = sync_now_ns();

    if ((ret = run_start(&j)) != SYNC_OK)
        return ret;            /* nothing is open yet */
    if ((ret = run_connect(&j)) != SYNC_OK)
        goto end;
    if (o->verify_only) {
        ret = run_compare(&j);
        goto end;
    }
    if ((ret = run_open(&j)) != SYNC_OK)
        goto end;
    if (r->already) {
        ret = run_already(&j);
        goto end;
    }
    if ((ret = sync_plan(&j)) != SYNC_OK ||
        (ret = run_copy(&j)) != SYNC_OK ||
        (ret = run_snap(&j)) != SYNC_OK ||
        (ret = run_verify(&j)) != SYNC_OK)
        goto end;
    ret = run_finish(&j);
end:
    run_end(&j, ret);
    return ret;
}
