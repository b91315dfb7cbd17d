#include "sync_verify.h"

#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sync_util.h"

#define HASH_QUEUE 8   /* aio reads in flight while hashing an image */

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
        sync_seterr(j->err, sizeof(j->err), "hash: out of memory");
        goto cleanup;
    }
    for (k = 0; k < HASH_QUEUE; k++) {
        buf[k] = malloc(j->chunk);
        if (buf[k] == NULL) {
            sync_seterr(j->err, sizeof(j->err), "hash: out of memory");
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
                sync_seterr(j->err, sizeof(j->err), "hash: completion: %s",
                            strerror(-rc));
                goto cleanup;
            }
            rc = rbd_aio_read(j->img, sub, len[k], buf[k], comp[k]);
            if (rc < 0) {
                rbd_aio_release(comp[k]);
                comp[k] = NULL;
                sync_seterr(j->err, sizeof(j->err), "hash: read at %" PRIu64
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
            sync_seterr(j->err, sizeof(j->err), "hash: read at %" PRIu64 ": %s",
                        got, rc < 0 ? strerror(-rc) : "short read");
            goto cleanup;
        }
        if (sync_hash_update(h, buf[k], len[k]) < 0) {
            sync_seterr(j->err, sizeof(j->err), "hash: digest failed");
            goto cleanup;
        }
        got += len[k];
    }
    if (sync_hash_final(h, j->digest) < 0) {
        sync_seterr(j->err, sizeof(j->err), "hash: digest failed");
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
int
sync_verify_hash_both(const struct sync_opts *o, rbd_image_t src,
                      rbd_image_t dst, uint64_t size, struct sync_result *r,
                      char *err, size_t errlen)
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
        sync_seterr(err, errlen, "%s: %s", js.rc < 0 ? "primary" : "dr",
                    js.rc < 0 ? js.err : jd.err);
        return SYNC_ERR;
    }
    sync_digest_hex(js.digest, r->src_hash);
    sync_digest_hex(jd.digest, r->dst_hash);
    if (memcmp(js.digest, jd.digest, SYNC_DIGEST_LEN) != 0) {
        sync_seterr(err, errlen, "full-image hash mismatch for %s@%s: "
                    "primary %s, dr %s", o->image, o->target, r->src_hash,
                    r->dst_hash);
        return SYNC_EVERIFY;
    }
    r->verified_full = 1;
    return SYNC_OK;
}

/* Checksum sub-operations per rados read op (one round trip each). */
#define CRC_BATCH 64

/*
 * Ask the DR OSD for the CRC-32C of what it now stores for the DATA
 * extents of one group (all in one object: the chunk divides the object
 * size), CRC_BATCH ranges per round trip, and compare with what was sent.
 */
int
sync_verify_osd_group(const struct sync_layout *lay,
                      const struct sync_extent *e, size_t n,
                      const uint32_t *want, char *msg, size_t msglen)
{
    char oid[RBD_MAX_BLOCK_NAME_SIZE + 24], out[CRC_BATCH][8];
    int prval[CRC_BATCH];
    size_t idx[CRC_BATCH];
    uint32_t seed = htole32(SYNC_CRC_SEED), count, v;
    uint64_t objmask = (1ULL << lay->order) - 1;
    size_t i = 0, k, m;
    int rc;

    snprintf(oid, sizeof(oid), "%s.%016" PRIx64, lay->prefix,
             e[0].off >> lay->order);
    while (i < n) {
        rados_read_op_t op = rados_create_read_op();

        if (op == NULL) {
            sync_seterr(msg, msglen, "out of memory");
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
        rc = m > 0 ? rados_read_op_operate(op, lay->dio, oid, 0) : 0;
        rados_release_read_op(op);
        if (rc < 0) {
            sync_seterr(msg, msglen, "dr checksum of %s: %s", oid,
                        strerror(-rc));
            return SYNC_ERR;
        }
        for (k = 0; k < m; k++) {
            const struct sync_extent *x = &e[idx[k]];

            memcpy(&count, out[k], 4);
            memcpy(&v, out[k] + 4, 4);
            if (prval[k] < 0 || le32toh(count) != 1) {
                sync_seterr(msg, msglen, "dr checksum of %s off=%" PRIu64
                            ": %s", oid, x->off, prval[k] < 0
                            ? strerror(-prval[k]) : "unexpected reply");
                return SYNC_ERR;
            }
            if (le32toh(v) != want[idx[k]]) {
                sync_seterr(msg, msglen, "checksum mismatch at dr off=%"
                            PRIu64 " len=%" PRIu64 ": sent crc32c %08x, dr "
                            "osd has %08x", x->off, x->len, want[idx[k]],
                            le32toh(v));
                return SYNC_EVERIFY;
            }
        }
    }
    return SYNC_OK;
}

/*
 * Decide how extents are verified at DR.  OSD-side CRCs need to know which
 * object holds an extent: plain layout (stripe count 1, stripe unit = object
 * size) and a chunk that divides the object size, so no item spans two
 * objects.  Anything else is verified by reading back.
 */
int
sync_verify_choose(const struct sync_opts *o, rados_ioctx_t dio,
                   rbd_image_t dst, struct sync_layout *layout, char *err,
                   size_t errlen)
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
        sync_seterr(err, errlen, "dr: stat %s: %s", o->image, strerror(-rc));
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
    sync_logkv(o, "info", "msg=\"verifying extents by read-back\" image=%s "
               "stripe_unit=%" PRIu64 " stripe_count=%" PRIu64
               " object_size=%" PRIu64 " chunk=%" PRIu64, o->image, su, sc,
               objsize, o->chunk);
    return 0;
}
