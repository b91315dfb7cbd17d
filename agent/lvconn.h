/*
 * lvconn: the agent's connection to libvirtd.  Part of the libvirt driver
 * (vm_libvirt.c).
 *
 * One thread (the manager) owns the connection and feeds the domain cache
 * (lvcache.c, the live inventory):
 *
 *     DOWN (inventory stale) ◄───────────── closed (keepalive, EOF, error)
 *      │  ▲ open failed: retry after 500 ms doubling to 30 s   ▲
 *      ▼  │                                                    │
 *     open, keepalive, close callback, lifecycle events ─► UP ─┘
 *                                                          │ full sync done:
 *                                                          ▼ inventory fresh
 *                                    lifecycle event ─► refresh that domain
 *
 * - libvirt's default event loop runs in a thread of its own (one per
 *   process, registered before the first connection); it delivers
 *   keepalive and the domain lifecycle events.
 * - Keepalive: a libvirtd that stops answering closes the connection after
 *   about LVCONN_KEEPALIVE_INTERVAL_S * (LVCONN_KEEPALIVE_COUNT + 1) s,
 *   which also ends every call still waiting on it.
 * - Every call the manager makes has a deadline (lvcall.c), the open too.
 * - generation changes with every change of the cache or of the
 *   connection's state, so a poller can tell "nothing changed" cheaply.
 *
 * All functions are thread-safe; none blocks on libvirt.
 */
#ifndef CP_LVCONN_H
#define CP_LVCONN_H

#include <libvirt/libvirt.h>

#include "lvcache.h"

#define LVCONN_KEEPALIVE_INTERVAL_S 1
#define LVCONN_KEEPALIVE_COUNT 3

struct lvconn;

struct lvconn_status {
    int connected;          /* up and synced: the cache is fresh */
    long epoch;             /* connections made so far (the current one) */
    double since;           /* mono_ms of the last change of connected */
    long generation;
    long events;            /* domain lifecycle events received */
    char error[256];        /* why it is not connected, "" when it is */
};

/* Starts the manager, which connects to uri in the background.
 * call_timeout_ms bounds each of its libvirt calls.  NULL if out of
 * memory or a thread cannot start. */
struct lvconn *lvconn_new(const char *uri, int call_timeout_ms);
/* Stops the manager (waits at most 2 s; one stuck in a call is left, and
 * so is the connection, as the process is ending). */
void lvconn_free(struct lvconn *c);

/* 0 when connected and synced; -1 with the reason otherwise. */
int lvconn_ready(struct lvconn *c, char *err, size_t errlen);
void lvconn_status(struct lvconn *c, struct lvconn_status *st);

/* A new reference to the connection while it is up (release it with
 * virConnectClose), or NULL; *epoch (may be NULL): its epoch. */
virConnectPtr lvconn_get(struct lvconn *c, long *epoch);

/* The domains (lvcache_find, lvcache_list, lvcache_refresh). */
struct lvcache *lvconn_cache(struct lvconn *c);

/* fn(opaque) is called (from the manager thread, without locks held)
 * after each change of generation. */
void lvconn_watch(struct lvconn *c, void (*fn)(void *opaque), void *opaque);

#endif
