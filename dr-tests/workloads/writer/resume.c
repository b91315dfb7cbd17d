/* resume.c - find this writer's records on its disks (see resume.h). */
#include "resume.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "record.h"

#define RESUME_CHUNK_SLOTS 512      /* 256 KiB per disk per step */

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static bool all_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

static int read_full(int fd, unsigned char *buf, size_t len, off_t off,
                     const char *path, char *err, size_t errlen)
{
    size_t done = 0;

    while (done < len) {
        ssize_t n = pread(fd, buf + done, len - done, off + (off_t)done);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            set_err(err, errlen, "resume: reading %s at %lld: %s", path,
                    (long long)(off + (off_t)done),
                    n < 0 ? strerror(errno) : "end of disk");
            return -1;
        }
        done += (size_t)n;
    }
    return 0;
}

/* Walk state over the writer's records in the order it wrote them. */
struct walk {
    uint32_t vm;
    int ndisks;
    bool ended;             /* a zero slot was seen at k = end */
    uint64_t end;
    struct resume_state *st;
};

/* One slot: disk i, slot j, the writer's k-th record.  0 / -1. */
static int visit(struct walk *w, const char *path, int i, uint64_t j,
                 const unsigned char *slot, char *err, size_t errlen)
{
    uint64_t k = j * (uint64_t)w->ndisks + (uint64_t)i;
    struct record rec;

    if (all_zero(slot, RECORD_SIZE)) {
        if (!w->ended) {
            w->ended = true;
            w->end = k;
        }
        return 0;
    }
    if (w->ended) {
        set_err(err, errlen, "resume: %s slot %llu holds data after this "
                "writer's last record (its record %llu is missing): not a "
                "crash-consistent copy", path, (unsigned long long)j,
                (unsigned long long)w->end);
        return -1;
    }
    if (record_decode(slot, &rec) < 0) {
        set_err(err, errlen, "resume: %s slot %llu is not a valid record "
                "(torn or corrupt)", path, (unsigned long long)j);
        return -1;
    }
    if (rec.vm != w->vm || rec.disk != (uint32_t)i || rec.epoch != j) {
        set_err(err, errlen, "resume: %s slot %llu holds vm %u disk %u "
                "epoch %u, expected vm %u disk %d epoch %llu", path,
                (unsigned long long)j, rec.vm, rec.disk, rec.epoch, w->vm, i,
                (unsigned long long)j);
        return -1;
    }
    if (k > 0 && rec.run != w->st->run) {
        set_err(err, errlen, "resume: %s slot %llu is of run %llu, the "
                "records before it of run %llu", path, (unsigned long long)j,
                (unsigned long long)rec.run,
                (unsigned long long)w->st->run);
        return -1;
    }
    if (rec.seq == 0 || rec.seq <= w->st->last_seq) {
        set_err(err, errlen, "resume: %s slot %llu has seq %llu after seq "
                "%llu: sequence numbers must rise", path,
                (unsigned long long)j, (unsigned long long)rec.seq,
                (unsigned long long)w->st->last_seq);
        return -1;
    }
    w->st->run = rec.run;
    w->st->last_seq = rec.seq;
    w->st->records = k + 1;
    return 0;
}

int resume_scan(const struct disks *d, uint32_t vm, struct resume_state *st,
                char *err, size_t errlen)
{
    unsigned char *bufs[CONFIG_MAX_DISKS] = {0};
    int fds[CONFIG_MAX_DISKS];
    struct walk w = { .vm = vm, .ndisks = d->n, .st = st };
    int rc = -1;

    memset(st, 0, sizeof(*st));
    for (int i = 0; i < CONFIG_MAX_DISKS; i++)
        fds[i] = -1;
    for (int i = 0; i < d->n; i++) {
        /* Read through the page cache, on fds of our own: the write fds
         * may be O_DIRECT, which wants aligned whole-block reads. */
        fds[i] = open(d->path[i], O_RDONLY | O_CLOEXEC);
        if (fds[i] < 0) {
            set_err(err, errlen, "resume: open %s: %s", d->path[i],
                    strerror(errno));
            goto cleanup;
        }
        bufs[i] = malloc((size_t)RESUME_CHUNK_SLOTS * RECORD_SIZE);
        if (!bufs[i]) {
            set_err(err, errlen, "resume: out of memory");
            goto cleanup;
        }
    }
    /* Every disk a chunk at a time, in step, so that the records are
     * visited in the order the writer wrote them: slot j of disk 0, 1, ...
     * n-1, then slot j+1. */
    for (uint64_t first = 0; first < d->slots; first += RESUME_CHUNK_SLOTS) {
        uint64_t nslots = d->slots - first < RESUME_CHUNK_SLOTS ?
            d->slots - first : RESUME_CHUNK_SLOTS;

        for (int i = 0; i < d->n; i++)
            if (read_full(fds[i], bufs[i], (size_t)nslots * RECORD_SIZE,
                          (off_t)(first * RECORD_SIZE), d->path[i],
                          err, errlen) < 0)
                goto cleanup;
        for (uint64_t s = 0; s < nslots; s++)
            for (int i = 0; i < d->n; i++)
                if (visit(&w, d->path[i], i, first + s,
                          bufs[i] + s * RECORD_SIZE, err, errlen) < 0)
                    goto cleanup;
    }
    rc = 0;

cleanup:
    for (int i = 0; i < CONFIG_MAX_DISKS; i++) {
        if (fds[i] >= 0)
            close(fds[i]);
        free(bufs[i]);
    }
    return rc;
}

int resume_check_single(const struct resume_state *st,
                        char *err, size_t errlen)
{
    /* One writer wrote every record: its k-th is seq k+1. */
    if (st->last_seq != st->records) {
        set_err(err, errlen, "resume: %llu records but the highest seq is "
                "%llu: records are missing", (unsigned long long)st->records,
                (unsigned long long)st->last_seq);
        return -1;
    }
    return 0;
}
