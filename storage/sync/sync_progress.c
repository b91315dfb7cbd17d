#include "sync_progress.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "sync_util.h"

static int
name_ok(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return 0;
    return 1;
}

static int
copy_name(char *dst, const char *src, const char *what, char *err,
          size_t errlen)
{
    size_t n = strlen(src);

    if (n >= SYNC_PROGRESS_NAME_MAX || !name_ok(src)) {
        sync_seterr(err, errlen, "invalid %s name (too long or control byte)",
                    what);
        return -1;
    }
    memcpy(dst, src, n + 1);
    return 0;
}

int
sync_progress_set(struct sync_progress *p, const char *pool, const char *image,
                  const char *base, const char *target, uint64_t size,
                  char *err, size_t errlen)
{
    memset(p, 0, sizeof(*p));
    if (copy_name(p->pool, pool, "pool", err, errlen) < 0 ||
        copy_name(p->image, image, "image", err, errlen) < 0 ||
        copy_name(p->base, base ? base : "", "base", err, errlen) < 0 ||
        copy_name(p->target, target, "target", err, errlen) < 0)
        return -1;
    p->version = SYNC_PROGRESS_VERSION;
    p->size = size;
    return 0;
}

int
sync_progress_encode(const struct sync_progress *p, char *buf, size_t buflen,
                     char *err, size_t errlen)
{
    int n, m;
    uLong crc;

    if (!name_ok(p->pool) || !name_ok(p->image) || !name_ok(p->base) ||
        !name_ok(p->target) || !name_ok(p->owner) ||
        p->target[0] == '\0' || p->image[0] == '\0') {
        sync_seterr(err, errlen, "record has an empty or invalid name");
        return -1;
    }
    /* A record that does not say which image it describes could never
     * be resumed from: refuse to write one. */
    if (!sync_identity_token_ok(p->dr.id) ||
        !sync_identity_token_ok(p->dr.marker)) {
        sync_seterr(err, errlen, "record has no valid dr image identity");
        return -1;
    }
    n = snprintf(buf, buflen,
                 SYNC_PROGRESS_MAGIC "\n"
                 "pool=%s\nimage=%s\nbase=%s\ntarget=%s\nowner=%s\n"
                 "image_id=%s\nmarker=%s\n"
                 "size=%" PRIu64 "\ndone_offset=%" PRIu64 "\n"
                 "bytes=%" PRIu64 "\nextents=%" PRIu64 "\n",
                 p->pool, p->image, p->base, p->target, p->owner,
                 p->dr.id, p->dr.marker, p->size,
                 p->done_offset, p->bytes, p->extents);
    if (n < 0 || (size_t)n >= buflen) {
        sync_seterr(err, errlen, "record does not fit in %zu bytes", buflen);
        return -1;
    }
    crc = crc32(0L, (const Bytef *)buf, (uInt)n);
    m = snprintf(buf + n, buflen - n, "crc32=%08lx\n", crc);
    if (m < 0 || (size_t)m >= buflen - n) {
        sync_seterr(err, errlen, "record does not fit in %zu bytes", buflen);
        return -1;
    }
    return n + m;
}

/* Parse one "key=value\n" line at *pos; value copied into val. */
static int
take_line(const char *buf, size_t len, size_t *pos, const char *key,
          char *val, size_t vallen, char *err, size_t errlen)
{
    size_t klen = strlen(key), start = *pos, i;
    const char *nl;

    if (len - start < klen + 1 || memcmp(buf + start, key, klen) != 0 ||
        buf[start + klen] != '=') {
        sync_seterr(err, errlen, "progress record: expected key '%s' at byte "
                    "%zu", key, start);
        return -1;
    }
    start += klen + 1;
    nl = memchr(buf + start, '\n', len - start);
    if (nl == NULL) {
        sync_seterr(err, errlen, "progress record: line '%s' not terminated",
                    key);
        return -1;
    }
    if ((size_t)(nl - (buf + start)) >= vallen) {
        sync_seterr(err, errlen, "progress record: value of '%s' too long",
                    key);
        return -1;
    }
    for (i = start; i < (size_t)(nl - buf); i++) {
        if ((unsigned char)buf[i] < 0x20 || buf[i] == 0x7f) {
            sync_seterr(err, errlen, "progress record: control byte in '%s'",
                        key);
            return -1;
        }
    }
    memcpy(val, buf + start, nl - (buf + start));
    val[nl - (buf + start)] = '\0';
    *pos = (size_t)(nl - buf) + 1;
    return 0;
}

static int
parse_u64(const char *s, uint64_t *out, const char *key, char *err,
          size_t errlen)
{
    char *end;
    unsigned long long v;

    /* Digits only: strtoull would accept signs and leading spaces. */
    if (s[0] < '0' || s[0] > '9' || (s[0] == '0' && s[1] != '\0')) {
        sync_seterr(err, errlen, "progress record: bad number in '%s'", key);
        return -1;
    }
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0') {
        sync_seterr(err, errlen, "progress record: bad number in '%s'", key);
        return -1;
    }
    *out = v;
    return 0;
}

