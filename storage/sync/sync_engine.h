/*
 * sync_engine: copy one RBD snapshot from the primary cluster to the
 * same-named image and snapshot on the DR cluster, in one process that
 * holds a connection to each cluster.
 *
 * Phases of one run (each either succeeds or ends the run with an error;
 * nothing at DR is ever marked complete before VERIFY passes):
 *
 *   CONNECT ── both clusters, DR with rbd_cache off so read-back hits OSDs;
 *      │       one thread per site, which also opens that site's image
 *      │       and looks its snapshots up (errors judged afterwards in
 *      │       the order below)
 *   OPEN ───── primary image @ target snap (missing → SYNC_ENOSRC)
 *      │       DR image: its fencing epoch first (sync_fence.h: live since
 *      │       an epoch >= ours → SYNC_EFENCED, before any write, even
 *      │       before a stale lock is broken);
 *      │       DR image (created with the primary's size and order when a
 *      │       full copy is asked for; missing when a base is given →
 *      │       SYNC_ENOBASE unless full_resync)
 *      │       DR already has target snap → DONE (already = 1)
 *   PLAN ───── base snap at DR?  no → SYNC_ENOBASE (or full if full_resync)
 *      │       DR image marked (sync_identity.h) if it has no marker
 *      │       resize DR to the target's size
 *      │       work = diff(base→target) at primary          (in parallel)
 *      │            ∪ ranges that drifted at DR since base (repair;
 *      │              the object-map diff first, the exact one only if
 *      │              it found anything)
 *      │       the progress record is saved (names our DR client and
 *      │       the DR image's id and marker)
 *      │       split at chunk boundaries; a matching progress record
 *      │       written into this same DR image skips every extent below
 *      │       its done_offset (resume); any other is discarded, logged
 *   COPY ───── N workers: read primary → checksum → rate limit → write DR
 *      │       (data, or write-zeroes for discarded ranges and for 4 KiB
 *      │       blocks of data extents that read as zeroes) → verify at
 *      │       DR: CRC-32C computed by the DR OSD, or a read-back and
 *      │       SHA-256 (mismatch → SYNC_EVERIFY);
 *      │       the contiguous done prefix is saved durably, at most once
 *      │       per progress interval (not after the last extent)
 *   SNAP ───── flush DR, create the target snapshot at DR (the primary
 *      │       is closed meanwhile unless VERIFY needs it)
 *      │
 *   VERIFY ─── optional: SHA-256 of both whole snapshots; a mismatch
 *      │       removes the DR snapshot again → SYNC_EVERIFY
 *   DONE ───── progress record removed
 *
 * sync_run (sync_engine.c) is this list, one function a phase; a phase
 * with more to it has its own module: CONNECT sync_site.h (sync_conn.h),
 * the run lock and the stale DR lock sync_lock.h, PLAN sync_plan.c
 * (sync_diff.h), COPY sync_copy.h, VERIFY and the per-extent checks
 * sync_verify.h.
 */
#ifndef CUTPOINT_SYNC_ENGINE_H
#define CUTPOINT_SYNC_ENGINE_H

#include <stdint.h>
#include <stdio.h>

#include "sync_digest.h"

/* Named failures a caller must tell apart (see docs/replication.md). */
enum {
    SYNC_OK = 0,
    SYNC_ERR = -1,       /* Ceph, I/O or local failure */
    SYNC_ENOBASE = -2,   /* base snapshot (or image) missing at DR */
    SYNC_EVERIFY = -3,   /* a checksum or the full-image hash differed */
    SYNC_ENOSRC = -4,    /* image or snapshot missing at the primary */
    SYNC_EFENCED = -5,   /* the DR image is the live copy since a fencing
                            epoch >= the copy's (sync_fence.h) */
};

struct sync_conn;      /* sync_conn.h */

struct sync_site {
    const char *conf;      /* ceph.conf path */
    const char *id;        /* client id without "client." (e.g. admin) */
    const char *keyring;   /* NULL: whatever ceph.conf says */
    const char *pool;
};

/* Called with one JSON object (no newline) per event; may be NULL. */
typedef void (*sync_event_fn)(const char *json, void *arg);
/* Called with a key=value log line body (no newline); may be NULL. */
typedef void (*sync_log_fn)(const char *level, const char *line, void *arg);

