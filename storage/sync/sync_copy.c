#include "sync_copy.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sync_rate.h"
#include "sync_util.h"
#include "sync_verify.h"

/* Granularity of the zero-block check of data read from the primary: the
 * usual guest block size, so a 4 KiB guest write is one data run. */
#define ZERO_BLOCK 4096

/* State shared by the copy workers; everything below mu is under it. */
struct copy {
    const struct sync_opts *o;
    rbd_image_t src;
    rbd_image_t dst;
    struct sync_layout lay;    /* of the DR image */
    const struct sync_extent *items;
    size_t n;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t next;               /* next item to hand out */
    unsigned char *done;       /* per item: written and verified */
    uint64_t *sent;            /* per item: data bytes that crossed */
    size_t mark;               /* items[0..mark) are all done */
    uint64_t done_offset;      /* end of items[mark - 1] */
    uint64_t mark_bytes;       /* data bytes of items[0..mark) */
    uint64_t shipped, zeroed, zero_data, zero_skipped, extents;
    int active;                /* workers still running */
    struct sync_rate rate;
    int fail_code;             /* 0 or a SYNC_E* code */
    char fail_msg[512];
};

/* Start one asynchronous read; on failure *comp is NULL and nothing is in
 * flight, so the caller only has to wait for the reads started before. */
static int
aio_read_start(rbd_image_t img, uint64_t off, size_t len, char *dst,
               rbd_completion_t *comp)
{
    int rc;

    *comp = NULL;
    if ((rc = rbd_aio_create_completion(NULL, NULL, comp)) < 0) {
        *comp = NULL;
        return rc;
    }
    if ((rc = rbd_aio_read(img, off, len, dst, *comp)) < 0) {
        rbd_aio_release(*comp);
        *comp = NULL;
    }
    return rc;
}

/*
 * Wait for n completions (NULL entries skipped) and release them.  Reads
 * must return the extent's length; writes return 0 (check_len 0).  The
 * first failure goes to msg (msglen 0: keep the message already there).
 */
static int
aio_wait_all(rbd_completion_t *comp, size_t n, const struct sync_extent *e,
             const char *what, int check_len, char *msg, size_t msglen)
{
    int ret = 0;
    size_t i;

    for (i = 0; i < n; i++) {
        ssize_t r;

        if (comp[i] == NULL)
            continue;
        rbd_aio_wait_for_complete(comp[i]);
        r = rbd_aio_get_return_value(comp[i]);
        rbd_aio_release(comp[i]);
        comp[i] = NULL;
        if (ret == 0 && (r < 0 || (check_len && (uint64_t)r != e[i].len))) {
            sync_seterr(msg, msglen, "%s off=%" PRIu64 " len=%" PRIu64 ": %s",
                        what, e[i].off, e[i].len,
                        r < 0 ? strerror((int)-r) : "short transfer");
            ret = -1;
        }
    }
    return ret;
}

/*
 * Copy one group: the n work-list extents that fall in one chunk (and so
 * in one DR object).  All reads of the group are in flight at once, then
 * all writes, then one verification pass, so many small extents cost a
 * few round trips rather than three each.  buf and back hold the chunk;
 * an extent lives at its offset within the chunk.
 *
 * A DATA extent is cut into runs after it is read: blocks of ZERO_BLOCK
 * bytes that read as zeroes become write-zeroes at DR instead of data
 * (sync_extents_add_runs says why the diff reports such holes).  sent[i]
 * gets the data bytes of extent i that crossed the wire, *skipped the zero
 * bytes that needed no write (absent DR object).
 */
