/*
 * sync_verify: how cutpoint-sync proves that DR holds what the primary
 * has.
 *
 *   per extent ── the layout of the DR image decides the method
 *                 (sync_verify_choose): the CRC-32C that the DR OSD
 *                 computes of what it stored (sync_verify_osd_group), or,
 *                 for any other layout, a read-back (sync_copy.c);
 *   whole image ─ --verify-full / --verify-only: SHA-256 of both
 *                 snapshots, read at once (sync_verify_hash_both).
 */
#ifndef CUTPOINT_SYNC_VERIFY_H
#define CUTPOINT_SYNC_VERIFY_H

#include <rados/librados.h>
#include <rbd/librbd.h>
#include <stddef.h>
#include <stdint.h>

#include "sync_engine.h"
#include "sync_extents.h"

/* Seed Ceph uses for CRC-32C checksums (little-endian u32 on the wire). */
#define SYNC_CRC_SEED 0xffffffffu

/* Where the DR image keeps its data, and what that allows. */
struct sync_layout {
    rados_ioctx_t dio;         /* DR pool, for OSD-side checksums */
    char prefix[RBD_MAX_BLOCK_NAME_SIZE];   /* DR data object prefix */
    int order;                 /* DR object size = 1 << order */
    int osd_verify;            /* SYNC_VERIFY_OSD in effect */
    int absent_is_zero;        /* plain layout, no parent: a missing DR
                                  object reads as zeroes */
};

/*
 * Fill layout for the open DR image dst in pool dio and decide how its
 * extents are verified (o->extent_verify is a wish: a layout the OSD
 * cannot sum falls back to read-back, logged).  Returns 0, or -1 with a
 * message in err.
 */
int sync_verify_choose(const struct sync_opts *o, rados_ioctx_t dio,
                       rbd_image_t dst, struct sync_layout *layout,
                       char *err, size_t errlen);

/*
 * Compare the CRC-32C the DR OSD has for each DATA extent of e[0..n) (one
 * object of layout: a group of sync_copy.c) with want[i], the CRC of the
 * bytes sent.  Returns SYNC_OK, SYNC_EVERIFY on a mismatch or SYNC_ERR,
 * with a message in msg.
 */
int sync_verify_osd_group(const struct sync_layout *layout,
                          const struct sync_extent *e, size_t n,
                          const uint32_t *want, char *msg, size_t msglen);

/*
 * SHA-256 of the whole snapshots src and dst (size bytes, read o->chunk at
 * a time), one thread each.  Sets r->src_hash, r->dst_hash and, when they
 * are equal, r->verified_full.  Returns SYNC_OK, SYNC_EVERIFY on a
 * mismatch or SYNC_ERR, with a message in err.
 */
int sync_verify_hash_both(const struct sync_opts *o, rbd_image_t src,
                          rbd_image_t dst, uint64_t size,
                          struct sync_result *r, char *err, size_t errlen);

#endif
