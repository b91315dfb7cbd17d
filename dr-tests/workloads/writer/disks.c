/* disks.c - open, size and write the writer's disks. */
#include "disks.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#define DISKS_ALIGN 4096
#define DISKS_ZERO_CHUNK (1024 * 1024)

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/*
 * O_DIRECT bypasses the page cache, so a write reaches the virtual disk and
 * a snapshot taken after it completes contains it.  Some file systems
 * (tmpfs) refuse O_DIRECT with EINVAL; for host tests we then fall back to
 * O_DSYNC alone, which still makes every write durable before it returns.
 */
static int open_one(struct disks *d, int i, bool want_direct,
                    char *err, size_t errlen)
{
    int flags = O_WRONLY | O_DSYNC | O_CLOEXEC;
    int fd = -1;

    if (want_direct) {
        fd = open(d->path[i], flags | O_DIRECT);
        if (fd >= 0) {
            d->direct[i] = true;
            d->fd[i] = fd;
            return 0;
        }
        if (errno != EINVAL) {
            set_err(err, errlen, "open %s: %s", d->path[i], strerror(errno));
            return -1;
        }
        printf("cp-writer: warning: %s refuses O_DIRECT, using O_DSYNC only\n",
               d->path[i]);
    }
    fd = open(d->path[i], flags);
    if (fd < 0) {
        set_err(err, errlen, "open %s: %s", d->path[i], strerror(errno));
        return -1;
    }
    d->direct[i] = false;
    d->fd[i] = fd;
    return 0;
}

static int size_of(int fd, const char *path, uint64_t *size,
                   char *err, size_t errlen)
{
    struct stat st;

    if (fstat(fd, &st) < 0) {
        set_err(err, errlen, "stat %s: %s", path, strerror(errno));
        return -1;
    }
    if (S_ISBLK(st.st_mode)) {
        if (ioctl(fd, BLKGETSIZE64, size) < 0) {
            set_err(err, errlen, "BLKGETSIZE64 %s: %s", path,
                    strerror(errno));
            return -1;
        }
        return 0;
    }
    if (!S_ISREG(st.st_mode)) {
        set_err(err, errlen, "%s is neither a block device nor a file", path);
        return -1;
    }
    *size = (uint64_t)st.st_size;
    return 0;
}

int disks_open(struct disks *d, const struct config *cfg,
               char *err, size_t errlen)
{
    void *buf = NULL;

    memset(d, 0, sizeof(*d));
    for (int i = 0; i < CONFIG_MAX_DISKS; i++)
        d->fd[i] = -1;
    if (posix_memalign(&buf, DISKS_ALIGN, DISKS_ZERO_CHUNK) != 0) {
        set_err(err, errlen, "out of memory");
        goto cleanup;
    }
    d->buf = buf;
    d->slots = UINT64_MAX;
    for (int i = 0; i < cfg->ndisks; i++) {
        uint64_t size;

        strcpy(d->path[i], cfg->disks[i]);
        d->n = i + 1;
        if (open_one(d, i, !cfg->buffered, err, errlen) < 0)
            goto cleanup;
        if (size_of(d->fd[i], d->path[i], &size, err, errlen) < 0)
            goto cleanup;
        if (size / RECORD_SIZE < d->slots)
            d->slots = size / RECORD_SIZE;
    }
    if (d->slots == 0) {
        set_err(err, errlen, "a disk is smaller than one record");
        goto cleanup;
    }
    return 0;

cleanup:
    disks_close(d);
    return -1;
}

int disks_write(struct disks *d, int i, uint64_t slot,
                const struct record *rec, char *err, size_t errlen)
{
    off_t off = (off_t)(slot * RECORD_SIZE);
    ssize_t n;

    record_encode(rec, d->buf);
    for (;;) {
        n = pwrite(d->fd[i], d->buf, RECORD_SIZE, off);
        if (n == RECORD_SIZE)
            return 0;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EINVAL && d->direct[i]) {
            /* The file system's logical block is larger than a record. */
            close(d->fd[i]);
            d->fd[i] = -1;
            printf("cp-writer: warning: %s: 512-byte O_DIRECT writes "
                   "refused, using O_DSYNC only\n", d->path[i]);
            if (open_one(d, i, false, err, errlen) < 0)
                return -1;
            continue;
        }
        break;
    }
    if (n < 0)
        set_err(err, errlen, "write %s at %lld: %s", d->path[i],
                (long long)off, strerror(errno));
    else
        set_err(err, errlen, "short write %s at %lld: %zd bytes", d->path[i],
                (long long)off, n);
    return -1;
}

int disks_zero(struct disks *d, char *err, size_t errlen)
{
    memset(d->buf, 0, DISKS_ZERO_CHUNK);
    for (int i = 0; i < d->n; i++) {
        uint64_t total = d->slots * RECORD_SIZE;
        uint64_t off = 0;

        while (off < total) {
            size_t len = total - off < DISKS_ZERO_CHUNK ?
                (size_t)(total - off) : DISKS_ZERO_CHUNK;
            ssize_t n = pwrite(d->fd[i], d->buf, len, (off_t)off);

            if (n < 0 && errno == EINTR)
                continue;
            if (n != (ssize_t)len) {
                set_err(err, errlen, "zeroing %s at %llu: %s", d->path[i],
                        (unsigned long long)off,
                        n < 0 ? strerror(errno) : "short write");
                return -1;
            }
            off += len;
        }
    }
    return 0;
}

void disks_close(struct disks *d)
{
    if (!d)
        return;
    for (int i = 0; i < d->n; i++) {
        if (d->fd[i] >= 0)
            close(d->fd[i]);
        d->fd[i] = -1;
    }
    d->n = 0;
    free(d->buf);
    d->buf = NULL;
}