static int
copy_group(struct copy *c, const struct sync_extent *e, size_t n, char *buf,
           char *back, uint64_t *sent, uint64_t *skipped, char *msg,
           size_t msglen)
{
    uint64_t base = e[0].off - e[0].off % c->o->chunk, data = 0, wait_ns;
    rbd_completion_t *comp = calloc(n, sizeof(*comp));
    size_t *first = calloc(n + 1, sizeof(*first));
    struct sync_extents runs = {0};
    rbd_completion_t *rc_comp = NULL;
    uint32_t *crc = NULL;
    unsigned char (*sha)[SYNC_DIGEST_LEN] = NULL;
    unsigned char got[SYNC_DIGEST_LEN];
    const struct sync_extent *r;
    int ret = SYNC_ERR, rc, any_back = 0, skip_zero = 0;
    size_t i, k, m;

    *skipped = 0;
    if (comp == NULL || first == NULL) {
        sync_seterr(msg, msglen, "out of memory");
        goto cleanup;
    }
    /* Read every data extent from the primary snapshot. */
    for (i = 0; i < n; i++) {
        if (e[i].kind != SYNC_DATA)
            continue;
        if ((rc = aio_read_start(c->src, e[i].off, e[i].len,
                                 buf + (e[i].off - base), &comp[i])) < 0) {
            sync_seterr(msg, msglen, "primary read off=%" PRIu64 ": %s",
                        e[i].off, strerror(-rc));
            aio_wait_all(comp, n, e, "primary read", 1, msg, 0);
            goto cleanup;
        }
    }
    if (aio_wait_all(comp, n, e, "primary read", 1, msg, msglen) < 0)
        goto cleanup;
    /* The runs of extent i are runs.v[first[i] .. first[i + 1]). */
    for (i = 0; i < n; i++) {
        first[i] = runs.n;
        rc = e[i].kind == SYNC_DATA
             ? sync_extents_add_runs(&runs, buf + (e[i].off - base), e[i].off,
                                     e[i].len, ZERO_BLOCK)
             : sync_extents_add(&runs, e[i].off, e[i].len, e[i].kind);
        if (rc < 0) {
            sync_seterr(msg, msglen, "out of memory");
            goto cleanup;
        }
    }
    first[n] = runs.n;
    r = runs.v;
    m = runs.n;
    rc_comp = calloc(m ? m : 1, sizeof(*rc_comp));
    crc = calloc(m ? m : 1, sizeof(*crc));
    sha = calloc(m ? m : 1, SYNC_DIGEST_LEN);
    if (rc_comp == NULL || crc == NULL || sha == NULL) {
        sync_seterr(msg, msglen, "out of memory");
        goto cleanup;
    }
    /*
     * Zero runs need neither a write nor a read-back when the DR object
     * does not exist: it reads as zeroes, and the data runs written next
     * leave the rest of it zero.  A sparse disk's new objects are mostly
     * holes, so this saves the write-zeroes and, above all, reading the
     * holes back over the wire.  Each object belongs to one group at a
     * time and nothing else writes the DR image during a run.
     */
    for (k = 0; k < m && c->lay.absent_is_zero; k++) {
        if (r[k].kind == SYNC_ZERO) {
            char oid[RBD_MAX_BLOCK_NAME_SIZE + 24];
            uint64_t psize;
            time_t pmtime;

            snprintf(oid, sizeof(oid), "%s.%016" PRIx64, c->lay.prefix,
                     r[0].off >> c->lay.order);
            rc = rados_stat(c->lay.dio, oid, &psize, &pmtime);
            if (rc == -ENOENT) {
                skip_zero = 1;
            } else if (rc < 0) {
                sync_seterr(msg, msglen, "dr stat %s: %s", oid, strerror(-rc));
                goto cleanup;
            }
            break;
        }
    }
    for (i = 0; i < n; i++) {
        sent[i] = 0;
        for (k = first[i]; k < first[i + 1]; k++)
            if (r[k].kind == SYNC_DATA && e[i].kind == SYNC_DATA)
                sent[i] += r[k].len;
        data += sent[i];
    }
    for (k = 0; k < m; k++) {
        if (r[k].kind != SYNC_DATA)
            continue;
        if (c->lay.osd_verify)
            crc[k] = sync_crc32c(SYNC_CRC_SEED, buf + (r[k].off - base),
                                 r[k].len);
        else if (sync_digest_buf(buf + (r[k].off - base), r[k].len,
                                 sha[k]) < 0) {
            sync_seterr(msg, msglen, "digest failed");
            goto cleanup;
        }
    }
    pthread_mutex_lock(&c->mu);
    wait_ns = sync_rate_take(&c->rate, sync_now_ns(), data);
    pthread_mutex_unlock(&c->mu);
    if (wait_ns > 0) {
        struct timespec ts = {(time_t)(wait_ns / 1000000000ULL),
                              (long)(wait_ns % 1000000000ULL)};

        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
            ;
    }
    /* Write the data runs (or zeroes) at DR. */
    for (k = 0; k < m; k++) {
        if (skip_zero && r[k].kind == SYNC_ZERO) {
            *skipped += r[k].len;
            continue;
        }
        if ((rc = rbd_aio_create_completion(NULL, NULL, &rc_comp[k])) < 0) {
            rc_comp[k] = NULL;
        } else if (r[k].kind == SYNC_DATA) {
            rc = rbd_aio_write(c->dst, r[k].off, r[k].len,
                               buf + (r[k].off - base), rc_comp[k]);
        } else {
            rc = rbd_aio_write_zeroes(c->dst, r[k].off, r[k].len, rc_comp[k],
                                      0, 0);
        }
        if (rc < 0) {
            if (rc_comp[k] != NULL)
                rbd_aio_release(rc_comp[k]);
            rc_comp[k] = NULL;
            sync_seterr(msg, msglen, "dr write off=%" PRIu64 ": %s", r[k].off,
                        strerror(-rc));
            aio_wait_all(rc_comp, m, r, "dr write", 0, msg, 0);
            goto cleanup;
        }
    }
    if (aio_wait_all(rc_comp, m, r, "dr write", 0, msg, msglen) < 0)
        goto cleanup;
    /* Verify: OSD-side CRCs for data; read back what the OSD cannot sum. */
    for (k = 0; k < m; k++) {
        if ((c->lay.osd_verify && r[k].kind == SYNC_DATA) ||
            (skip_zero && r[k].kind == SYNC_ZERO))
            continue;
        any_back = 1;
        if ((rc = aio_read_start(c->dst, r[k].off, r[k].len,
                                 back + (r[k].off - base), &rc_comp[k])) < 0) {
            sync_seterr(msg, msglen, "dr read-back off=%" PRIu64 ": %s",
                        r[k].off, strerror(-rc));
            aio_wait_all(rc_comp, m, r, "dr read-back", 1, msg, 0);
            goto cleanup;
        }
    }
    if (any_back &&
        aio_wait_all(rc_comp, m, r, "dr read-back", 1, msg, msglen) < 0)
        goto cleanup;
    for (k = 0; k < m; k++) {
        const char *p = back + (r[k].off - base);

        if (r[k].kind == SYNC_ZERO) {
            if (!skip_zero && !sync_buf_is_zero(p, r[k].len)) {
                sync_seterr(msg, msglen, "dr extent off=%" PRIu64 " len=%"
                            PRIu64 " not zero after write-zeroes", r[k].off,
                            r[k].len);
                ret = SYNC_EVERIFY;
                goto cleanup;
            }
        } else if (!c->lay.osd_verify) {
            if (sync_digest_buf(p, r[k].len, got) < 0) {
                sync_seterr(msg, msglen, "digest failed");
                goto cleanup;
            }
            if (memcmp(sha[k], got, SYNC_DIGEST_LEN) != 0) {
                char hw[SYNC_DIGEST_HEX], hg[SYNC_DIGEST_HEX];

                sync_digest_hex(sha[k], hw);
                sync_digest_hex(got, hg);
                sync_seterr(msg, msglen, "checksum mismatch at dr off=%" PRIu64
                            " len=%" PRIu64 ": sent %s, read back %s", r[k].off,
                            r[k].len, hw, hg);
                ret = SYNC_EVERIFY;
                goto cleanup;
            }
        }
    }
    if (c->lay.osd_verify) {
        ret = sync_verify_osd_group(&c->lay, r, m, crc, msg, msglen);
        goto cleanup;
    }
    ret = SYNC_OK;
cleanup:
    free(comp);
    free(first);
    free(rc_comp);
    free(crc);
    free(sha);
    sync_extents_clear(&runs);
    return ret;
}

