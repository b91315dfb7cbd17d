/*
 * sync_progress: the durable progress record of one cutpoint-sync copy.
 *
 * A record names one copy by its triple (DR pool/image, base snapshot,
 * target snapshot) plus the target's size, and says how far the copy got:
 * every work-list extent that ends at or below done_offset has been
 * written at DR and verified.  The work list is a pure function of the
 * snapshots (see sync_extents.h), so a rerun of the same triple can skip
 * those extents and produce the same result as an uninterrupted run.
 *
 * On disk it is a small text file, one key=value per line in a fixed
 * order, closed by a CRC-32 of everything before it:
 *
 *     cutpoint-sync-progress 2
 *     pool=rbd
 *     image=vm1-disk0
 *     base=cp.g.41          (empty for a full copy)
 *     target=cp.g.42
 *     owner=10.77.0.1:0/1261527113   (DR client address of the writer)
 *     image_id=10b3e1f4a2c9             (the DR image written into,
 *     marker=5c0f...e1                   sync_identity.h)
 *     size=67108864
 *     done_offset=8388608
 *     bytes=8388608
 *     extents=2
 *     crc32=1c291ca3
 *
 * A version 1 record (no image_id and marker lines) still decodes, with
 * version = 1, so that the owner of a killed run's lock is still known;
 * but it does not say which DR image it was written into, so it is never
 * resumed from (sync_progress_resumable).
 *
 * It is replaced atomically: temp file, fsync, rename, fsync of the
 * directory, so a crash leaves either the old or the new record.
 */
#ifndef CUTPOINT_SYNC_PROGRESS_H
#define CUTPOINT_SYNC_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

#include "sync_identity.h"

#define SYNC_PROGRESS_MAGIC "cutpoint-sync-progress 2"
#define SYNC_PROGRESS_MAGIC_V1 "cutpoint-sync-progress 1"
#define SYNC_PROGRESS_VERSION 2
#define SYNC_PROGRESS_NAME_MAX 256   /* bytes, including the NUL */
#define SYNC_PROGRESS_MAX 4096       /* encoded record never exceeds this */

/* Returned by sync_progress_load() when there is no record (not an error). */
#define SYNC_PROGRESS_ENOENT (-2)

struct sync_progress {
    int version;          /* of the record decoded; set() gives the current */
    char pool[SYNC_PROGRESS_NAME_MAX];
    char image[SYNC_PROGRESS_NAME_MAX];
    char base[SYNC_PROGRESS_NAME_MAX];     /* "" = full copy */
    char target[SYNC_PROGRESS_NAME_MAX];
    /* Client address of the DR connection of the run that wrote the
     * record: if that run was killed, its exclusive lock on the DR image
     * is stale and may be broken at once instead of waiting ~30 s for
     * its watch to time out (see sync_engine.c). */
    char owner[64];
    /* The DR image the done prefix was written into; "" in a version 1
     * record.  Filled by the engine before the record is first saved. */
    struct sync_identity dr;
    uint64_t size;
    uint64_t done_offset;
    uint64_t bytes;       /* data bytes shipped for this triple so far */
    uint64_t extents;     /* work-list extents completed so far */
};

/*
 * Fill p's names; -1 if a name is too long or holds a byte below 0x20
 * (a newline would forge a line of the record).
 */
int sync_progress_set(struct sync_progress *p, const char *pool,
                      const char *image, const char *base, const char *target,
                      uint64_t size, char *err, size_t errlen);

/* Encode into buf, always as the current version; returns the length
 * (without NUL) or -1 (also when p->dr is not a valid identity). */
int sync_progress_encode(const struct sync_progress *p, char *buf,
                         size_t buflen, char *err, size_t errlen);

/*
 * Decode exactly len bytes.  Rejects a wrong magic, a missing, repeated,
 * unknown or misordered key, a malformed number, a bad CRC and trailing
 * bytes.  0 or -1.
 */
int sync_progress_decode(const char *buf, size_t len, struct sync_progress *p,
                         char *err, size_t errlen);

/* 1 if the record describes this very copy, else 0. */
int sync_progress_matches(const struct sync_progress *p,
                          const struct sync_progress *want);

/*
 * 1 if a rerun may skip the done prefix of have: it describes this very
 * copy (sync_progress_matches), it is of the current version, and it was
 * written into the DR image want->dr names (same id and marker).
 * Otherwise 0, with the reason in why.
 */
int sync_progress_resumable(const struct sync_progress *have,
                            const struct sync_progress *want, char *why,
                            size_t whylen);

/*
 * Path of the record for pool/image under dir.  Bytes outside
 * [A-Za-z0-9._-] are written as %XX so any image name maps to one file.
 */
int sync_progress_path(char *out, size_t outlen, const char *dir,
                       const char *pool, const char *image);

/* Durable replace (temp, fsync, rename, fsync dir).  0 or -1; err names
 * the failed step. */
int sync_progress_save(const char *path, const struct sync_progress *p,
                       char *err, size_t errlen);

/* 0, SYNC_PROGRESS_ENOENT, or -1 (unreadable or corrupt record). */
int sync_progress_load(const char *path, struct sync_progress *p,
                       char *err, size_t errlen);

/* Remove the record durably; a missing record is not an error. */
int sync_progress_remove(const char *path, char *err, size_t errlen);

#endif
