/*
 * sync_conn: one cluster connection of cutpoint-sync (a rados client and
 * an I/O context on the site's pool), with the client settings a copy
 * relies on, and the closing of a site.
 */
#ifndef CUTPOINT_SYNC_CONN_H
#define CUTPOINT_SYNC_CONN_H

#include <rados/librados.h>
#include <rbd/librbd.h>
#include <stddef.h>

#include "sync_engine.h"

struct sync_conn {
    rados_t cluster;
    rados_ioctx_t io;
    int connected;
    int borrowed;      /* cluster belongs to a serve session (sync_serve.h):
                          closing gives back the I/O context only */
};

/*
 * Connect to site s (named `which` in messages: "primary" or "dr") and
 * open its pool; every mon and OSD request is bounded by op_timeout_s.
 * Returns 0, or -1 with a message in err; c is closed by sync_conn_close
 * either way.
 */
int sync_conn_open(const struct sync_site *s, const char *which,
                   int op_timeout_s, struct sync_conn *c, char *err,
                   size_t errlen);

/*
 * Open pool s->pool on the connected cluster of `from` (a serve session's
 * connection, owned by the session): no new mon or OSD session, only an
 * I/O context.  Returns 0, or -1 with a message in err; c is closed by
 * sync_conn_close either way, which leaves the cluster connected.
 */
int sync_conn_borrow(const struct sync_conn *from, const struct sync_site *s,
                     const char *which, struct sync_conn *c, char *err,
                     size_t errlen);

/* Open site s for a run: borrowed from `shared` if not NULL (a serve
 * session), else a connection of its own (sync_conn_open). */
int sync_conn_for_run(const struct sync_conn *shared,
                      const struct sync_site *s, const char *which,
                      int op_timeout_s, struct sync_conn *c, char *err,
                      size_t errlen);

/* Shut c down (a no-op for a closed or never opened one); a borrowed
 * cluster stays connected. */
void sync_conn_close(struct sync_conn *c);

/*
 * Closing a site: rbd_close (the DR image also gives its exclusive lock
 * back) and rados_shutdown, a few ms each, so a run closes its two sites
 * in parallel, with sync_site_close_run on a thread of its own.
 */
struct sync_site_close {
    rbd_image_t img;           /* NULL: no image open */
    struct sync_conn *c;
};

/* Close s->img (if any) and s->c; a pthread start routine. */
void *sync_site_close_run(void *arg);

#endif
