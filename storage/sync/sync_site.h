/*
 * sync_site: CONNECT, one site per thread.  A small incremental round
 * spent about half of its time connecting to the two clusters and opening
 * the two images one after the other (each a few round trips to a mon or
 * an OSD of its own cluster).  The two sides do not depend on each other
 * until the DR image has to be created or resized with the primary's
 * size, so each side connects, opens and looks its snapshots up on its
 * own thread, and sync_run judges the results afterwards in the order
 * the serial code did, so the same failure gives the same error.
 *
 *   primary ── connect ── open read-only ── target? base? ── stat @target
 *   dr ─────── connect ── open (missing: say so; sync_run creates it)
 *                           └─ fencing epoch ── stale lock ── target?
 *                              base? ── size ── identity
 */
#ifndef CUTPOINT_SYNC_SITE_H
#define CUTPOINT_SYNC_SITE_H

#include <rbd/librbd.h>
#include <stdint.h>

#include "sync_conn.h"
#include "sync_engine.h"
#include "sync_identity.h"
#include "sync_progress.h"

struct sync_site_prep {
    const struct sync_opts *o;
    struct sync_conn *c;
    const char *base;          /* NULL: no base */
    const struct sync_progress *have;   /* dr: record of a killed run */
    int open;                  /* dr: open the image (not verify-only) */
    int conn_rc;               /* sync_conn_open: 0 or -1 */
    int ret;                   /* SYNC_OK or SYNC_E*: the rest */
    rbd_image_t img;
    int missing;               /* dr: the image does not exist */
    int target_ex, base_ex;
    rbd_image_info_t info;     /* primary: stat at the target */
    uint64_t dsize;            /* dr: current size */
    struct sync_identity ident;   /* dr: id and marker ("" = none yet) */
    char err[512];
};

/* Primary (pthread start routine): connect, open the image read-only at
 * the target snapshot, check that target and base exist (SYNC_ENOSRC). */
void *sync_site_src_prep(void *arg);

/* DR (pthread start routine): connect and, if p->open, open the image if
 * it exists (creating it needs the primary's size) and look it up. */
void *sync_site_dst_prep(void *arg);

/*
 * DR, once its image p->img is open: the fencing epoch (SYNC_EFENCED,
 * before anything writes, a stale lock's break included), the stale lock
 * of p->have, the snapshots, the size and the identity.  Returns SYNC_OK
 * or a SYNC_E* code with a message in p->err.
 */
int sync_site_dst_lookups(struct sync_site_prep *p);

#endif
