/*
 * sync_identity: which DR image a partial copy was written into.
 *
 * A progress record (sync_progress.h) says how far a copy got, but only
 * about one particular image: if the DR image is removed and another is
 * created under the same name, the done prefix of the record describes
 * bytes that are gone, and resuming would skip them and leave zeroes
 * behind a snapshot that looks complete.  A name does not tell the two
 * apart, so an image is known by two things:
 *
 *   id      the RBD image id (rbd_get_id), chosen by Ceph at creation
 *           and never reused for another image of the pool;
 *   marker  a random token cutpoint-sync writes as the image metadata
 *           SYNC_IDENTITY_KEY before its first write, so even an image
 *           recreated elsewhere with a copied id (an import, a restore
 *           of the pool) differs.
 *
 * Both are stored in the progress record; a rerun resumes only when both
 * are the same at DR.
 */
#ifndef CUTPOINT_SYNC_IDENTITY_H
#define CUTPOINT_SYNC_IDENTITY_H

#include <stddef.h>

#include <rbd/librbd.h>

#define SYNC_IDENTITY_KEY "cutpoint.sync.marker"
#define SYNC_IDENTITY_MAX 64        /* bytes of id or marker, with NUL */

struct sync_identity {
    char id[SYNC_IDENTITY_MAX];     /* "" = unknown */
    char marker[SYNC_IDENTITY_MAX]; /* "" = the image carries none */
};

/* 1 if s is a usable id or marker: 1..63 bytes of [A-Za-z0-9._-]. */
int sync_identity_token_ok(const char *s);

/*
 * Compare the identity a record saw (was) with the image's (now).
 * Returns 1 when both id and marker are set and equal; otherwise 0 and a
 * short reason in why (which part differs, or that one is unknown).
 */
int sync_identity_same(const struct sync_identity *was,
                       const struct sync_identity *now, char *why,
                       size_t whylen);

/*
 * Read the id and marker of an open DR image.  A missing marker is not an
 * error (marker = "").  0 or -1 with err.
 */
int sync_identity_read(rbd_image_t img, struct sync_identity *out,
                       char *err, size_t errlen);

/*
 * Write a new random marker into an open DR image and fill out with the
 * image's identity.  0 or -1 with err.
 */
int sync_identity_mark(rbd_image_t img, struct sync_identity *out,
                       char *err, size_t errlen);

#endif
