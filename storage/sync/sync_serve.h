/*
 * sync_serve: `cutpoint-sync --serve`, one process for many copies.
 *
 * A copy's fixed cost was mostly not copying: process start (~12 ms), the
 * two cluster connections (a bootstrap mon session for the config, a mon
 * session and the OSD sessions at each site: 20-35 ms in parallel) and
 * their teardown (4-6 ms), paid again for every image of every group
 * snapshot.  A serve session connects to both sites once and then runs
 * one copy per request line read from stdin, each exactly as a one-shot
 * run (sync_run: its run lock, progress record, fencing and identity
 * checks, rate limit, per-extent verification, the DR snapshot last),
 * borrowing the session's connections with I/O contexts of its own on the
 * request's pools.
 *
 *   START ── connect primary ║ connect DR ── fail: error event, exit 1
 *     │         ("ready" event with connect_ms)
 *     v
 *   READ ──── one line from stdin ─── EOF ──> shut down, exit 0
 *     │  ^
 *     │  └─── bad request: error event with exit 2, next line
 *     v
 *   RUN ───── sync_run; every event of the run carries the request's
 *     │       "id" (if given) and "image"
 *     v
 *   END ───── the done event, or an error event with the exit code the
 *             one-shot run would have exited with; back to READ
 *
 * A request (JSON object, one line; unknown keys are refused):
 *   {"id": "m1", "image": "vm1-disk0", "snap": "cp.g.7", "base": "cp.g.6",
 *    "src_pool": "rbd", "dst_pool": "rbd", "epoch": 3, "rate_mbps": 50,
 *    "verify_full": false, "full_resync": false}
 * image and snap are required; the pools default to the session's
 * --src-pool/--dst-pool, the rest to the session's options.  The op
 * timeout and the client settings are the session's (one connection).
 */
#ifndef CUTPOINT_SYNC_SERVE_H
#define CUTPOINT_SYNC_SERVE_H

#include <jansson.h>
#include <stdio.h>

#include "sync_engine.h"

/* The process exit code of a sync_run result (docs/replication.md). */
int sync_exit_code(int rc);

/*
 * The error event of a failed run or request: event, exit, [id], image,
 * target, message (NULL strings are left out).  The caller owns it.
 */
json_t *sync_error_event(int code, const char *id, const char *image,
                         const char *target, const char *message);

/*
 * Parse one request line over the session's options `base` into o.  On
 * success returns the parsed request (o's strings point into it: the
 * caller keeps it until the run is over, then json_decref) and *bad is
 * NULL; on a bad request returns NULL with *bad set to a static message
 * (and *id_out to the request's id if one could be read, else NULL;
 * valid until the next call).
 */
json_t *sync_serve_parse(const char *line, const struct sync_opts *base,
                         struct sync_opts *o, const char **bad,
                         const char **id_out);

/*
 * Run a serve session: connect both sites of `base` (its on_event and
 * on_log receive everything), then one copy per line of `in` until EOF.
 * Returns 0 at EOF, -1 if a site could not be connected (after its error
 * event).  A failed copy is reported by its error event, not here.
 */
int sync_serve(const struct sync_opts *base, FILE *in);

#endif