int
sync_progress_decode(const char *buf, size_t len, struct sync_progress *p,
                     char *err, size_t errlen)
{
    static const char *nums[] = {"size", "done_offset", "bytes", "extents"};
    uint64_t *dst[4];
    char val[SYNC_PROGRESS_NAME_MAX];
    size_t pos, mlen = strlen(SYNC_PROGRESS_MAGIC), crc_at;
    unsigned long want_crc;
    uLong crc;
    char *end;
    int i;

    memset(p, 0, sizeof(*p));
    if (len > SYNC_PROGRESS_MAX) {
        sync_seterr(err, errlen, "progress record: %zu bytes is too large",
                    len);
        return -1;
    }
    /* Both magics have the same length; only the version digit differs. */
    if (len >= mlen + 1 && buf[mlen] == '\n' &&
        memcmp(buf, SYNC_PROGRESS_MAGIC, mlen) == 0) {
        p->version = SYNC_PROGRESS_VERSION;
    } else if (len >= mlen + 1 && buf[mlen] == '\n' &&
               memcmp(buf, SYNC_PROGRESS_MAGIC_V1, mlen) == 0) {
        p->version = 1;
    } else {
        sync_seterr(err, errlen, "progress record: bad magic or version");
        return -1;
    }
    pos = mlen + 1;
    if (take_line(buf, len, &pos, "pool", p->pool, sizeof(p->pool), err,
                  errlen) < 0 ||
        take_line(buf, len, &pos, "image", p->image, sizeof(p->image), err,
                  errlen) < 0 ||
        take_line(buf, len, &pos, "base", p->base, sizeof(p->base), err,
                  errlen) < 0 ||
        take_line(buf, len, &pos, "target", p->target, sizeof(p->target),
                  err, errlen) < 0 ||
        take_line(buf, len, &pos, "owner", p->owner, sizeof(p->owner), err,
                  errlen) < 0)
        return -1;
    if (p->version >= 2) {
        if (take_line(buf, len, &pos, "image_id", p->dr.id,
                      sizeof(p->dr.id), err, errlen) < 0 ||
            take_line(buf, len, &pos, "marker", p->dr.marker,
                      sizeof(p->dr.marker), err, errlen) < 0)
            return -1;
        if (!sync_identity_token_ok(p->dr.id) ||
            !sync_identity_token_ok(p->dr.marker)) {
            sync_seterr(err, errlen, "progress record: invalid image_id or "
                        "marker");
            return -1;
        }
    }
    dst[0] = &p->size;
    dst[1] = &p->done_offset;
    dst[2] = &p->bytes;
    dst[3] = &p->extents;
    for (i = 0; i < 4; i++) {
        if (take_line(buf, len, &pos, nums[i], val, sizeof(val), err,
                      errlen) < 0 ||
            parse_u64(val, dst[i], nums[i], err, errlen) < 0)
            return -1;
    }
    crc_at = pos;
    if (take_line(buf, len, &pos, "crc32", val, sizeof(val), err,
                  errlen) < 0)
        return -1;
    if (pos != len) {
        sync_seterr(err, errlen, "progress record: %zu trailing bytes",
                    len - pos);
        return -1;
    }
    errno = 0;
    want_crc = strtoul(val, &end, 16);
    if (strlen(val) != 8 || *end != '\0' || errno != 0) {
        sync_seterr(err, errlen, "progress record: malformed crc32");
        return -1;
    }
    crc = crc32(0L, (const Bytef *)buf, (uInt)crc_at);
    if (crc != want_crc) {
        sync_seterr(err, errlen, "progress record: crc32 mismatch (%08lx != "
                    "%08lx)", crc, want_crc);
        return -1;
    }
    if (p->image[0] == '\0' || p->target[0] == '\0') {
        sync_seterr(err, errlen, "progress record: empty image or target");
        return -1;
    }
    if (p->done_offset > p->size) {
        sync_seterr(err, errlen, "progress record: done_offset beyond size");
        return -1;
    }
    return 0;
}

int
sync_progress_matches(const struct sync_progress *p,
                      const struct sync_progress *want)
{
    return strcmp(p->pool, want->pool) == 0 &&
           strcmp(p->image, want->image) == 0 &&
           strcmp(p->base, want->base) == 0 &&
           strcmp(p->target, want->target) == 0 && p->size == want->size;
}

int
sync_progress_resumable(const struct sync_progress *have,
                        const struct sync_progress *want, char *why,
                        size_t whylen)
{
    if (!sync_progress_matches(have, want)) {
        sync_seterr(why, whylen, "the record is of another copy (%s@%s from "
                    "'%s')", have->image, have->target, have->base);
        return 0;
    }
    if (have->version < SYNC_PROGRESS_VERSION) {
        sync_seterr(why, whylen, "the record is version %d, which does not "
                    "name the dr image it was written into", have->version);
        return 0;
    }
    return sync_identity_same(&have->dr, &want->dr, why, whylen);
}

