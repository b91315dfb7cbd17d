#include "sync_fence.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "sync_engine.h"
#include "sync_util.h"

int
sync_fence_parse(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    const char *p;

    if (s == NULL || *s == '\0')
        return -1;
    for (p = s; *p != '\0'; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        if (v > (SYNC_FENCE_MAX - (uint64_t)(*p - '0')) / 10)
            return -1;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    *out = v;
    return 0;
}

int
sync_fence_judge(const char *image, const char *value, uint64_t epoch,
                 uint64_t *image_epoch, char *err, size_t errlen)
{
    uint64_t e;

    *image_epoch = 0;
    if (value == NULL)
        return 0;
    if (sync_fence_parse(value, &e) < 0) {
        /* A value we cannot read may be a newer epoch: do not write. */
        sync_seterr(err, errlen, "fenced: dr image %s has an unreadable %s "
                    "'%.40s'; refusing to write into it", image, SYNC_FENCE_KEY,
                    value);
        return SYNC_EFENCED;
    }
    *image_epoch = e;
    if (e >= epoch) {
        sync_seterr(err, errlen, "fenced: dr image %s is the live copy since "
                    "fencing epoch %" PRIu64 "; this copy runs under epoch %"
                    PRIu64 ", so its source is not the active site (an old "
                    "primary): refusing to write into it", image, e, epoch);
        return SYNC_EFENCED;
    }
    return 0;
}

int
sync_fence_check(rbd_image_t img, const char *image, uint64_t epoch,
                 uint64_t *image_epoch, char *err, size_t errlen)
{
    char value[64];
    size_t len = sizeof(value);
    int rc;

    *image_epoch = 0;
    rc = rbd_metadata_get(img, SYNC_FENCE_KEY, value, &len);
    if (rc == -ENOENT)
        return sync_fence_judge(image, NULL, epoch, image_epoch, err,
                                errlen);
    if (rc == -ERANGE) {
        /* Longer than any epoch: malformed by definition. */
        return sync_fence_judge(image, "(too long)", epoch, image_epoch,
                                err, errlen);
    }
    if (rc < 0) {
        sync_seterr(err, errlen, "dr: read %s of image %s: %s", SYNC_FENCE_KEY,
                    image, strerror(-rc));
        return SYNC_ERR;
    }
    value[sizeof(value) - 1] = '\0';
    return sync_fence_judge(image, value, epoch, image_epoch, err, errlen);
}
