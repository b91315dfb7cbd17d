/*
 * sync_fence: the fencing epoch a DR image carries, and whether a copy may
 * write into it.
 *
 * A failover records fencing epoch E for its group and sets the RBD image
 * metadata key SYNC_FENCE_KEY = "E" on every member image at the site it
 * fails over to: from epoch E on, that image is the live copy, written by
 * the VMs running on it, and no longer a replication target.
 *
 * A copy says under which epoch its source site is the active one
 * (`--epoch N`; 0, the default, before any failover).  It may write into an
 * image only if the image became live before that epoch (E < N) or never
 * did (no key).  With E >= N the source is an old primary that lost the
 * site role at E: writing would overwrite the live copy, so the copy is
 * refused before anything is written (SYNC_EFENCED).
 *
 *   image key   --epoch N   verdict
 *   absent      any         write
 *   E < N       N           write   (a later failover demoted the image)
 *   E >= N      N           refuse  (the image is live since E)
 *   malformed   any         refuse  (the epoch cannot be known)
 */
#ifndef CUTPOINT_SYNC_FENCE_H
#define CUTPOINT_SYNC_FENCE_H

#include <rbd/librbd.h>
#include <stddef.h>
#include <stdint.h>

#define SYNC_FENCE_KEY "cutpoint.fencing_epoch"

/* The largest epoch either side may name (fits a JSON number exactly). */
#define SYNC_FENCE_MAX 9007199254740991ULL

/*
 * Parse an epoch: decimal digits only, 0 to SYNC_FENCE_MAX.  Returns 0 and
 * sets *out, or -1 for anything else (empty, sign, blanks, overflow).
 */
int sync_fence_parse(const char *s, uint64_t *out);

/*
 * Judge a copy under `epoch` into an image whose SYNC_FENCE_KEY value is
 * `value` (NULL: the key is absent).  Returns 0 when the copy may write;
 * SYNC_EFENCED (sync_engine.h) when the image is live since an epoch >=
 * `epoch`, or when its value is malformed; *image_epoch is the image's
 * epoch when it parsed, else 0.  The reason goes to err, naming `image`.
 */
int sync_fence_judge(const char *image, const char *value, uint64_t epoch,
                     uint64_t *image_epoch, char *err, size_t errlen);

/*
 * Read SYNC_FENCE_KEY of the open image `img` (named `image` in messages)
 * and judge a copy under `epoch`: 0, SYNC_EFENCED, or SYNC_ERR when the
 * metadata cannot be read (the copy cannot know, so it does not write).
 */
int sync_fence_check(rbd_image_t img, const char *image, uint64_t epoch,
                     uint64_t *image_epoch, char *err, size_t errlen);

#endif
