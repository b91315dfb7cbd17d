/*
 * sync_lock: the locks of one cutpoint-sync run on one image.
 *
 *   run lock ─── an flock on "<record>.lock" held for the whole run: two
 *                runs on one image would interleave writes at DR, and the
 *                lock tells a later run that the writer of a record is
 *                dead (its flock went with it);
 *   stale lock ─ the DR image's exclusive lock left by a run that was
 *                killed while it held it, broken only while we hold the
 *                run lock.
 */
#ifndef CUTPOINT_SYNC_LOCK_H
#define CUTPOINT_SYNC_LOCK_H

#include <rbd/librbd.h>
#include <stddef.h>

#include "sync_engine.h"
#include "sync_progress.h"

/*
 * Take the run lock of the record prog_path without waiting.  Returns 0
 * with the lock's descriptor in *fd_out (closing it releases the lock),
 * or -1 with a message in err (held by another run, or not openable).
 */
int sync_lock_take(const char *prog_path, int *fd_out, char *err,
                   size_t errlen);

/*
 * A run killed while it held the DR image's exclusive lock leaves the lock
 * to a dead client; librbd would wait for that client's watch to time out
 * (~30 s) before taking it over.  If the owner is the client recorded in
 * rec, the record of the run before us, the writer was a cutpoint-sync on
 * this host whose run lock we now hold, so it is dead and its lock is
 * broken at once (logged).  Any other owner (a live QEMU after failover,
 * say) is left alone.
 */
void sync_lock_break_stale(const struct sync_opts *o, rbd_image_t dst,
                           const struct sync_progress *rec);

#endif
