#include "sync_engine.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <rados/librados.h>
#include <rbd/librbd.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sync_extents.h"
#include "sync_fence.h"
#include "sync_identity.h"
#include "sync_progress.h"
#include "sync_rate.h"

#define HASH_QUEUE 8   /* aio reads in flight while hashing an image */
/* Granularity of the zero-block check of data read from the primary: the
 * usual guest block size, so a 4 KiB guest write is one data run. */
#define ZERO_BLOCK 4096

struct conn {
    rados_t cluster;
    rados_ioctx_t io;
    int connected;
};

/* State shared by the copy workers; everything below mu is under it. */
struct copy {
    const struct sync_opts *o;
    rbd_image_t src;
    rbd_image_t dst;
    rados_ioctx_t dio;         /* DR pool, for OSD-side checksums */
    char prefix[RBD_MAX_BLOCK_NAME_SIZE];   /* DR data object prefix */
    int order;                 /* DR object size = 1 << order */
    int osd_verify;            /* SYNC_VERIFY_OSD in effect */
    int absent_is_zero;        /* plain layout, no parent: a missing DR
                                  object reads as zeroes */
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

static void
seterr(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static void
logkv(const struct sync_opts *o, const char *level, const char *fmt, ...)
{
    char line[1024];
    va_list ap;

    if (o->on_log == NULL)
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    o->on_log(level, line, o->arg);
}

/* Emit one event and drop the reference to obj. */
static void
emit(const struct sync_opts *o, json_t *obj)
{
    char *s;

    if (obj == NULL)
        return;
    if (o->on_event != NULL) {
        s = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (s != NULL)
            o->on_event(s, o->arg);
        free(s);
    }
    json_decref(obj);
}

static uint64_t
now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* Charge the time since *since to phase ph and restart the clock. */
static void
phase_end(struct sync_result *r, int ph, uint64_t *since)
{
    uint64_t t = now_ns();

    r->phase_ms[ph] += (double)(t - *since) / 1e6;
    *since = t;
}

void
sync_opts_init(struct sync_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->chunk = 4u << 20;
    o->workers = 16;
    o->progress_ms = 500;
    o->op_timeout_s = 60;
    o->state_dir = "/var/lib/cutpoint/sync";
}

static int
conn_open(const struct sync_site *s, const char *which, int op_timeout_s,
          struct conn *c, char *err, size_t errlen)
{
    char tmo[16];
    int rc;

    memset(c, 0, sizeof(*c));
    rc = rados_create(&c->cluster, s->id);
    if (rc < 0) {
        seterr(err, errlen, "%s: rados_create(id=%s): %s", which, s->id,
               strerror(-rc));
        c->cluster = NULL;
        return -1;
    }
    rc = rados_conf_read_file(c->cluster, s->conf);
    if (rc < 0) {
        seterr(err, errlen, "%s: read %s: %s", which, s->conf, strerror(-rc));
        return -1;
    }
    if (s->keyring != NULL && s->keyring[0] != '\0' &&
        (rc = rados_conf_set(c->cluster, "keyring", s->keyring)) < 0) {
        seterr(err, errlen, "%s: keyring %s: %s", which, s->keyring,
               strerror(-rc));
        return -1;
    }
    /* The read-back that verifies each extent must come from the OSDs,
     * not from librbd's writeback cache, or it would prove nothing. */
    rados_conf_set(c->cluster, "rbd_cache", "false");
    /* librbd copies every buffer given to rbd_aio_write unless told
     * not to.  Ours stay untouched until the write completes (copy_group
     * waits for every write of a group before its buffer is reused or
     * freed), so the data is sent from it directly: one memcpy less per
     * byte, about 12% less CPU for a 1 GiB full copy on the lab.  The
     * per-extent CRC from the DR OSD would catch a buffer reused early. */
    rados_conf_set(c->cluster, "rbd_disable_zero_copy_writes", "false");
    /* A cluster that is down should fail the run, not hang it for the
     * default five minutes. */
    rados_conf_set(c->cluster, "client_mount_timeout", "30");
    /* librados waits forever for a request by default: an OSD that is
     * down, stopped or full (it pauses writes) would hang the run, and
     * with it the group's replication.  Bounded, the run fails with
     * ETIMEDOUT and resumes from its progress record next time. */
    snprintf(tmo, sizeof(tmo), "%d", op_timeout_s);
    rados_conf_set(c->cluster, "rados_osd_op_timeout", tmo);
    rados_conf_set(c->cluster, "rados_mon_op_timeout", tmo);
    /* Our own key=value lines are the log; keep librados quiet. */
    rados_conf_set(c->cluster, "log_to_stderr", "false");
    rados_conf_set(c->cluster, "err_to_stderr", "false");
    rc = rados_connect(c->cluster);
    if (rc < 0) {
        seterr(err, errlen, "%s: connect (conf=%s id=%s): %s", which, s->conf,
               s->id, strerror(-rc));
        return -1;
    }
    c->connected = 1;
    rc = rados_ioctx_create(c->cluster, s->pool, &c->io);
    if (rc < 0) {
        seterr(err, errlen, "%s: pool %s: %s", which, s->pool, strerror(-rc));
        c->io = NULL;
        return -1;
    }
    return 0;
}

static void
conn_close(struct conn *c)
{
    if (c->io != NULL)
        rados_ioctx_destroy(c->io);
    if (c->cluster != NULL)
        rados_shutdown(c->cluster);
    c->io = NULL;
    c->cluster = NULL;
}

/* ---- whole-image hash ------------------------------------------------ */

struct hash_job {
    rbd_image_t img;
    uint64_t size;
    uint64_t chunk;
    unsigned char digest[SYNC_DIGEST_LEN];
    int rc;
    char err[256];
};

/*
 * SHA-256 of the whole image as the handle sees it (a snapshot), with
 * HASH_QUEUE reads in flight and the hash fed strictly in offset order.
 */
static void *
hash_image(void *arg)
{
    struct hash_job *j = arg;
    rbd_completion_t comp[HASH_QUEUE] = {0};
    char *buf[HASH_QUEUE] = {0};
    uint64_t len[HASH_QUEUE] = {0};
    struct sync_hash *h = NULL;
    uint64_t sub = 0, got = 0;     /* bytes submitted / hashed */
    unsigned head = 0, inflight = 0, k;
    int rc;

    j->rc = -1;
    h = sync_hash_new();
    if (h == NULL) {
        seterr(j->err, sizeof(j->err), "hash: out of memory");
        goto cleanup;
    }
    for (k = 0; k < HASH_QUEUE; k++) {
        buf[k] = malloc(j->chunk);
        if (buf[k] == NULL) {
            seterr(j->err, sizeof(j->err), "hash: out of memory");
            goto cleanup;
        }
    }
    while (got < j->size) {
        while (inflight < HASH_QUEUE && sub < j->size) {
            k = (head + inflight) % HASH_QUEUE;
            len[k] = j->size - sub < j->chunk ? j->size - sub : j->chunk;
            rc = rbd_aio_create_completion(NULL, NULL, &comp[k]);
            if (rc < 0) {
                comp[k] = NULL;
                seterr(j->err, sizeof(j->err), "hash: completion: %s",
                       strerror(-rc));
                goto cleanup;
            }
            rc = rbd_aio_read(j->img, sub, len[k], buf[k], comp[k]);
            if (rc < 0) {
                rbd_aio_release(comp[k]);
                comp[k] = NULL;
                seterr(j->err, sizeof(j->err), "hash: read at %" PRIu64
                       ": %s", sub, strerror(-rc));
                goto cleanup;
            }
            sub += len[k];
            inflight++;
        }
        k = head;
        rbd_aio_wait_for_complete(comp[k]);
        rc = (int)rbd_aio_get_return_value(comp[k]);
        rbd_aio_release(comp[k]);
        comp[k] = NULL;
        head = (head + 1) % HASH_QUEUE;
        inflight--;
        if (rc < 0 || (uint64_t)rc != len[k]) {
            seterr(j->err, sizeof(j->err), "hash: read at %" PRIu64 ": %s",
                   got, rc < 0 ? strerror(-rc) : "short read");
            goto cleanup;
        }
        if (sync_hash_update(h, buf[k], len[k]) < 0) {
            seterr(j->err, sizeof(j->err), "hash: digest failed");
            goto cleanup;
        }
        got += len[k];
    }
    if (sync_hash_final(h, j->digest) < 0) {
        seterr(j->err, sizeof(j->err), "hash: digest failed");
        goto cleanup;
    }
    j->rc = 0;
cleanup:
    /* Reads still in flight write into buf: wait before freeing it. */
    for (k = 0; k < HASH_QUEUE; k++) {
        if (comp[k] != NULL) {
            rbd_aio_wait_for_complete(comp[k]);
            rbd_aio_release(comp[k]);
        }
    }
    for (k = 0; k < HASH_QUEUE; k++)
        free(buf[k]);
    sync_hash_free(h);
    return NULL;
}

/* Hash both snapshots at once (one thread each) and compare. */
static int
hash_both(const struct sync_opts *o, rbd_image_t src, rbd_image_t dst,
          uint64_t size, struct sync_result *r, char *err, size_t errlen)
{
    struct hash_job js = {0}, jd = {0};
    pthread_t t;
    int started;

    js.img = src;
    jd.img = dst;
    js.size = jd.size = size;
    js.chunk = jd.chunk = o->chunk;
    started = pthread_create(&t, NULL, hash_image, &js) == 0;
    hash_image(&jd);
    if (started)
        pthread_join(t, NULL);
    else
        hash_image(&js);
    if (js.rc < 0 || jd.rc < 0) {
        seterr(err, errlen, "%s: %s", js.rc < 0 ? "primary" : "dr",
               js.rc < 0 ? js.err : jd.err);
        return SYNC_ERR;
    }
    sync_digest_hex(js.digest, r->src_hash);
    sync_digest_hex(jd.digest, r->dst_hash);
    if (memcmp(js.digest, jd.digest, SYNC_DIGEST_LEN) != 0) {
        seterr(err, errlen, "full-image hash mismatch for %s@%s: primary %s,"
               " dr %s", o->image, o->target, r->src_hash, r->dst_hash);
        return SYNC_EVERIFY;
    }
    r->verified_full = 1;
    return SYNC_OK;
}

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

/* ---- diff ------------------------------------------------------------ */

struct diff_ctx {
    struct sync_extents *l;
    int kind;      /* 0: DATA if exists else ZERO; else this kind */
};

static int
diff_cb(uint64_t off, size_t len, int exists, void *arg)
{
    struct diff_ctx *d = arg;
    int kind = d->kind ? d->kind : (exists ? SYNC_DATA : SYNC_ZERO);

    return sync_extents_add(d->l, off, len, kind) < 0 ? -ENOMEM : 0;
}

static int
fast_diff_usable(rbd_image_t img)
{
    uint64_t features = 0, flags = 0;

    if (rbd_get_features(img, &features) < 0 ||
        rbd_get_flags(img, &flags) < 0)
        return 0;
    return (features & RBD_FEATURE_FAST_DIFF) != 0 &&
           (flags & RBD_FLAG_FAST_DIFF_INVALID) == 0;
}

static int
count_cb(uint64_t off, size_t len, int exists, void *arg)
{
    (void)off;
    (void)len;
    (void)exists;
    ++*(uint64_t *)arg;
    return 0;
}

/*
 * The exact diff of an image (whole_object 0) asks the OSDs for the
 * snapshots of every object, changed or not: about 10 ms for a 1 GiB
 * image on the lab.  The whole-object diff answers from the object maps
 * (fast-diff) in under 1 ms, and reports every object the exact diff
 * would touch.  quick != 0 therefore runs the whole-object diff first and
 * skips the exact one when it is empty: the drift check at DR, where
 * nothing has changed since the base in the normal case.  Without a valid
 * fast-diff map the whole-object diff would itself ask every object, so
 * it is then not tried.
 */
static int
collect_diff(rbd_image_t img, const char *from, uint64_t size, int kind,
             int quick, struct sync_extents *l, const char *which, char *err,
             size_t errlen)
{
    struct diff_ctx d = {l, kind};
    uint64_t touched = 0;
    int rc;

    if (quick && fast_diff_usable(img)) {
        rc = rbd_diff_iterate2(img, from, 0, size, 1, 1, count_cb, &touched);
        if (rc < 0) {
            seterr(err, errlen, "%s: diff from %s: %s", which,
                   from ? from : "(start)", strerror(-rc));
            return -1;
        }
        if (touched == 0)
            return 0;
    }
    rc = rbd_diff_iterate2(img, from, 0, size, 1, 0, diff_cb, &d);
    if (rc < 0) {
        seterr(err, errlen, "%s: diff from %s: %s", which,
               from ? from : "(start)", strerror(-rc));
        return -1;
    }
    if (sync_extents_normalize(l) < 0) {
        seterr(err, errlen, "%s: diff reported overlapping extents", which);
        return -1;
    }
    return 0;
}

/* ---- copy workers ---------------------------------------------------- */

/* Seed Ceph uses for CRC-32C checksums (little-endian u32 on the wire). */
#define CRC_SEED 0xffffffffu

/*
 * Ask the DR OSD for the CRC-32C of the bytes it now stores for extent e.
 * Items never cross an object boundary (the chunk divides the object
 * size), so each is one range of one data object.
 */
/* Checksum sub-operations per rados read op (one round trip each). */
#define CRC_BATCH 64

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
            seterr(msg, msglen, "%s off=%" PRIu64 " len=%" PRIu64 ": %s",
                   what, e[i].off, e[i].len,
                   r < 0 ? strerror((int)-r) : "short transfer");
            ret = -1;
        }
    }
    return ret;
}