/* How a written extent is verified at DR. */
enum {
    /* Ask the OSD holding the DR object for the CRC-32C of what it stored
     * (rados checksum op) and compare it with the CRC of the bytes sent:
     * no data comes back over the wire.  Needs the plain RBD layout (no
     * fancy striping); otherwise falls back to read-back. */
    SYNC_VERIFY_OSD = 0,
    /* Read the extent back through librbd and compare SHA-256 digests. */
    SYNC_VERIFY_READBACK = 1,
};

struct sync_opts {
    struct sync_site src;
    struct sync_site dst;
    const char *image;         /* same name at both sites */
    const char *base;          /* NULL or "": full copy */
    const char *target;
    int full_resync;           /* copy everything (base may be missing) */
    int verify_full;           /* hash both whole snapshots at the end */
    int verify_only;           /* only compare the two existing snapshots */
    int serve;                 /* cutpoint-sync --serve (sync_serve.h) */
    int extent_verify;         /* SYNC_VERIFY_OSD or SYNC_VERIFY_READBACK */
    double rate_mbps;          /* MB/s (10^6 bytes); 0 = unlimited */
    const char *state_dir;     /* where progress records live */
    uint64_t chunk;            /* work-list piece size, bytes */
    int workers;               /* concurrent extents in flight */
    int progress_ms;           /* interval of progress events */
    int op_timeout_s;          /* bound on one mon or OSD request */
    uint64_t epoch;            /* fencing epoch the source is active under
                                  (0: before any failover); sync_fence.h */
    /* A serve session's connections (sync_serve.h), borrowed by the run
     * (its own I/O contexts on src.pool and dst.pool); NULL: the run
     * connects to the site itself and shuts the connection down. */
    const struct sync_conn *src_shared;
    const struct sync_conn *dst_shared;
    sync_event_fn on_event;
    sync_log_fn on_log;
    void *arg;
};

/* Wall-clock phases of one run, reported as "phase_ms" in the done event
 * so a slow run says where its time went (docs/replication.md). */
enum {
    SYNC_PH_START = 0,   /* run lock, progress record load */
    SYNC_PH_CONNECT,     /* both sites in parallel: connect, open the
                            image, look the snapshots up */
    SYNC_PH_OPEN,        /* DR image creation (full copy), judging */
    SYNC_PH_PLAN,        /* layout, both diffs, work list, record save */
    SYNC_PH_COPY,        /* workers: read, write, verify every extent */
    SYNC_PH_SNAP,        /* flush and create the DR snapshot */
    SYNC_PH_VERIFY,      /* --verify-full hashes (also when the target
                            was at DR already), --verify-only hashes */
    SYNC_PH_FINISH,      /* progress record removed (also when the
                            target was at DR already) */
    SYNC_PH_COUNT
};

struct sync_result {
    uint64_t size;             /* target snapshot size */
    uint64_t total;            /* bytes in the work list */
    uint64_t bytes_changed;    /* sum of diff(base→target) extents */
    uint64_t bytes_shipped;    /* data bytes copied by this run */
    uint64_t bytes_zeroed;     /* bytes zeroed at DR by this run */
    uint64_t bytes_zero_data;  /* data extents that read as zeroes: zeroed
                                  at DR, not shipped (holes of objects
                                  created after the base) */
    uint64_t bytes_zero_skipped; /* of the two above, zeroes not written
                                  (nor read back): the DR object is absent */
    uint64_t bytes_repaired;   /* DR drift re-copied (part of the above) */
    uint64_t bytes_shipped_total; /* incl. earlier interrupted runs */
    uint64_t extents;          /* work-list extents done by this run */
    uint64_t resumed_from;     /* done_offset of the record used, or 0 */
    int full;                  /* 1 = full copy, 0 = incremental */
    int already;               /* DR already had the target snapshot */
    int verified_full;         /* full hashes compared and equal */
    int extent_verify;         /* the per-extent method actually used */
    double seconds;
    double phase_ms[SYNC_PH_COUNT];
    double teardown_ms;        /* images closed, connections shut down
                                  (after the done event) */
    char src_hash[SYNC_DIGEST_HEX];   /* "" unless hashed */
    char dst_hash[SYNC_DIGEST_HEX];
};

/* Fill o with defaults (chunk 4 MiB, 16 workers, 500 ms, state dir). */
void sync_opts_init(struct sync_opts *o);

/*
 * Run one copy.  Returns SYNC_OK or one of the negative codes above, with
 * a message in err.  r is filled as far as the run got.
 */
int sync_run(const struct sync_opts *o, struct sync_result *r, char *err,
             size_t errlen);

#endif
