/*
 * sync_diff: the extents that changed in an RBD image between two of its
 * snapshots, as a work list (sync_extents.h): at the primary, what the
 * copy must send; at DR, the drift since the base that it must repair.
 */
#ifndef CUTPOINT_SYNC_DIFF_H
#define CUTPOINT_SYNC_DIFF_H

#include <rbd/librbd.h>
#include <stddef.h>
#include <stdint.h>

#include "sync_extents.h"

/*
 * Add the extents of img (open at the later snapshot) that changed since
 * snapshot `from` (NULL: since creation) to l, normalized.  kind 0 makes
 * an extent SYNC_DATA if it holds data, else SYNC_ZERO; any other kind
 * is given to every extent.  quick != 0 asks the object map first and
 * returns an empty diff at once when it says nothing changed.  Returns 0,
 * or -1 with a message (prefixed with `which`) in err.
 */
int sync_diff_collect(rbd_image_t img, const char *from, uint64_t size,
                      int kind, int quick, struct sync_extents *l,
                      const char *which, char *err, size_t errlen);

/* The primary's diff, run on a thread of its own while the DR side is
 * planned (the two are on different clusters). */
struct sync_diff_job {
    rbd_image_t img;
    const char *from;
    uint64_t size;
    int kind;
    struct sync_extents *l;
    int rc;                    /* sync_diff_collect's */
    char err[512];
};

/* sync_diff_collect(j, quick 0) as a pthread start routine. */
void *sync_diff_job_run(void *arg);

#endif