static void *
copy_worker(void *arg)
{
    struct copy *c = arg;
    char *buf = malloc(c->o->chunk), *back = malloc(c->o->chunk);
    char msg[512];
    uint64_t skipped = 0;
    size_t i, j, k;
    uint64_t chunk = c->o->chunk;
    int rc;

    for (;;) {
        pthread_mutex_lock(&c->mu);
        if (buf == NULL || back == NULL) {
            if (c->fail_code == 0) {
                c->fail_code = SYNC_ERR;
                snprintf(c->fail_msg, sizeof(c->fail_msg), "out of memory");
            }
        }
        if (c->fail_code != 0 || c->next >= c->n) {
            pthread_mutex_unlock(&c->mu);
            break;
        }
        /* Claim every item of the next chunk: they share one object. */
        i = c->next;
        for (j = i + 1; j < c->n &&
             c->items[j].off / chunk == c->items[i].off / chunk; j++)
            ;
        c->next = j;
        pthread_mutex_unlock(&c->mu);

        rc = copy_group(c, &c->items[i], j - i, buf, back, &c->sent[i],
                        &skipped, msg, sizeof(msg));

        pthread_mutex_lock(&c->mu);
        if (rc != SYNC_OK) {
            if (c->fail_code == 0) {
                c->fail_code = rc;
                snprintf(c->fail_msg, sizeof(c->fail_msg), "%s", msg);
            }
        } else {
            c->zero_skipped += skipped;
            for (k = i; k < j; k++) {
                c->done[k] = 1;
                c->extents++;
                if (c->items[k].kind == SYNC_DATA) {
                    c->shipped += c->sent[k];
                    c->zero_data += c->items[k].len - c->sent[k];
                } else {
                    c->zeroed += c->items[k].len;
                }
            }
            /* Groups finish out of order; the record may only claim the
             * contiguous prefix. */
            while (c->mark < c->n && c->done[c->mark]) {
                c->done_offset = c->items[c->mark].off +
                                 c->items[c->mark].len;
                if (c->items[c->mark].kind == SYNC_DATA)
                    c->mark_bytes += c->sent[c->mark];
                c->mark++;
            }
        }
        pthread_cond_signal(&c->cv);
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_lock(&c->mu);
    c->active--;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    free(buf);
    free(back);
    return NULL;
}

json_t *
sync_copy_progress_event(uint64_t bytes, uint64_t extents, uint64_t offset,
                         uint64_t total, uint64_t zeroed)
{
    return json_pack("{s:s,s:I,s:I,s:I,s:I,s:I}", "event", "progress",
                     "bytes", (json_int_t)bytes, "extents",
                     (json_int_t)extents, "offset", (json_int_t)offset,
                     "total", (json_int_t)total, "zeroed",
                     (json_int_t)zeroed);
}

/*
 * Save the record for the done prefix off, then print a progress event
 * for it: an offset that was printed is always durable (the kill -9 test
 * relies on it).  A failed save costs a resend after a crash, never data,
 * so it warns once and the copy goes on.
 */
static void
report(const struct sync_opts *o, const char *prog_path,
       struct sync_progress *prog, uint64_t *last_saved, int *warned,
       uint64_t off, uint64_t rec_bytes, uint64_t rec_ext, uint64_t bytes,
       uint64_t ext, uint64_t total, uint64_t zeroed)
{
    char perr[256];

    if (off != *last_saved) {
        prog->done_offset = off;
        /* Only the done prefix counts: extents finished beyond it will
         * be sent again by a resumed run. */
        prog->bytes = rec_bytes;
        prog->extents = rec_ext;
        if (sync_progress_save(prog_path, prog, perr, sizeof(perr)) < 0) {
            if (!*warned)
                sync_logkv(o, "warn", "msg=\"progress record not saved\" "
                           "error=\"%s\"", perr);
            *warned = 1;
            off = *last_saved;    /* print only what is durable */
        } else {
            *last_saved = off;
        }
    }
    sync_emit(o, sync_copy_progress_event(bytes, ext, off, total, zeroed));
}

/*
 * Run the workers over items[0..n) and save progress as the done prefix
 * grows.  prog holds the record to save (bytes/extents carried over from
 * earlier runs are in prev_*).
 *
 * The record is saved (write, fsync, rename, fsync of the directory) and a
 * progress event printed at most once per progress_ms, not after every
 * group: a small round is over before the first interval, and a 1 GiB copy
 * did a few hundred fsyncs.  A crash loses at most one interval of work,
 * which a resumed run sends again.  When every extent is done, nothing is
 * saved here: the DR snapshot, created next, is the durable completion
 * marker, so one more save would only sit on the critical path.  The
 * final progress event is then printed by the caller once the snapshot
 * exists (*end_offset is its offset); on failure it is saved and printed
 * here.
 */
int
sync_copy_all(const struct sync_opts *o, rbd_image_t src, rbd_image_t dst,
              const struct sync_layout *layout,
              const struct sync_extent *items, size_t n, uint64_t total,
              const char *prog_path, struct sync_progress *prog,
              struct sync_result *r, uint64_t *end_offset, char *err,
              size_t errlen)
{
    struct copy c;
    pthread_t *th = NULL;
    int nth = 0, i, ret = SYNC_ERR, warned = 0;
    uint64_t last_saved, prev_bytes = prog->bytes, prev_ext = prog->extents;
    uint64_t base_done = prog->done_offset, next_report;
    uint64_t every = (uint64_t)o->progress_ms * 1000000ULL;

    memset(&c, 0, sizeof(c));
    c.o = o;
    c.src = src;
    c.dst = dst;
    c.lay = *layout;
    c.items = items;
    c.n = n;
    c.done_offset = base_done;
    last_saved = base_done;
    sync_rate_init(&c.rate, (uint64_t)(o->rate_mbps * 1e6), 0);
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    c.done = calloc(n ? n : 1, 1);
    c.sent = calloc(n ? n : 1, sizeof(*c.sent));
    th = calloc((size_t)o->workers, sizeof(*th));
    if (c.done == NULL || c.sent == NULL || th == NULL) {
        sync_seterr(err, errlen, "out of memory");
        goto cleanup;
    }
    pthread_mutex_lock(&c.mu);
    for (i = 0; i < o->workers; i++) {
        if (pthread_create(&th[i], NULL, copy_worker, &c) != 0)
            break;
        nth++;
        c.active++;
    }
    if (nth == 0) {
        c.fail_code = SYNC_ERR;
        snprintf(c.fail_msg, sizeof(c.fail_msg), "cannot start workers");
    }
    /* A first report as the copy begins: whoever watches the run knows
     * from here on that a report is due every progress_ms, so a copy that
     * stalls (a hung OSD) can be told from a long open or plan. */
    pthread_mutex_unlock(&c.mu);
    sync_emit(o, sync_copy_progress_event(0, 0, base_done, total, 0));
    pthread_mutex_lock(&c.mu);
    next_report = sync_now_ns() + every;
    while (c.active > 0) {
        struct timespec ts;
        uint64_t t = sync_now_ns();
        uint64_t left = next_report > t ? next_report - t : 0;
        uint64_t off, bytes, ext, zeroed, mbytes, mark;

        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)(left % 1000000000ULL);
        ts.tv_sec += (time_t)(left / 1000000000ULL) + ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&c.cv, &c.mu, &ts);
        if (c.active == 0 || sync_now_ns() < next_report)
            continue;          /* the end is handled after the loop */
        off = c.done_offset;
        mbytes = c.mark_bytes;
        mark = c.mark;
        bytes = c.shipped;
        ext = c.extents;
        zeroed = c.zeroed;
        pthread_mutex_unlock(&c.mu);
        report(o, prog_path, prog, &last_saved, &warned, off,
               prev_bytes + mbytes, prev_ext + mark, bytes, ext, total,
               zeroed);
        next_report = sync_now_ns() + every;
        pthread_mutex_lock(&c.mu);
    }
    pthread_mutex_unlock(&c.mu);
    for (i = 0; i < nth; i++)
        pthread_join(th[i], NULL);
    r->bytes_shipped = c.shipped;
    r->bytes_zeroed = c.zeroed;
    r->bytes_zero_data = c.zero_data;
    r->bytes_zero_skipped = c.zero_skipped;
    r->extents = c.extents;
    r->bytes_shipped_total = prev_bytes + c.shipped;
    *end_offset = c.done_offset;
    if (c.fail_code != 0) {
        /* A resumed run starts from here: make it durable, then say it. */
        report(o, prog_path, prog, &last_saved, &warned, c.done_offset,
               prev_bytes + c.mark_bytes, prev_ext + c.mark, c.shipped,
               c.extents, total, c.zeroed);
        sync_seterr(err, errlen, "%s", c.fail_msg);
        ret = c.fail_code;
        goto cleanup;
    }
    ret = SYNC_OK;
cleanup:
    pthread_mutex_destroy(&c.mu);
    pthread_cond_destroy(&c.cv);
    free(c.done);
    free(c.sent);
    free(th);
    return ret;
}
