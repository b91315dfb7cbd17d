#include "sync_diff.h"

#include <errno.h>
#include <string.h>

#include "sync_util.h"

struct diff_ctx {
    struct sync_extents *l;
    int kind;      /* 0: DATA if exists else ZERO; else this kind */
};

static int
diff_cb(uint64_t off, size_t len, int exists, void *arg)
{
    struct diff_ctx *d = arg;
    int kind = d->kind ? d->kind : (exists ? SYNC_DATA : SYNC_ZERO);

    return sync_extents_add(d->l, off, len, kind) < 0 ? -ENOMEM : 0;
}

static int
fast_diff_usable(rbd_image_t img)
{
    uint64_t features = 0, flags = 0;

    if (rbd_get_features(img, &features) < 0 ||
        rbd_get_flags(img, &flags) < 0)
        return 0;
    return (features & RBD_FEATURE_FAST_DIFF) != 0 &&
           (flags & RBD_FLAG_FAST_DIFF_INVALID) == 0;
}

static int
count_cb(uint64_t off, size_t len, int exists, void *arg)
{
    (void)off;
    (void)len;
    (void)exists;
    ++*(uint64_t *)arg;
    return 0;
}

/*
 * The exact diff of an image (whole_object 0) asks the OSDs for the
 * snapshots of every object, changed or not: about 10 ms for a 1 GiB
 * image on the lab.  The whole-object diff answers from the object maps
 * (fast-diff) in under 1 ms, and reports every object the exact diff
 * would touch.  quick != 0 therefore runs the whole-object diff first and
 * skips the exact one when it is empty: the drift check at DR, where
 * nothing has changed since the base in the normal case.  Without a valid
 * fast-diff map the whole-object diff would itself ask every object, so
 * it is then not tried.
 */
int
sync_diff_collect(rbd_image_t img, const char *from, uint64_t size,
                  int kind, int quick, struct sync_extents *l,
                  const char *which, char *err, size_t errlen)
{
    struct diff_ctx d = {l, kind};
    uint64_t touched = 0;
    int rc;

    if (quick && fast_diff_usable(img)) {
        rc = rbd_diff_iterate2(img, from, 0, size, 1, 1, count_cb, &touched);
        if (rc < 0) {
            sync_seterr(err, errlen, "%s: diff from %s: %s", which,
                        from ? from : "(start)", strerror(-rc));
            return -1;
        }
        if (touched == 0)
            return 0;
    }
    rc = rbd_diff_iterate2(img, from, 0, size, 1, 0, diff_cb, &d);
    if (rc < 0) {
        sync_seterr(err, errlen, "%s: diff from %s: %s", which,
                    from ? from : "(start)", strerror(-rc));
        return -1;
    }
    if (sync_extents_normalize(l) < 0) {
        sync_seterr(err, errlen, "%s: diff reported overlapping extents",
                    which);
        return -1;
    }
    return 0;
}

void *
sync_diff_job_run(void *arg)
{
    struct sync_diff_job *j = arg;

    j->rc = sync_diff_collect(j->img, j->from, j->size, j->kind, 0, j->l,
                              "primary", j->err, sizeof(j->err));
    return NULL;
}
