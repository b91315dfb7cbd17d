#include "sync_site.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "sync_fence.h"
#include "sync_lock.h"
#include "sync_util.h"

static int
snap_exists(rbd_image_t img, const char *name, int *out, const char *which,
            char *err, size_t errlen)
{
    bool ex = false;
    int rc = rbd_snap_exists(img, name, &ex);

    if (rc < 0) {
        sync_seterr(err, errlen, "%s: snap lookup %s: %s", which, name,
                    strerror(-rc));
        return -1;
    }
    *out = ex ? 1 : 0;
    return 0;
}

/* Primary: open the image read-only at the target snapshot. */
void *
sync_site_src_prep(void *arg)
{
    struct sync_site_prep *p = arg;
    const struct sync_opts *o = p->o;
    int rc;

    p->ret = SYNC_ERR;
    p->conn_rc = sync_conn_for_run(o->src_shared, &o->src, "primary",
                                   o->op_timeout_s, p->c, p->err,
                                   sizeof(p->err));
    if (p->conn_rc < 0)
        return NULL;
    rc = rbd_open_read_only(p->c->io, o->image, &p->img, NULL);
    if (rc < 0) {
        p->img = NULL;
        sync_seterr(p->err, sizeof(p->err), "primary: image %s/%s: %s",
                    o->src.pool, o->image, strerror(-rc));
        p->ret = rc == -ENOENT ? SYNC_ENOSRC : SYNC_ERR;
        return NULL;
    }
    if (snap_exists(p->img, o->target, &p->target_ex, "primary", p->err,
                    sizeof(p->err)) < 0)
        return NULL;
    if (!p->target_ex) {
        sync_seterr(p->err, sizeof(p->err), "primary: snapshot %s@%s does "
                    "not exist", o->image, o->target);
        p->ret = SYNC_ENOSRC;
        return NULL;
    }
    if (p->base != NULL) {
        if (snap_exists(p->img, p->base, &p->base_ex, "primary", p->err,
                        sizeof(p->err)) < 0)
            return NULL;
        if (!p->base_ex) {
            sync_seterr(p->err, sizeof(p->err), "primary: base snapshot "
                        "%s@%s does not exist", o->image, p->base);
            p->ret = SYNC_ENOSRC;
            return NULL;
        }
    }
    if ((rc = rbd_snap_set(p->img, o->target)) < 0 ||
        (rc = rbd_stat(p->img, &p->info, sizeof(p->info))) < 0) {
        sync_seterr(p->err, sizeof(p->err), "primary: open snapshot "
                    "%s@%s: %s", o->image, o->target, strerror(-rc));
        return NULL;
    }
    p->ret = SYNC_OK;
    return NULL;
}

/* DR, once its image is open: stale lock, snapshots, size. */
int
sync_site_dst_lookups(struct sync_site_prep *p)
{
    const struct sync_opts *o = p->o;
    uint64_t dr_epoch;
    int rc;

    /* Before anything that writes, a stale lock's break included. */
    rc = sync_fence_check(p->img, o->image, o->epoch, &dr_epoch, p->err,
                          sizeof(p->err));
    if (rc != 0)
        return rc;
    if (p->have != NULL)
        sync_lock_break_stale(o, p->img, p->have);
    if (snap_exists(p->img, o->target, &p->target_ex, "dr", p->err,
                    sizeof(p->err)) < 0)
        return SYNC_ERR;
    if (p->base != NULL &&
        snap_exists(p->img, p->base, &p->base_ex, "dr", p->err,
                    sizeof(p->err)) < 0)
        return SYNC_ERR;
    if ((rc = rbd_get_size(p->img, &p->dsize)) < 0) {
        sync_seterr(p->err, sizeof(p->err), "dr: size of %s: %s", o->image,
                    strerror(-rc));
        return SYNC_ERR;
    }
    if (sync_identity_read(p->img, &p->ident, p->err, sizeof(p->err)) < 0)
        return SYNC_ERR;
    return SYNC_OK;
}

/* DR: open the image if it exists (creating it needs the primary). */
void *
sync_site_dst_prep(void *arg)
{
    struct sync_site_prep *p = arg;
    const struct sync_opts *o = p->o;
    int rc;

    p->ret = SYNC_ERR;
    p->conn_rc = sync_conn_for_run(o->dst_shared, &o->dst, "dr",
                                   o->op_timeout_s, p->c, p->err,
                                   sizeof(p->err));
    if (p->conn_rc < 0)
        return NULL;
    if (!p->open) {
        p->ret = SYNC_OK;
        return NULL;
    }
    rc = rbd_open(p->c->io, o->image, &p->img, NULL);
    if (rc == -ENOENT) {
        p->img = NULL;
        p->missing = 1;
        p->ret = SYNC_OK;
        return NULL;
    }
    if (rc < 0) {
        p->img = NULL;
        sync_seterr(p->err, sizeof(p->err), "dr: open image %s/%s: %s",
                    o->dst.pool, o->image, strerror(-rc));
        return NULL;
    }
    p->ret = sync_site_dst_lookups(p);
    return NULL;
}
