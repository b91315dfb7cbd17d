#include "sync_identity.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "sync_util.h"

int
sync_identity_token_ok(const char *s)
{
    size_t n = 0;

    for (; s[n] != '\0'; n++) {
        char c = s[n];

        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return n > 0 && n < SYNC_IDENTITY_MAX;
}

int
sync_identity_same(const struct sync_identity *was,
                   const struct sync_identity *now, char *why, size_t whylen)
{
    if (was->id[0] == '\0' || was->marker[0] == '\0') {
        sync_seterr(why, whylen, "the record has no dr image identity");
        return 0;
    }
    if (now->id[0] == '\0' || now->marker[0] == '\0') {
        sync_seterr(why, whylen, "the dr image carries no %s",
                    now->id[0] == '\0' ? "id" : "creation marker");
        return 0;
    }
    if (strcmp(was->id, now->id) != 0) {
        sync_seterr(why, whylen, "the dr image id changed (%s -> %s): the "
                    "image was removed and recreated", was->id, now->id);
        return 0;
    }
    if (strcmp(was->marker, now->marker) != 0) {
        sync_seterr(why, whylen, "the dr image creation marker changed "
                    "(%s -> %s): the image was replaced", was->marker,
                    now->marker);
        return 0;
    }
    return 1;
}

static int
read_id(rbd_image_t img, struct sync_identity *out, char *err, size_t errlen)
{
    int rc = rbd_get_id(img, out->id, sizeof(out->id));

    if (rc < 0) {
        out->id[0] = '\0';
        sync_seterr(err, errlen, "dr: image id: %s", strerror(-rc));
        return -1;
    }
    if (!sync_identity_token_ok(out->id)) {
        sync_seterr(err, errlen, "dr: unexpected image id '%.40s'", out->id);
        out->id[0] = '\0';
        return -1;
    }
    return 0;
}

int
sync_identity_read(rbd_image_t img, struct sync_identity *out, char *err,
                   size_t errlen)
{
    size_t n = sizeof(out->marker);
    int rc;

    memset(out, 0, sizeof(*out));
    if (read_id(img, out, err, errlen) < 0)
        return -1;
    rc = rbd_metadata_get(img, SYNC_IDENTITY_KEY, out->marker, &n);
    if (rc == -ENOENT) {
        out->marker[0] = '\0';
        return 0;
    }
    if (rc < 0 && rc != -ERANGE) {
        sync_seterr(err, errlen, "dr: read %s: %s", SYNC_IDENTITY_KEY,
                    strerror(-rc));
        return -1;
    }
    /* A value we did not write (too long, odd bytes) is no marker of
     * ours: treat it as absent, which never matches a record. */
    if (rc == -ERANGE || !sync_identity_token_ok(out->marker))
        out->marker[0] = '\0';
    return 0;
}

int
sync_identity_mark(rbd_image_t img, struct sync_identity *out, char *err,
                   size_t errlen)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[16];
    size_t got = 0;
    int rc, i;

    memset(out, 0, sizeof(*out));
    if (read_id(img, out, err, errlen) < 0)
        return -1;
    while (got < sizeof(raw)) {
        ssize_t r = getrandom(raw + got, sizeof(raw) - got, 0);

        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            sync_seterr(err, errlen, "getrandom: %s", strerror(errno));
            return -1;
        }
        got += (size_t)r;
    }
    for (i = 0; i < (int)sizeof(raw); i++) {
        out->marker[2 * i] = hex[raw[i] >> 4];
        out->marker[2 * i + 1] = hex[raw[i] & 0xf];
    }
    out->marker[2 * sizeof(raw)] = '\0';
    rc = rbd_metadata_set(img, SYNC_IDENTITY_KEY, out->marker);
    if (rc < 0) {
        sync_seterr(err, errlen, "dr: write %s: %s", SYNC_IDENTITY_KEY,
                    strerror(-rc));
        out->marker[0] = '\0';
        return -1;
    }
    return 0;
}