/*
 * Ask the DR OSD for the CRC-32C of what it now stores for the DATA
 * extents of one group (all in one object: the chunk divides the object
 * size), CRC_BATCH ranges per round trip, and compare with what was sent.
 */
static int
osd_verify_group(struct copy *c, const struct sync_extent *e, size_t n,
                 const uint32_t *want, char *msg, size_t msglen)
{
    char oid[RBD_MAX_BLOCK_NAME_SIZE + 24], out[CRC_BATCH][8];
    int prval[CRC_BATCH];
    size_t idx[CRC_BATCH];
    uint32_t seed = htole32(CRC_SEED), count, v;
    uint64_t objmask = (1ULL << c->order) - 1;
    size_t i = 0, k, m;
    int rc;

    snprintf(oid, sizeof(oid), "%s.%016" PRIx64, c->prefix,
             e[0].off >> c->order);
    while (i < n) {
        rados_read_op_t op = rados_create_read_op();

        if (op == NULL) {
            seterr(msg, msglen, "out of memory");
            return SYNC_ERR;
        }
        for (m = 0; i < n && m < CRC_BATCH; i++) {
            if (e[i].kind != SYNC_DATA)
                continue;
            idx[m] = i;
            prval[m] = 0;
            rados_read_op_checksum(op, LIBRADOS_CHECKSUM_TYPE_CRC32C,
                                   (const char *)&seed, sizeof(seed),
                                   e[i].off & objmask, e[i].len, e[i].len,
                                   out[m], sizeof(out[m]), &prval[m]);
            m++;
        }
        rc = m > 0 ? rados_read_op_operate(op, c->dio, oid, 0) : 0;
        rados_release_read_op(op);
        if (rc < 0) {
            seterr(msg, msglen, "dr checksum of %s: %s", oid, strerror(-rc));
            return SYNC_ERR;
        }
        for (k = 0; k < m; k++) {
            const struct sync_extent *x = &e[idx[k]];

            memcpy(&count, out[k], 4);
            memcpy(&v, out[k] + 4, 4);
            if (prval[k] < 0 || le32toh(count) != 1) {
                seterr(msg, msglen, "dr checksum of %s off=%" PRIu64 ": %s",
                       oid, x->off, prval[k] < 0 ? strerror(-prval[k])
                       : "unexpected reply");
                return SYNC_ERR;
            }
            if (le32toh(v) != want[idx[k]]) {
                seterr(msg, msglen, "checksum mismatch at dr off=%" PRIu64
                       " len=%" PRIu64 ": sent crc32c %08x, dr osd has %08x",
                       x->off, x->len, want[idx[k]], le32toh(v));
                return SYNC_EVERIFY;
            }
        }
    }
    return SYNC_OK;
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
        seterr(msg, msglen, "out of memory");
        goto cleanup;
    }
    /* Read every data extent from the primary snapshot. */
    for (i = 0; i < n; i++) {
        if (e[i].kind != SYNC_DATA)
            continue;
        if ((rc = aio_read_start(c->src, e[i].off, e[i].len,
                                 buf + (e[i].off - base), &comp[i])) < 0) {
            seterr(msg, msglen, "primary read off=%" PRIu64 ": %s", e[i].off,
                   strerror(-rc));
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
            seterr(msg, msglen, "out of memory");
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
        seterr(msg, msglen, "out of memory");
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
    for (k = 0; k < m && c->absent_is_zero; k++) {
        if (r[k].kind == SYNC_ZERO) {
            char oid[RBD_MAX_BLOCK_NAME_SIZE + 24];
            uint64_t psize;
            time_t pmtime;

            snprintf(oid, sizeof(oid), "%s.%016" PRIx64, c->prefix,
                     r[0].off >> c->order);
            rc = rados_stat(c->dio, oid, &psize, &pmtime);
            if (rc == -ENOENT) {
                skip_zero = 1;
            } else if (rc < 0) {
                seterr(msg, msglen, "dr stat %s: %s", oid, strerror(-rc));
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
        if (c->osd_verify)
            crc[k] = sync_crc32c(CRC_SEED, buf + (r[k].off - base), r[k].len);
        else if (sync_digest_buf(buf + (r[k].off - base), r[k].len,
                                 sha[k]) < 0) {
            seterr(msg, msglen, "digest failed");
            goto cleanup;
        }
    }
    pthread_mutex_lock(&c->mu);
    wait_ns = sync_rate_take(&c->rate, now_ns(), data);
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
            seterr(msg, msglen, "dr write off=%" PRIu64 ": %s", r[k].off,
                   strerror(-rc));
            aio_wait_all(rc_comp, m, r, "dr write", 0, msg, 0);
            goto cleanup;
        }
    }
    if (aio_wait_all(rc_comp, m, r, "dr write", 0, msg, msglen) < 0)
        goto cleanup;
    /* Verify: OSD-side CRCs for data; read back what the OSD cannot sum. */
    for (k = 0; k < m; k++) {
        if ((c->osd_verify && r[k].kind == SYNC_DATA) ||
            (skip_zero && r[k].kind == SYNC_ZERO))
            continue;
        any_back = 1;
        if ((rc = aio_read_start(c->dst, r[k].off, r[k].len,
                                 back + (r[k].off - base), &rc_comp[k])) < 0) {
            seterr(msg, msglen, "dr read-back off=%" PRIu64 ": %s", r[k].off,
                   strerror(-rc));
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
                seterr(msg, msglen, "dr extent off=%" PRIu64 " len=%" PRIu64
                       " not zero after write-zeroes", r[k].off, r[k].len);
                ret = SYNC_EVERIFY;
                goto cleanup;
            }
        } else if (!c->osd_verify) {
            if (sync_digest_buf(p, r[k].len, got) < 0) {
                seterr(msg, msglen, "digest failed");
                goto cleanup;
            }
            if (memcmp(sha[k], got, SYNC_DIGEST_LEN) != 0) {
                char hw[SYNC_DIGEST_HEX], hg[SYNC_DIGEST_HEX];

                sync_digest_hex(sha[k], hw);
                sync_digest_hex(got, hg);
                seterr(msg, msglen, "checksum mismatch at dr off=%" PRIu64
                       " len=%" PRIu64 ": sent %s, read back %s", r[k].off,
                       r[k].len, hw, hg);
                ret = SYNC_EVERIFY;
                goto cleanup;
            }
        }
    }
    if (c->osd_verify) {
        ret = osd_verify_group(c, r, m, crc, msg, msglen);
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

static json_t *
progress_event(uint64_t bytes, uint64_t extents, uint64_t offset,
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
                logkv(o, "warn", "msg=\"progress record not saved\" "
                      "error=\"%s\"", perr);
            *warned = 1;
            off = *last_saved;    /* print only what is durable */
        } else {
            *last_saved = off;
        }
    }
    emit(o, progress_event(bytes, ext, off, total, zeroed));
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
static int
copy_all(const struct sync_opts *o, rbd_image_t src, rbd_image_t dst,
         const struct copy *layout,
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
    c.dio = layout->dio;
    memcpy(c.prefix, layout->prefix, sizeof(c.prefix));
    c.order = layout->order;
    c.osd_verify = layout->osd_verify;
    c.absent_is_zero = layout->absent_is_zero;
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
        seterr(err, errlen, "out of memory");
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
    next_report = now_ns() + every;
    while (c.active > 0) {
        struct timespec ts;
        uint64_t t = now_ns(), left = next_report > t ? next_report - t : 0;
        uint64_t off, bytes, ext, zeroed, mbytes, mark;

        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)(left % 1000000000ULL);
        ts.tv_sec += (time_t)(left / 1000000000ULL) + ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&c.cv, &c.mu, &ts);
        if (c.active == 0 || now_ns() < next_report)
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
        next_report = now_ns() + every;
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
        seterr(err, errlen, "%s", c.fail_msg);
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

/*
 * Decide how extents are verified at DR.  OSD-side CRCs need to know which
 * object holds an extent: plain layout (stripe count 1, stripe unit = object
 * size) and a chunk that divides the object size, so no item spans two
 * objects.  Anything else is verified by reading back.
 */
static int
choose_verify(const struct sync_opts *o, rados_ioctx_t dio, rbd_image_t dst,
              struct copy *layout, char *err, size_t errlen)
{
    rbd_image_info_t info;
    uint64_t su = 0, sc = 0, objsize;
    int rc;

    rbd_linked_image_spec_t pimg;
    rbd_snap_spec_t psnap;
    int plain;

    layout->dio = dio;
    layout->osd_verify = 0;
    layout->absent_is_zero = 0;
    if ((rc = rbd_stat(dst, &info, sizeof(info))) < 0 ||
        (rc = rbd_get_stripe_unit(dst, &su)) < 0 ||
        (rc = rbd_get_stripe_count(dst, &sc)) < 0) {
        seterr(err, errlen, "dr: stat %s: %s", o->image, strerror(-rc));
        return -1;
    }
    layout->order = info.order;
    snprintf(layout->prefix, sizeof(layout->prefix), "%s",
             info.block_name_prefix);
    objsize = 1ULL << info.order;
    plain = sc == 1 && su == objsize && objsize % o->chunk == 0 &&
            layout->prefix[0] != '\0';
    /* A clone's missing object reads through to its parent, not zeroes. */
    rc = rbd_get_parent(dst, &pimg, &psnap);
    if (rc == 0) {
        rbd_linked_image_spec_cleanup(&pimg);
        rbd_snap_spec_cleanup(&psnap);
    }
    layout->absent_is_zero = plain && rc == -ENOENT;
    if (o->extent_verify != SYNC_VERIFY_OSD)
        return 0;
    if (plain) {
        layout->osd_verify = 1;
        return 0;
    }
    logkv(o, "info", "msg=\"verifying extents by read-back\" image=%s "
          "stripe_unit=%" PRIu64 " stripe_count=%" PRIu64 " object_size=%"
          PRIu64 " chunk=%" PRIu64, o->image, su, sc, objsize, o->chunk);
    return 0;
}

/* ---- the run --------------------------------------------------------- */

static int
snap_exists(rbd_image_t img, const char *name, int *out, const char *which,
            char *err, size_t errlen)
{
    bool ex = false;
    int rc = rbd_snap_exists(img, name, &ex);

    if (rc < 0) {
        seterr(err, errlen, "%s: snap lookup %s: %s", which, name,
               strerror(-rc));
        return -1;
    }
    *out = ex ? 1 : 0;
    return 0;
}

static json_t *
done_event(const struct sync_opts *o, const struct sync_result *r)
{
    json_t *j = json_pack("{s:s,s:s,s:s?,s:s,s:b,s:b,s:I,s:I,s:I,s:I,s:I,"
                          "s:I,s:I,s:I,s:I,s:I,s:I,s:f}",
                          "event", "done", "image", o->image, "base",
                          r->full ? NULL : o->base, "target", o->target,
                          "full", r->full, "already", r->already,
                          "size", (json_int_t)r->size,
                          "total", (json_int_t)r->total,
                          "bytes_changed", (json_int_t)r->bytes_changed,
                          "bytes_shipped", (json_int_t)r->bytes_shipped,
                          "bytes_zeroed", (json_int_t)r->bytes_zeroed,
                          "bytes_zero_data", (json_int_t)r->bytes_zero_data,
                          "bytes_zero_skipped",
                          (json_int_t)r->bytes_zero_skipped,
                          "bytes_repaired", (json_int_t)r->bytes_repaired,
                          "bytes_shipped_total",
                          (json_int_t)r->bytes_shipped_total,
                          "extents", (json_int_t)r->extents,
                          "resumed_from", (json_int_t)r->resumed_from,
                          "seconds", r->seconds);

    if (j != NULL) {
        static const char *const names[SYNC_PH_COUNT] = {
            "start", "connect", "open", "plan", "copy", "snap", "verify",
            "finish"};
        json_t *ph = json_object();

        for (int i = 0; ph != NULL && i < SYNC_PH_COUNT; i++)
            json_object_set_new(ph, names[i],
                                json_real(((double)(int64_t)(r->phase_ms[i]
                                           * 10.0 + 0.5)) / 10.0));
        json_object_set_new(j, "phase_ms", ph);
    }
    if (j != NULL && !r->already)
        json_object_set_new(j, "extent_verify", json_string(
            r->extent_verify == SYNC_VERIFY_OSD ? "osd-crc32c"
                                                : "readback-sha256"));
    if (j != NULL && r->src_hash[0] != '\0') {
        json_object_set_new(j, "verified_full", json_boolean(r->verified_full));
        json_object_set_new(j, "primary_sha256", json_string(r->src_hash));
        json_object_set_new(j, "dr_sha256", json_string(r->dst_hash));
    }
    return j;
}

/*
 * Hold an flock on "<record>.lock" for the whole run: two runs on one image
 * would interleave writes at DR, and the lock tells a later run that the
 * writer of a record is dead (its flock went with it).
 */
static int
take_run_lock(const char *prog_path, int *fd_out, char *err, size_t errlen)
{
    char path[4200];
    int fd;

    snprintf(path, sizeof(path), "%s.lock", prog_path);
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        seterr(err, errlen, "open %s: %s", path, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        seterr(err, errlen, "another cutpoint-sync is copying this image "
               "(%s is locked)", path);
        close(fd);
        return -1;
    }
    *fd_out = fd;
    return 0;
}

/*
 * A run killed while it held the DR image's exclusive lock leaves the lock
 * to a dead client; librbd would wait for that client's watch to time out
 * (~30 s) before taking it over.  If the owner is the client recorded in
 * our progress record, the writer was a cutpoint-sync on this host whose
 * flock we now hold, so it is dead and its lock can be broken at once.
 * Any other owner (a live QEMU after failover, say) is left alone.
 */
static void
break_stale_lock(const struct sync_opts *o, rbd_image_t dst,
                 const struct sync_progress *rec)
{
    char *owners[8];
    size_t n = 8, i;
    rbd_lock_mode_t mode;
    int rc;

    if (rec->owner[0] == '\0')
        return;
    rc = rbd_lock_get_owners(dst, &mode, owners, &n);
    if (rc < 0)
        return;            /* -ENOENT: nobody holds it */
    for (i = 0; i < n; i++) {
        if (strcmp(owners[i], rec->owner) != 0)
            continue;
        rc = rbd_lock_break(dst, mode, owners[i]);
        logkv(o, rc < 0 ? "warn" : "info", "msg=\"%s stale dr lock of a "
              "killed run\" image=%s owner=%s%s%s", rc < 0 ? "cannot break"
              : "broke", o->image, owners[i], rc < 0 ? " error=" : "",
              rc < 0 ? strerror(-rc) : "");
    }
    rbd_lock_get_owners_cleanup(owners, n);
}

/*
 * OPEN, one site per thread.  A small incremental round spent about half
 * of its time connecting to the two clusters and opening the two images
 * one after the other (each a few round trips to a mon or an OSD of its
 * own cluster).  The two sides do not depend on each other until the DR
 * image has to be created or resized with the primary's size, so each
 * side connects, opens and looks its snapshots up on its own thread, and
 * sync_run judges the results afterwards in the order the serial code
 * did, so the same failure gives the same error.
 */
struct site_prep {
    const struct sync_opts *o;
    struct conn *c;
    const char *base;          /* NULL: no base */
    const struct sync_progress *have;   /* dr: record of a killed run */
    int open;                  /* dr: open the image (not verify-only) */
    int conn_rc;               /* conn_open: 0 or -1 */
    int ret;                   /* SYNC_OK or SYNC_E*: the rest */
    rbd_image_t img;
    int missing;               /* dr: the image does not exist */
    int target_ex, base_ex;
    rbd_image_info_t info;     /* primary: stat at the target */
    uint64_t dsize;            /* dr: current size */
    struct sync_identity ident;   /* dr: id and marker ("" = none yet) */
    char err[512];
};

/* Primary: open the image read-only at the target snapshot. */
static void *
src_prep(void *arg)
{
    struct site_prep *p = arg;
    const struct sync_opts *o = p->o;
    int rc;

    p->ret = SYNC_ERR;
    p->conn_rc = conn_open(&o->src, "primary", o->op_timeout_s, p->c, p->err, sizeof(p->err));
    if (p->conn_rc < 0)
        return NULL;
    rc = rbd_open_read_only(p->c->io, o->image, &p->img, NULL);
    if (rc < 0) {
        p->img = NULL;
        seterr(p->err, sizeof(p->err), "primary: image %s/%s: %s",
               o->src.pool, o->image, strerror(-rc));
        p->ret = rc == -ENOENT ? SYNC_ENOSRC : SYNC_ERR;
        return NULL;
    }
    if (snap_exists(p->img, o->target, &p->target_ex, "primary", p->err,
                    sizeof(p->err)) < 0)
        return NULL;
    if (!p->target_ex) {
        seterr(p->err, sizeof(p->err), "primary: snapshot %s@%s does not "
               "exist", o->image, o->target);
        p->ret = SYNC_ENOSRC;
        return NULL;
    }
    if (p->base != NULL) {
        if (snap_exists(p->img, p->base, &p->base_ex, "primary", p->err,
                        sizeof(p->err)) < 0)
            return NULL;
        if (!p->base_ex) {
            seterr(p->err, sizeof(p->err), "primary: base snapshot %s@%s "
                   "does not exist", o->image, p->base);
            p->ret = SYNC_ENOSRC;
            return NULL;
        }
    }
    if ((rc = rbd_snap_set(p->img, o->target)) < 0 ||
        (rc = rbd_stat(p->img, &p->info, sizeof(p->info))) < 0) {
        seterr(p->err, sizeof(p->err), "primary: open snapshot %s@%s: %s",
               o->image, o->target, strerror(-rc));
        return NULL;
    }
    p->ret = SYNC_OK;
    return NULL;
}

/* DR, once its image is open: stale lock, snapshots, size. */
static int
dst_lookups(struct site_prep *p)
{
    const struct sync_opts *o = p->o;
    uint64_t dr_epoch;
    int rc;

    /* Before anything that writes, a stale lock's break included. */
    rc = sync_fence_check(p->img, o->image, o->epoch, &dr_epoch, p->err,
                          sizeof(p->err));
    if (rc != 0)
        return rc;
    if (p->have != NULL)
        break_stale_lock(o, p->img, p->have);
    if (snap_exists(p->img, o->target, &p->target_ex, "dr", p->err,
                    sizeof(p->err)) < 0)
        return SYNC_ERR;
    if (p->base != NULL &&
        snap_exists(p->img, p->base, &p->base_ex, "dr", p->err,
                    sizeof(p->err)) < 0)
        return SYNC_ERR;
    if ((rc = rbd_get_size(p->img, &p->dsize)) < 0) {
        seterr(p->err, sizeof(p->err), "dr: size of %s: %s", o->image,
               strerror(-rc));
        return SYNC_ERR;
    }
    if (sync_identity_read(p->img, &p->ident, p->err, sizeof(p->err)) < 0)
        return SYNC_ERR;
    return SYNC_OK;
}

/* DR: open the image if it exists (creating it needs the primary). */
static void *
dst_prep(void *arg)
{
    struct site_prep *p = arg;
    const struct sync_opts *o = p->o;
    int rc;

    p->ret = SYNC_ERR;
    p->conn_rc = conn_open(&o->dst, "dr", o->op_timeout_s, p->c, p->err, sizeof(p->err));
    if (p->conn_rc < 0)
        return NULL;
    if (!p->open) {
        p->ret = SYNC_OK;
        return NULL;
    }
    rc = rbd_open(p->c->io, o->image, &p->img, NULL);
    if (rc == -ENOENT) {
        p->img = NULL;
        p->missing = 1;
        p->ret = SYNC_OK;
        return NULL;
    }
    if (rc < 0) {
        p->img = NULL;
        seterr(p->err, sizeof(p->err), "dr: open image %s/%s: %s",
               o->dst.pool, o->image, strerror(-rc));
        return NULL;
    }
    p->ret = dst_lookups(p);
    return NULL;
}

/* Run fn(arg) on a new thread; if none can be started, right here. */
static int
start_or_run(pthread_t *t, void *(*fn)(void *), void *arg)
{
    if (pthread_create(t, NULL, fn, arg) == 0)
        return 1;
    fn(arg);
    return 0;
}

struct diff_job {
    rbd_image_t img;
    const char *from;
    uint64_t size;
    int kind;
    struct sync_extents *l;
    int rc;
    char err[512];
};

static void *
diff_job_run(void *arg)
{
    struct diff_job *j = arg;

    j->rc = collect_diff(j->img, j->from, j->size, j->kind, 0, j->l, "primary",
                         j->err, sizeof(j->err));
    return NULL;
}

/*
 * Closing a site: rbd_close (the DR image also gives its exclusive lock
 * back) and rados_shutdown, a few ms each.  The primary side is closed on
 * a thread of its own, as soon as it is no longer needed.
 */
struct site_close {
    rbd_image_t img;
    struct conn *c;
};

static void *
site_close_run(void *arg)
{
    struct site_close *s = arg;

    if (s->img != NULL)
        rbd_close(s->img);
    s->img = NULL;
    conn_close(s->c);
    return NULL;
}

int
sync_run(const struct sync_opts *o, struct sync_result *r, char *err,
         size_t errlen)
{
    struct conn sc = {0}, dc = {0};
    rbd_image_t src = NULL, dst = NULL, dsnap = NULL;
    struct sync_extents diff = {0}, drift = {0}, work = {0}, items = {0};
    struct sync_progress want, have;
    struct site_prep sp, dp;
    struct diff_job dj;
    struct site_close src_close = {NULL, &sc};
    pthread_t tsp, tdj, tclose;
    char prog_path[4096], perr[512], why[512];
    const char *base = (o->base != NULL && o->base[0] != '\0') ? o->base
                                                              : NULL;
    uint64_t t0 = now_ns(), tph = t0, size = 0, end_offset = 0;
    rbd_image_info_t info;
    struct copy layout;
    size_t first = 0;
    int ret = SYNC_ERR, rc, full, lock_fd = -1, have_rec = 0, joined;
    int closing = 0;           /* tclose runs (or ran) site_close_run */

    memset(r, 0, sizeof(*r));
    memset(&layout, 0, sizeof(layout));
    memset(&sp, 0, sizeof(sp));
    memset(&dp, 0, sizeof(dp));
    if (o->image == NULL || o->target == NULL || o->chunk == 0 ||
        o->workers < 1 || o->rate_mbps < 0) {
        seterr(err, errlen, "invalid options");
        return SYNC_ERR;
    }
    if (sync_progress_path(prog_path, sizeof(prog_path), o->state_dir,
                           o->dst.pool, o->image) < 0) {
        seterr(err, errlen, "progress path too long or invalid pool name");
        return SYNC_ERR;
    }
    if (!o->verify_only && take_run_lock(prog_path, &lock_fd, err,
                                         errlen) < 0)
        return SYNC_ERR;
    rc = sync_progress_load(prog_path, &have, perr, sizeof(perr));
    if (rc == 0) {
        have_rec = 1;
    } else if (rc == -1) {
        logkv(o, "warn", "msg=\"ignoring unreadable progress record\" "
              "path=%s error=\"%s\"", prog_path, perr);
    }
    phase_end(r, SYNC_PH_START, &tph);

    /* CONNECT and OPEN, both sites at once (see struct site_prep). */
    full = base == NULL || o->full_resync;
    sp.o = dp.o = o;
    sp.c = &sc;
    dp.c = &dc;
    sp.base = dp.base = base;
    dp.have = have_rec ? &have : NULL;
    dp.open = !o->verify_only;
    joined = start_or_run(&tsp, src_prep, &sp);
    dst_prep(&dp);
    if (joined)
        pthread_join(tsp, NULL);
    src = sp.img;
    dst = dp.img;
    phase_end(r, SYNC_PH_CONNECT, &tph);
    if (sp.conn_rc < 0 || dp.conn_rc < 0) {
        seterr(err, errlen, "%s", sp.conn_rc < 0 ? sp.err : dp.err);
        goto cleanup;
    }
    if (sp.ret != SYNC_OK) {
        seterr(err, errlen, "%s", sp.err);
        ret = sp.ret;
        goto cleanup;
    }
    info = sp.info;
    size = info.size;
    r->size = size;

    if (o->verify_only) {
        rc = rbd_open_read_only(dc.io, o->image, &dsnap, o->target);
        if (rc < 0) {
            dsnap = NULL;
            seterr(err, errlen, "dr: snapshot %s@%s: %s", o->image,
                   o->target, strerror(-rc));
            goto cleanup;
        }
        ret = hash_both(o, src, dsnap, size, r, err, errlen);
        r->already = 1;
        goto cleanup;
    }

    /* The DR image; it is created only for a full copy. */
    if (dp.missing && !full) {
        seterr(err, errlen, "dr: base snapshot %s@%s is missing at DR "
               "(the image does not exist in pool %s); refusing an "
               "incremental copy; rerun with --full-resync to copy the "
               "whole image", o->image, base, o->dst.pool);
        ret = SYNC_ENOBASE;
        goto cleanup;
    }
    if (dp.missing) {
        int order = (int)info.order;

        rc = rbd_create(dc.io, o->image, size, &order);
        if (rc < 0) {
            seterr(err, errlen, "dr: create image %s/%s: %s", o->dst.pool,
                   o->image, strerror(-rc));
            goto cleanup;
        }
        logkv(o, "info", "msg=\"created dr image\" image=%s size=%" PRIu64
              " order=%d", o->image, size, order);
        rc = rbd_open(dc.io, o->image, &dp.img, NULL);
        if (rc < 0) {
            dp.img = NULL;
            seterr(err, errlen, "dr: open image %s/%s: %s", o->dst.pool,
                   o->image, strerror(-rc));
            goto cleanup;
        }
        dst = dp.img;
        dp.ret = dst_lookups(&dp);
    }
    if (dp.ret != SYNC_OK) {
        seterr(err, errlen, "%s", dp.err);
        ret = dp.ret;
        goto cleanup;
    }
    if (dp.target_ex) {
        /* Idempotence: the snapshot is created only after every extent
         * was verified, so its presence means a completed copy. */
        r->already = 1;
        r->full = full;
        logkv(o, "info", "msg=\"target already at dr\" image=%s target=%s",
              o->image, o->target);
        if (have_rec)
            sync_progress_remove(prog_path, perr, sizeof(perr));
        if (o->verify_full) {
            rc = rbd_open_read_only(dc.io, o->image, &dsnap, o->target);
            if (rc < 0) {
                dsnap = NULL;
                seterr(err, errlen, "dr: open %s@%s: %s", o->image,
                       o->target, strerror(-rc));
                goto cleanup;
            }
            ret = hash_both(o, src, dsnap, size, r, err, errlen);
            goto cleanup;
        }
        ret = SYNC_OK;
        goto cleanup;
    }
    phase_end(r, SYNC_PH_OPEN, &tph);

    /* PLAN */
    if (base != NULL) {
        if (!dp.base_ex && !o->full_resync) {
            seterr(err, errlen, "dr: base snapshot %s@%s is missing at DR "
                   "(pool %s); refusing an incremental copy; rerun with "
                   "--full-resync to copy the whole image", o->image, base,
                   o->dst.pool);
            ret = SYNC_ENOBASE;
            goto cleanup;
        }
        full = !dp.base_ex || o->full_resync;
    }
    r->full = full;
    /* Before the first write, the DR image gets its creation marker if it
     * has none (created just now, by an older cutpoint-sync, or by
     * someone else), so the record can name the image it describes. */
    if (dp.ident.marker[0] == '\0') {
        if (sync_identity_mark(dst, &dp.ident, err, errlen) < 0)
            goto cleanup;
        logkv(o, "info", "msg=\"marked dr image\" image=%s id=%s marker=%s",
              o->image, dp.ident.id, dp.ident.marker);
    }
    if (dp.dsize != size) {
        rc = rbd_resize(dst, size);
        if (rc < 0) {
            seterr(err, errlen, "dr: resize %s to %" PRIu64 ": %s", o->image,
                   size, strerror(-rc));
            goto cleanup;
        }
        logkv(o, "info", "msg=\"resized dr image\" image=%s from=%" PRIu64
              " to=%" PRIu64, o->image, dp.dsize, size);
    }
    if (choose_verify(o, dc.io, dst, &layout, err, errlen) < 0)
        goto cleanup;
    r->extent_verify = layout.osd_verify ? SYNC_VERIFY_OSD
                                         : SYNC_VERIFY_READBACK;

    /* The primary's diff runs on a thread while this one saves the
     * record and lists the drift at DR: different clusters. */
    memset(&dj, 0, sizeof(dj));
    dj.img = src;
    dj.from = full ? NULL : base;
    dj.size = size;
    dj.kind = 0;
    dj.l = &diff;
    joined = start_or_run(&tdj, diff_job_run, &dj);

    /* The record names this copy and our DR client (see break_stale_lock);
     * it is saved before the first write takes the lock.  A record of
     * this very copy keeps its done prefix: we resume from it. */
    rc = sync_progress_set(&want, o->dst.pool, o->image, full ? "" : base,
                           o->target, size, perr, sizeof(perr));
    if (rc == 0) {
        char *addrs = NULL;

        /* librbd names a lock owner by its client address, e.g.
         * "10.77.0.1:0/1261527113" (the nonce makes it unique per run). */
        if (rados_getaddrs(dc.cluster, &addrs) == 0 && addrs != NULL)
            snprintf(want.owner, sizeof(want.owner), "%s", addrs);
        free(addrs);
        want.dr = dp.ident;
        /* The done prefix is skipped only if it was written into this
         * very image: a DR image removed and recreated under the same
         * name holds none of it (sync_identity.h). */
        if (have_rec && sync_progress_resumable(&have, &want, why,
                                                sizeof(why))) {
            want.done_offset = have.done_offset;
            want.bytes = have.bytes;
            want.extents = have.extents;
            r->resumed_from = have.done_offset;
        } else if (have_rec) {
            logkv(o, sync_progress_matches(&have, &want) ? "warn" : "info",
                  "msg=\"progress record discarded, copying from the "
                  "start\" image=%s target=%s done_offset=%" PRIu64
                  " reason=\"%s\"", o->image, o->target, have.done_offset,
                  why);
        }
        if (sync_progress_save(prog_path, &want, perr, sizeof(perr)) < 0)
            logkv(o, "warn", "msg=\"progress record not saved\" "
                  "error=\"%s\"", perr);
        /*
         * Whatever changed at DR since the base (an interrupted run of
         * some other copy, a stray writer) must be put back too: for an
         * incremental copy the primary's target holds the right bytes
         * there; for a full copy anything the primary does not have must
         * read as zeroes.
         */
        rc = collect_diff(dst, full ? NULL : base, size, SYNC_ZERO, 1, &drift,
                          "dr", perr, sizeof(perr));
    }
    if (joined)
        pthread_join(tdj, NULL);
    if (dj.rc < 0) {
        seterr(err, errlen, "%s", dj.err);
        goto cleanup;
    }
    if (rc < 0) {
        seterr(err, errlen, "%s", perr);
        goto cleanup;
    }
    r->bytes_changed = sync_extents_bytes(&diff, 0);
    if (sync_extents_uncovered(&diff, &drift, full ? SYNC_ZERO : SYNC_DATA,
                               &work) < 0) {
        seterr(err, errlen, "out of memory");
        goto cleanup;
    }
    r->bytes_repaired = sync_extents_bytes(&work, 0);
    for (size_t i = 0; i < diff.n; i++) {
        if (sync_extents_add(&work, diff.v[i].off, diff.v[i].len,
                             diff.v[i].kind) < 0) {
            seterr(err, errlen, "out of memory");
            goto cleanup;
        }
    }
    if (sync_extents_normalize(&work) < 0 ||
        sync_extents_split(&work, o->chunk, &items) < 0) {
        seterr(err, errlen, "cannot build the work list");
        goto cleanup;
    }
    r->total = sync_extents_bytes(&items, 0);
    if (r->resumed_from > 0) {
        while (first < items.n &&
               items.v[first].off + items.v[first].len <= r->resumed_from)
            first++;
        logkv(o, "info", "msg=\"resuming\" image=%s target=%s offset=%"
              PRIu64 " skipped_extents=%zu", o->image, o->target,
              r->resumed_from, first);
    }
    emit(o, json_pack("{s:s,s:s,s:s?,s:s,s:s,s:I,s:I,s:I,s:I,s:I}",
                      "event", "start", "image", o->image, "base",
                      full ? NULL : base, "target", o->target, "mode",
                      full ? "full" : "incremental", "size",
                      (json_int_t)size, "total", (json_int_t)r->total,
                      "bytes_changed", (json_int_t)r->bytes_changed,
                      "extents", (json_int_t)items.n, "resume_offset",
                      (json_int_t)r->resumed_from));
    phase_end(r, SYNC_PH_PLAN, &tph);

    /* COPY */
    ret = copy_all(o, src, dst, &layout, items.v + first, items.n - first,
                   r->total, prog_path, &want, r, &end_offset, err, errlen);
    phase_end(r, SYNC_PH_COPY, &tph);
    if (ret != SYNC_OK)
        goto cleanup;
    ret = SYNC_ERR;
    /* Without --verify-full the primary is done with: close it while
     * the DR snapshot is taken. */
    if (!o->verify_full) {
        src_close.img = src;
        src = NULL;
        closing = start_or_run(&tclose, site_close_run, &src_close);
    }

    /* SNAP: only now may the DR snapshot exist. */
    if ((rc = rbd_flush(dst)) < 0) {
        seterr(err, errlen, "dr: flush %s: %s", o->image, strerror(-rc));
        goto cleanup;
    }
    if ((rc = rbd_snap_create(dst, o->target)) < 0) {
        seterr(err, errlen, "dr: create snapshot %s@%s: %s", o->image,
               o->target, strerror(-rc));
        goto cleanup;
    }
    /* The copy is complete and durable (the snapshot is its marker):
     * the final progress event (see copy_all). */
    emit(o, progress_event(r->bytes_shipped, r->extents, end_offset,
                           r->total, r->bytes_zeroed));
    phase_end(r, SYNC_PH_SNAP, &tph);

    /* VERIFY */
    if (o->verify_full) {
        rc = rbd_open_read_only(dc.io, o->image, &dsnap, o->target);
        if (rc < 0) {
            dsnap = NULL;
            seterr(err, errlen, "dr: open %s@%s: %s", o->image, o->target,
                   strerror(-rc));
            rbd_snap_remove(dst, o->target);
            goto cleanup;
        }
        ret = hash_both(o, src, dsnap, size, r, err, errlen);
        if (ret != SYNC_OK) {
            /* Never leave a snapshot at DR that failed verification. */
            rbd_close(dsnap);
            dsnap = NULL;
            rc = rbd_snap_remove(dst, o->target);
            if (rc < 0)
                logkv(o, "error", "msg=\"cannot remove unverified dr "
                      "snapshot\" image=%s target=%s error=\"%s\"", o->image,
                      o->target, strerror(-rc));
            goto cleanup;
        }
    }
    phase_end(r, SYNC_PH_VERIFY, &tph);
    if (sync_progress_remove(prog_path, perr, sizeof(perr)) < 0)
        logkv(o, "warn", "msg=\"progress record not removed\" error=\"%s\"",
              perr);
    phase_end(r, SYNC_PH_FINISH, &tph);
    ret = SYNC_OK;
cleanup:
    /* Success paths (copied, already there, verify-only) end here too. */
    r->seconds = (double)(now_ns() - t0) / 1e9;
    if (ret == SYNC_OK)
        emit(o, done_event(o, r));
    tph = now_ns();
    /* The two sites close in parallel (the primary may be closing
     * already). */
    if (!closing) {
        src_close.img = src;
        closing = start_or_run(&tclose, site_close_run, &src_close);
    }
    src = NULL;
    if (dsnap != NULL)
        rbd_close(dsnap);
    if (dst != NULL)
        rbd_close(dst);
    conn_close(&dc);
    if (closing)
        pthread_join(tclose, NULL);
    if (lock_fd >= 0)
        close(lock_fd);
    sync_extents_clear(&diff);
    sync_extents_clear(&drift);
    sync_extents_clear(&work);
    sync_extents_clear(&items);
    r->teardown_ms = (double)(now_ns() - tph) / 1e6;
    r->seconds = (double)(now_ns() - t0) / 1e9;
    return ret;
}
