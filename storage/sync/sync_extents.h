/*
 * sync_extents: the work list of cutpoint-sync.
 *
 * An extent is a byte range of the image plus what to do with it at DR:
 * copy data from the primary snapshot (SYNC_DATA) or make it read as
 * zeroes (SYNC_ZERO, for ranges that diff-iterate reports as discarded).
 * The list is built from the primary's diff, united with ranges that
 * drifted at DR, then split at aligned chunk boundaries so that every
 * run builds the same list from the same snapshots.  That determinism is
 * what lets a progress record name "everything below offset X is done".
 */
#ifndef CUTPOINT_SYNC_EXTENTS_H
#define CUTPOINT_SYNC_EXTENTS_H

#include <stddef.h>
#include <stdint.h>

enum sync_kind {
    SYNC_DATA = 1,
    SYNC_ZERO = 2,
};

struct sync_extent {
    uint64_t off;
    uint64_t len;
    int kind;
};

struct sync_extents {
    struct sync_extent *v;
    size_t n;
    size_t cap;
};

/* Append one extent (len 0 is ignored); 0 or -1 (out of memory). */
int sync_extents_add(struct sync_extents *l, uint64_t off, uint64_t len,
                     int kind);

/*
 * Sort by offset and merge extents that touch or overlap and have the same
 * kind.  Overlapping extents of different kinds are an error (-1): the
 * primary's diff never reports them, so seeing one means a bug.
 */
int sync_extents_normalize(struct sync_extents *l);

/*
 * Append to out, with kind `kind`, every part of `extra` that no extent of
 * `base` covers.  Both inputs must be normalized.  0 or -1.
 */
int sync_extents_uncovered(const struct sync_extents *base,
                           const struct sync_extents *extra, int kind,
                           struct sync_extents *out);

/*
 * Append to out the extents of in, cut so that no piece crosses a multiple
 * of chunk (chunk > 0).  0 or -1.
 */
int sync_extents_split(const struct sync_extents *in, uint64_t chunk,
                       struct sync_extents *out);

/*
 * Append to out the extent [off, off+len) whose bytes are buf, cut into
 * runs: SYNC_ZERO where a whole block reads as zeroes, SYNC_DATA elsewhere.
 * Blocks are aligned to multiples of block in image offsets (the first and
 * last may be partial); adjacent runs of one kind are merged.  Why: Ceph's
 * diff reports an object created after the base snapshot as changed from
 * its start to its end, holes included, so a few scattered writes into a
 * sparse image look like whole objects; only the non-zero blocks need to
 * cross the wire.  block > 0.  0 or -1.
 */
int sync_extents_add_runs(struct sync_extents *out, const char *buf,
                          uint64_t off, uint64_t len, uint64_t block);

/* Total length of the extents of one kind (kind 0: all kinds). */
uint64_t sync_extents_bytes(const struct sync_extents *l, int kind);

/* Release the array; the struct may be reused.  NULL-safe. */
void sync_extents_clear(struct sync_extents *l);

#endif
