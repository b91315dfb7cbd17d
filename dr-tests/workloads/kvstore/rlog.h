/*
 * rlog: an append-only record log in a fixed region of a raw disk.
 *
 * On-disk layout (all little-endian), region = [base, base + size):
 *
 *   region = half 0 [ | half 1 ]          (1 or 2 halves)
 *   half   = header (512 bytes) | record | record | ... | garbage
 *   header = u32 magic 'CPHL' | u32 gen | u32 nonce | u32 crc32(12 bytes)
 *   record = u32 magic 'CPRC' | u32 nonce | u32 len | u32 crc | payload,
 *            padded with zeros to a multiple of 8 bytes;
 *            crc = crc32(nonce, len, payload)
 *
 * The live half is the one with a valid header and the highest gen.
 * Replay stops at the first record whose magic, nonce or crc does not
 * match: that is the torn tail.  The nonce is random per header, so
 * records left over from an earlier use of the same half (or from an
 * interrupted compaction) can never validate.
 *
 * Compaction (two halves only) is the raw-disk form of
 * "write temp file, fsync, rename, fsync directory":
 *
 *   BEGIN ---add*---> records written to the other half (the "temp file")
 *     |                    |
 *     |               COMMIT: sync (fsync temp) -> write new header with
 *     |                       gen+1 (rename) -> sync (fsync directory)
 *     v
 *   a crash anywhere before the header sync leaves the old half live.
 */
#ifndef RLOG_H
#define RLOG_H

#include <stddef.h>
#include <stdint.h>

#include "wl.h"

#define RLOG_HDR 512
#define RLOG_REC_HDR 16
#define RLOG_FULL (-2)

struct rlog {
    struct wl_dev *dev;
    uint64_t base, size, half;
    int nhalves;
    int cur;                  /* live half */
    uint32_t gen, nonce;
    uint64_t tail;            /* absolute offset of the next record */
    /* compaction in progress */
    int compacting;
    uint32_t cnonce;
    uint64_t ctail;
};

typedef int (*rlog_cb)(void *arg, const uint8_t *payload, uint32_t len);

/*
 * Opens the log, formatting it when no half has a valid header, and
 * calls cb for every valid record in order.  cb returning -1 aborts.
 */
int rlog_open(struct rlog *l, struct wl_dev *dev, uint64_t base,
              uint64_t size, int nhalves, rlog_cb cb, void *arg);
/* Appends without syncing.  Returns RLOG_FULL when the half is full. */
int rlog_append(struct rlog *l, const void *payload, uint32_t len);
int rlog_sync(struct rlog *l);
/* Bytes used in the live half, as a fraction of it (0..1). */
double rlog_fill(const struct rlog *l);

int rlog_compact_begin(struct rlog *l);
int rlog_compact_add(struct rlog *l, const void *payload, uint32_t len);
int rlog_compact_commit(struct rlog *l);

#endif