static int
escape_into(char *out, size_t outlen, size_t *pos, const char *s)
{
    static const char hex[] = "0123456789ABCDEF";

    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        int plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                    c == '-';

        if (*pos + (plain ? 1 : 3) >= outlen)
            return -1;
        if (plain) {
            out[(*pos)++] = (char)c;
        } else {
            out[(*pos)++] = '%';
            out[(*pos)++] = hex[c >> 4];
            out[(*pos)++] = hex[c & 0xf];
        }
    }
    out[*pos] = '\0';
    return 0;
}

int
sync_progress_path(char *out, size_t outlen, const char *dir,
                   const char *pool, const char *image)
{
    size_t pos;
    int n;

    n = snprintf(out, outlen, "%s/", dir);
    if (n < 0 || (size_t)n >= outlen)
        return -1;
    pos = (size_t)n;
    /* A leading '.' would hide the file and ".." would escape dir: the
     * pool name goes first and "@" (escaped) separates it from the image,
     * so the name never starts with a dot unless the pool does. */
    if (pool[0] == '.' || pool[0] == '\0')
        return -1;
    if (escape_into(out, outlen, &pos, pool) < 0 ||
        escape_into(out, outlen, &pos, "@") < 0 ||
        escape_into(out, outlen, &pos, image) < 0)
        return -1;
    n = snprintf(out + pos, outlen - pos, ".progress");
    if (n < 0 || (size_t)n >= outlen - pos)
        return -1;
    return 0;
}

static int
fsync_dir_of(const char *path, char *err, size_t errlen)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    int fd = -1, ret = -1;

    if (slash == NULL) {
        strcpy(dir, ".");
    } else if (slash == path) {
        strcpy(dir, "/");
    } else {
        if ((size_t)(slash - path) >= sizeof(dir))
            goto cleanup;
        memcpy(dir, path, slash - path);
        dir[slash - path] = '\0';
    }
    fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) < 0) {
        sync_seterr(err, errlen, "fsync directory %s: %s", dir,
                    strerror(errno));
        goto cleanup;
    }
    ret = 0;
cleanup:
    if (fd >= 0)
        close(fd);
    return ret;
}

int
sync_progress_save(const char *path, const struct sync_progress *p,
                   char *err, size_t errlen)
{
    char buf[SYNC_PROGRESS_MAX + 64], tmp[4200];
    const char *op = NULL;     /* the step that failed with errno set */
    int fd = -1, ret = -1, n;
    size_t off = 0;

    n = sync_progress_encode(p, buf, sizeof(buf), err, errlen);
    if (n < 0)
        return -1;
    if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= sizeof(tmp)) {
        sync_seterr(err, errlen, "progress path too long");
        return -1;
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        op = "open";
        goto cleanup;
    }
    while (off < (size_t)n) {
        ssize_t w = write(fd, buf + off, (size_t)n - off);

        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            op = "write";
            goto cleanup;
        }
        off += (size_t)w;
    }
    if (fsync(fd) < 0) {
        op = "fsync";
        goto cleanup;
    }
    n = close(fd);
    fd = -1;
    if (n < 0) {
        op = "close";
        goto cleanup;
    }
    if (rename(tmp, path) < 0) {
        op = "rename";
        goto cleanup;
    }
    /* The rename is durable only once the directory is. */
    if (fsync_dir_of(path, err, errlen) < 0)
        goto cleanup;
    ret = 0;
cleanup:
    if (op != NULL) {
        sync_seterr(err, errlen, "save progress %s: %s: %s", tmp, op,
                    strerror(errno));
        unlink(tmp);
    }
    if (fd >= 0)
        close(fd);
    return ret;
}

int
sync_progress_load(const char *path, struct sync_progress *p, char *err,
                   size_t errlen)
{
    char buf[SYNC_PROGRESS_MAX + 1];
    size_t len = 0;
    int fd, ret = -1;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return SYNC_PROGRESS_ENOENT;
        sync_seterr(err, errlen, "open %s: %s", path, strerror(errno));
        return -1;
    }
    for (;;) {
        ssize_t r = read(fd, buf + len, sizeof(buf) - len);

        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            sync_seterr(err, errlen, "read %s: %s", path, strerror(errno));
            goto cleanup;
        }
        if (r == 0)
            break;
        len += (size_t)r;
        if (len == sizeof(buf)) {
            sync_seterr(err, errlen, "%s: progress record too large", path);
            goto cleanup;
        }
    }
    ret = sync_progress_decode(buf, len, p, err, errlen);
cleanup:
    close(fd);
    return ret;
}

int
sync_progress_remove(const char *path, char *err, size_t errlen)
{
    if (unlink(path) < 0) {
        if (errno == ENOENT)
            return 0;
        sync_seterr(err, errlen, "unlink %s: %s", path, strerror(errno));
        return -1;
    }
    return fsync_dir_of(path, err, errlen);
}
