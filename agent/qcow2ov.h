/*
 * qcow2ov: whether a redirect overlay (a qcow2 image that QEMU formatted
 * on an RBD image, redirect.c) holds any guest write, read without QEMU.
 *
 * An overlay is made empty: a qcow2 header and an L1 table of zeros.  The
 * first write of the guest to a cluster, data or zeroes, allocates an L2
 * table and sets its L1 entry, so "no L1 entry set" is "no guest write
 * reached it" (as QEMU itself would find on reopening it).  An image that
 * was never formatted (QEMU gone before blockdev-create wrote the header)
 * reads as zeros and holds none either.  Anything else that is not a
 * plain qcow2 header (another magic, an L1 table outside the image, an
 * absurd size) is -1: unknown, so the caller keeps the image.
 *
 *   header (104 bytes, big-endian): magic 'QFI\xfb' @0, version @4,
 *   cluster_bits @20, size @24, crypt_method @32, l1_size @36,
 *   l1_table_offset @40; an L1 entry's bits 9-55 are its L2 table's offset.
 */
#ifndef CP_QCOW2OV_H
#define CP_QCOW2OV_H

#include <stddef.h>
#include <stdint.h>

/* Reads len bytes at off into buf: 0, or -1 with err. */
typedef int (*qcow2ov_read_fn)(void *ctx, uint64_t off, size_t len,
                               void *buf, char *err, size_t errlen);

/* Sets *written to 1 when the overlay read through rd (image_size bytes
 * long) holds a guest write, 0 when it holds none; -1 with err when that
 * cannot be told (a read failed, or it is no qcow2 image QEMU made). */
int qcow2ov_written(qcow2ov_read_fn rd, void *ctx, uint64_t image_size,
                    int *written, char *err, size_t errlen);

#endif
