/*
 * lvcache: the domains libvirtd has, as the agent last saw them -- the
 * libvirt driver's live inventory.  Part of the libvirt driver
 * (vm_libvirt.c); lvconn.c owns one and feeds it.
 *
 *   (re)connect ─► lvcache_resync: the next work is a full sync
 *                  (virConnectListAllDomains, then each domain's state and
 *                  XML)
 *   event      ─► lvcache_event (libvirt's event loop thread): the state
 *                  the event implies at once, and a refresh of that domain
 *                  queued (its state; its XML on define and start)
 *   manager    ─► lvcache_work: one queued piece of work, its calls
 *                  through lvcall (deadline)
 *
 * generation changes with every change of a domain; events counts the
 * lifecycle events received.  Thread-safe.
 */
#ifndef CP_LVCACHE_H
#define CP_LVCACHE_H

#include <libvirt/libvirt.h>

#include "domxml.h"
#include "lvcall.h"

/* One domain as the cache last saw it. */
struct lvdom {
    char uuid[40];
    char name[256];
    int state;              /* virDomainState */
    int active, persistent;
    int have_xml;           /* xml below was parsed from its XML */
    struct domxml xml;
    char xml_error[200];    /* why its XML did not parse, "" if it did */
};

struct lvcache;

/* wake(opaque) is called when work was queued (from any thread). */
struct lvcache *lvcache_new(void (*wake)(void *opaque), void *opaque);
void lvcache_free(struct lvcache *k);

/* A lifecycle event of dom (virDomainEventType, its detail). */
void lvcache_event(struct lvcache *k, virDomainPtr dom, int event,
                   int detail);
/* Queues a refresh of the domain named name. */
void lvcache_refresh(struct lvcache *k, const char *name);
/* The next work is a full sync; until it is done the cache is unsynced. */
void lvcache_resync(struct lvcache *k);
/* 1 when work is queued. */
int lvcache_pending(struct lvcache *k);
/* 1 when the last full sync is complete (since the last resync). */
int lvcache_synced(struct lvcache *k);
/*
 * Does the next queued work on conn, each call through slot within
 * timeout_ms.  0 done (or nothing to do), -1 failed (the work stays
 * queued; the message is logged).
 */
int lvcache_work(struct lvcache *k, struct lvcall_slot *slot,
                 virConnectPtr conn, int timeout_ms);

long lvcache_generation(struct lvcache *k);
long lvcache_events(struct lvcache *k);

/* The domain named name: 0 and *out, or -1 when the cache has none. */
int lvcache_find(struct lvcache *k, const char *name, struct lvdom *out);
/* A copy of every domain (*out, free() it); the count. */
int lvcache_list(struct lvcache *k, struct lvdom **out);

/* "running", "paused", "shutoff" or "unknown" for a virDomainState. */
const char *lvcache_state_name(int state);

#endif
