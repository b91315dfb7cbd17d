/*
 * sync_copy: COPY, the work list from the primary snapshot to the DR
 * image, by o->workers threads.
 *
 *   worker ── claim the next chunk (one DR object) ── copy_group:
 *             read every extent ── cut zero blocks ── checksum ── rate
 *             limit ── write (data or zeroes) ── verify (sync_verify.h)
 *   main ──── every progress interval: save the done prefix, then print
 *             it (a printed offset is always durable)
 */
#ifndef CUTPOINT_SYNC_COPY_H
#define CUTPOINT_SYNC_COPY_H

#include <jansson.h>
#include <rbd/librbd.h>
#include <stddef.h>
#include <stdint.h>

#include "sync_engine.h"
#include "sync_extents.h"
#include "sync_progress.h"
#include "sync_verify.h"

/*
 * Copy items[0..n) (total: the bytes of the whole work list) from src to
 * dst, verified as layout says, saving prog at prog_path as the done
 * prefix grows (prog's done_offset, bytes and extents are those carried
 * over from a resumed run).  Fills r's byte counts, and *end_offset with
 * the done prefix reached.  Returns SYNC_OK, or SYNC_ERR / SYNC_EVERIFY
 * with a message in err (the done prefix then saved and printed).  On
 * success the last progress event is the caller's to print, once the DR
 * snapshot exists (sync_copy_progress_event).
 */
int sync_copy_all(const struct sync_opts *o, rbd_image_t src, rbd_image_t dst,
                  const struct sync_layout *layout,
                  const struct sync_extent *items, size_t n, uint64_t total,
                  const char *prog_path, struct sync_progress *prog,
                  struct sync_result *r, uint64_t *end_offset, char *err,
                  size_t errlen);

/* The "progress" event (docs/replication.md); a new reference. */
json_t *sync_copy_progress_event(uint64_t bytes, uint64_t extents,
                                 uint64_t offset, uint64_t total,
                                 uint64_t zeroed);

#endif
