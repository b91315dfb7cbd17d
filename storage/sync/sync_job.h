/*
 * sync_job: one run of sync_run, what its phases (sync_engine.h) hand on
 * to each other.  Each phase is a function that either returns SYNC_OK or
 * ends the run with its code and a message in err; what it opened is
 * closed at the end of the run (sync_engine.c).  PLAN has its own file,
 * sync_plan.c.
 */
#ifndef CUTPOINT_SYNC_JOB_H
#define CUTPOINT_SYNC_JOB_H

#include <pthread.h>
#include <rbd/librbd.h>
#include <stddef.h>
#include <stdint.h>

#include "sync_conn.h"
#include "sync_engine.h"
#include "sync_extents.h"
#include "sync_progress.h"
#include "sync_site.h"
#include "sync_verify.h"

struct sync_job {
    const struct sync_opts *o;
    struct sync_result *r;
    char *err;
    size_t errlen;
    const char *base;          /* NULL: no base given (a full copy) */
    int full;                  /* 1: copy everything */
    char prog_path[4096];      /* the progress record */
    int lock_fd;               /* the run lock, or -1 */
    struct sync_progress have; /* the record found at start */
    int have_rec;              /* have is valid */
    struct sync_progress want; /* the record of this copy */
    struct sync_conn sc, dc;   /* primary, dr */
    struct sync_site_prep sp, dp;
    rbd_image_t src;           /* primary at the target snapshot */
    rbd_image_t dst;           /* the DR image */
    rbd_image_t dsnap;         /* the DR image at the target snapshot */
    uint64_t size;             /* of the target snapshot */
    struct sync_layout layout; /* of the DR image */
    struct sync_extents diff, drift, work, items;
    size_t first;              /* items[0..first) done by a killed run */
    uint64_t end_offset;       /* done prefix after COPY */
    struct sync_site_close src_close;
    pthread_t tclose;
    int closing;               /* tclose runs (or ran) src_close */
    uint64_t t0, tph;          /* start of the run, of the phase */
};

/*
 * PLAN: base at DR (SYNC_ENOBASE), the DR image marked and sized, the
 * extent verification chosen, the record saved, both diffs (the primary's
 * on a thread), the work list and the resume point; the start event.
 */
int sync_plan(struct sync_job *j);

#endif
