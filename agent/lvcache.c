/* lvcache: see lvcache.h. */
#include "lvcache.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libvirt/virterror.h>

#include "log.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#define QUEUE_MAX 128

struct pending {
    int by_name;            /* key is a name, else a UUID string */
    int want_xml;
    unsigned long seq;      /* bumped by each request: one that comes
                               while a refresh runs asks for another */
    char key[256];
};

struct lvcache {
    pthread_mutex_t mu;             /* guards everything below */
    struct lvdom *doms;
    int ndoms, cap;
    long generation, events;
    int synced, full_sync;
    struct pending queue[QUEUE_MAX];
    int nqueue;
    unsigned long seq;
    void (*wake)(void *opaque);
    void *opaque;
};

const char *
lvcache_state_name(int state)
{
    switch (state) {
    case VIR_DOMAIN_RUNNING:
        return "running";
    case VIR_DOMAIN_PAUSED:
        return "paused";
    case VIR_DOMAIN_SHUTOFF:
        return "shutoff";
    default:
        return "unknown";
    }
}

/* ---- the table (k->mu held) -------------------------------------------- */

static struct lvdom *
find_uuid(struct lvcache *k, const char *uuid)
{
    for (int i = 0; i < k->ndoms; i++)
        if (strcmp(k->doms[i].uuid, uuid) == 0)
            return &k->doms[i];
    return NULL;
}

static struct lvdom *
find_name(struct lvcache *k, const char *name)
{
    for (int i = 0; i < k->ndoms; i++)
        if (strcmp(k->doms[i].name, name) == 0)
            return &k->doms[i];
    return NULL;
}

/* Puts d in the table (replacing the entry of its UUID); 0 or -1. */
static int
put(struct lvcache *k, const struct lvdom *d)
{
    struct lvdom *e = find_uuid(k, d->uuid);

    if (!e) {
        if (k->ndoms == k->cap) {
            int cap = k->cap ? k->cap * 2 : 16;
            struct lvdom *n = realloc(k->doms, (size_t)cap * sizeof(*n));
            if (!n)
                return -1;
            k->doms = n;
            k->cap = cap;
        }
        e = &k->doms[k->ndoms++];
    }
    *e = *d;
    k->generation++;
    return 0;
}

static void
drop(struct lvcache *k, struct lvdom *e)
{
    if (e) {
        log_info("event=libvirt_domain_gone domain=%s", e->name);
        *e = k->doms[--k->ndoms];
        k->generation++;
    }
}

static void
enqueue(struct lvcache *k, int by_name, const char *key, int want_xml)
{
    for (int i = 0; i < k->nqueue; i++)
        if (k->queue[i].by_name == by_name &&
            strcmp(k->queue[i].key, key) == 0) {
            k->queue[i].want_xml |= want_xml;
            k->queue[i].seq = ++k->seq;
            return;
        }
    if (k->nqueue == QUEUE_MAX) {
        k->full_sync = 1;       /* too many at once: read everything */
        return;
    }
    k->queue[k->nqueue].by_name = by_name;
    k->queue[k->nqueue].want_xml = want_xml;
    k->queue[k->nqueue].seq = ++k->seq;
    snprintf(k->queue[k->nqueue].key, sizeof(k->queue[0].key), "%s", key);
    k->nqueue++;
}

/* ---- events (libvirt's event loop thread: nothing that blocks) --------- */

static const char *
event_name(int event)
{
    static const char *const names[] = {
        "defined", "undefined", "started", "suspended", "resumed",
        "stopped", "shutdown", "pmsuspended", "crashed",
    };

    return event >= 0 && event < (int)(sizeof(names) / sizeof(names[0])) ?
           names[event] : "other";
}

/* The details that tell a migration from the rest. */
static int
is_migration(int event, int detail)
{
    return (event == VIR_DOMAIN_EVENT_STARTED &&
            detail == VIR_DOMAIN_EVENT_STARTED_MIGRATED) ||
           (event == VIR_DOMAIN_EVENT_STOPPED &&
            detail == VIR_DOMAIN_EVENT_STOPPED_MIGRATED) ||
           (event == VIR_DOMAIN_EVENT_SUSPENDED &&
            detail == VIR_DOMAIN_EVENT_SUSPENDED_MIGRATED) ||
           (event == VIR_DOMAIN_EVENT_RESUMED &&
            detail == VIR_DOMAIN_EVENT_RESUMED_MIGRATED);
}

void
lvcache_event(struct lvcache *k, virDomainPtr dom, int event, int detail)
{
    char uuid[VIR_UUID_STRING_BUFLEN] = "";
    const char *name = virDomainGetName(dom);   /* local: no RPC */
    struct lvdom *e;

    virDomainGetUUIDString(dom, uuid);
    log_info("event=libvirt_event domain=%s what=%s%s", name ? name : "?",
             event_name(event), is_migration(event, detail) ?
             " detail=migrated" : "");
    pthread_mutex_lock(&k->mu);
    k->events++;
    k->generation++;
    /* The state the event implies, at once; the refresh confirms it. */
    if ((e = find_uuid(k, uuid))) {
        if (event == VIR_DOMAIN_EVENT_STARTED ||
            event == VIR_DOMAIN_EVENT_RESUMED) {
            e->active = 1;
            e->state = VIR_DOMAIN_RUNNING;
        } else if (event == VIR_DOMAIN_EVENT_SUSPENDED) {
            e->state = VIR_DOMAIN_PAUSED;
        } else if (event == VIR_DOMAIN_EVENT_STOPPED) {
            e->active = 0;
            e->state = VIR_DOMAIN_SHUTOFF;
        }
    }
    enqueue(k, 0, uuid, !e || event == VIR_DOMAIN_EVENT_DEFINED ||
            event == VIR_DOMAIN_EVENT_STARTED);
    pthread_mutex_unlock(&k->mu);
    k->wake(k->opaque);
}

/* ---- the reads (lvcall workers) ----------------------------------------- */

struct read_arg {
    int by_name;
    char key[256];
    int want_xml;
    int gone;               /* no such domain */
    struct lvdom d;
};

/* One domain's facts into a->d; 0 or -1. */
static int
read_domain(virDomainPtr dom, struct read_arg *a)
{
    int reason;
    char *xml = NULL;

    memset(&a->d, 0, sizeof(a->d));
    snprintf(a->d.name, sizeof(a->d.name), "%s", virDomainGetName(dom));
    if (virDomainGetUUIDString(dom, a->d.uuid) < 0 ||
        virDomainGetState(dom, &a->d.state, &reason, 0) < 0 ||
        (a->d.active = virDomainIsActive(dom)) < 0 ||
        (a->d.persistent = virDomainIsPersistent(dom)) < 0)
        return -1;
    if (!a->want_xml)
        return 0;
    if (!(xml = virDomainGetXMLDesc(dom, 0)))
        return -1;
    a->d.have_xml = domxml_parse(xml, strlen(xml), &a->d.xml, a->d.xml_error,
                                 sizeof(a->d.xml_error)) == 0;
    free(xml);
    return 0;
}

static int
call_read(virConnectPtr conn, void *p)
{
    struct read_arg *a = p;
    virDomainPtr dom;
    int rc;

    dom = a->by_name ? virDomainLookupByName(conn, a->key) :
                       virDomainLookupByUUIDString(conn, a->key);
    if (!dom) {
        a->gone = virGetLastErrorCode() == VIR_ERR_NO_DOMAIN;
        return a->gone ? 0 : -1;
    }
    rc = read_domain(dom, a);
    lvcall_domain_free(dom);
    return rc;
}

struct list_arg {
    struct lvdom *doms;
    int n;
};

static int
call_list(virConnectPtr conn, void *p)
{
    struct list_arg *a = p;
    virDomainPtr *list = NULL;
    int n = virConnectListAllDomains(conn, &list, 0), rc = 0;

    if (n < 0)
        return -1;
    a->doms = calloc((size_t)(n ? n : 1), sizeof(*a->doms));
    for (int i = 0; i < n; i++) {
        struct read_arg r = {.want_xml = 1};
        if (a->doms && rc == 0 && read_domain(list[i], &r) == 0)
            a->doms[a->n++] = r.d;
        else if (a->doms && rc == 0 &&
                 virGetLastErrorCode() != VIR_ERR_NO_DOMAIN)
            rc = -1;        /* a domain that went meanwhile is fine */
        lvcall_domain_free(list[i]);
    }
    free(list);
    return a->doms ? rc : -1;
}

static void
drop_list(void *p)
{
    free(((struct list_arg *)p)->doms);
}

/* ---- the work ---------------------------------------------------------- */

static int
full_sync(struct lvcache *k, struct lvcall_slot *slot, virConnectPtr conn,
          int timeout_ms)
{
    struct list_arg la = {0};
    struct lvcall_err e;

    if (lvcall_run(slot, "virConnectListAllDomains", conn, call_list, &la,
                   sizeof(la), drop_list, timeout_ms, &e) < 0) {
        log_warnx("event=libvirt_sync_failed msg=\"%s\"", e.msg);
        return -1;
    }
    pthread_mutex_lock(&k->mu);
    free(k->doms);
    k->doms = la.doms;
    k->ndoms = k->cap = la.n;
    if (!la.n) {
        free(k->doms);
        k->doms = NULL;
    }
    k->synced = 1;
    k->full_sync = 0;
    k->generation++;
    pthread_mutex_unlock(&k->mu);
    log_info("event=libvirt_synced domains=%d inventory=fresh", la.n);
    return 0;
}

static int
refresh(struct lvcache *k, struct lvcall_slot *slot, virConnectPtr conn,
        const struct pending *p, int timeout_ms)
{
    struct read_arg *ra = calloc(1, sizeof(*ra));
    struct lvcall_err e;
    struct lvdom *old;
    int rc = -1;

    if (!ra)
        return -1;
    ra->by_name = p->by_name;
    ra->want_xml = p->want_xml;
    snprintf(ra->key, sizeof(ra->key), "%s", p->key);
    pthread_mutex_lock(&k->mu);
    old = p->by_name ? find_name(k, p->key) : find_uuid(k, p->key);
    ra->want_xml |= !old || !old->have_xml;
    pthread_mutex_unlock(&k->mu);
    if (lvcall_run(slot, "refresh", conn, call_read, ra, sizeof(*ra), NULL,
                   timeout_ms, &e) < 0) {
        log_warnx("event=libvirt_refresh_failed domain=%s msg=\"%s\"",
                  p->key, e.msg);
        goto cleanup;
    }
    pthread_mutex_lock(&k->mu);
    if (ra->gone) {
        drop(k, p->by_name ? find_name(k, p->key) : find_uuid(k, p->key));
    } else {
        if (!ra->want_xml && (old = find_uuid(k, ra->d.uuid))) {
            ra->d.have_xml = old->have_xml;
            ra->d.xml = old->xml;
            snprintf(ra->d.xml_error, sizeof(ra->d.xml_error), "%s",
                     old->xml_error);
        }
        put(k, &ra->d);
    }
    /* done: off the queue, unless it was asked for again meanwhile */
    for (int i = 0; i < k->nqueue; i++)
        if (k->queue[i].by_name == p->by_name &&
            strcmp(k->queue[i].key, p->key) == 0) {
            if (k->queue[i].seq == p->seq)
                k->queue[i] = k->queue[--k->nqueue];
            break;
        }
    pthread_mutex_unlock(&k->mu);
    rc = 0;
cleanup:
    free(ra);
    return rc;
}

int
lvcache_work(struct lvcache *k, struct lvcall_slot *slot, virConnectPtr conn,
             int timeout_ms)
{
    struct pending p;
    int full, n;

    pthread_mutex_lock(&k->mu);
    full = k->full_sync;
    n = k->nqueue;
    if (n)
        p = k->queue[0];
    pthread_mutex_unlock(&k->mu);
    if (full)
        return full_sync(k, slot, conn, timeout_ms);
    return n ? refresh(k, slot, conn, &p, timeout_ms) : 0;
}

/* ---- the interface ------------------------------------------------------ */

struct lvcache *
lvcache_new(void (*wake)(void *opaque), void *opaque)
{
    struct lvcache *k = calloc(1, sizeof(*k));

    if (!k)
        return NULL;
    pthread_mutex_init(&k->mu, NULL);
    k->wake = wake;
    k->opaque = opaque;
    return k;
}

void
lvcache_free(struct lvcache *k)
{
    if (!k)
        return;
    free(k->doms);
    pthread_mutex_destroy(&k->mu);
    free(k);
}

void
lvcache_refresh(struct lvcache *k, const char *name)
{
    pthread_mutex_lock(&k->mu);
    enqueue(k, 1, name, 1);
    pthread_mutex_unlock(&k->mu);
    k->wake(k->opaque);
}

void
lvcache_resync(struct lvcache *k)
{
    pthread_mutex_lock(&k->mu);
    k->synced = 0;
    k->full_sync = 1;
    k->generation++;
    pthread_mutex_unlock(&k->mu);
}

int
lvcache_pending(struct lvcache *k)
{
    int n;

    pthread_mutex_lock(&k->mu);
    n = k->full_sync || k->nqueue;
    pthread_mutex_unlock(&k->mu);
    return n;
}

int
lvcache_synced(struct lvcache *k)
{
    int s;

    pthread_mutex_lock(&k->mu);
    s = k->synced;
    pthread_mutex_unlock(&k->mu);
    return s;
}

long
lvcache_generation(struct lvcache *k)
{
    long g;

    pthread_mutex_lock(&k->mu);
    g = k->generation;
    pthread_mutex_unlock(&k->mu);
    return g;
}

long
lvcache_events(struct lvcache *k)
{
    long n;

    pthread_mutex_lock(&k->mu);
    n = k->events;
    pthread_mutex_unlock(&k->mu);
    return n;
}

int
lvcache_find(struct lvcache *k, const char *name, struct lvdom *out)
{
    struct lvdom *e;

    pthread_mutex_lock(&k->mu);
    if ((e = find_name(k, name)))
        *out = *e;
    pthread_mutex_unlock(&k->mu);
    return e ? 0 : -1;
}

int
lvcache_list(struct lvcache *k, struct lvdom **out)
{
    int n;

    pthread_mutex_lock(&k->mu);
    n = k->ndoms;
    *out = malloc((size_t)(n ? n : 1) * sizeof(**out));
    if (*out && n)
        memcpy(*out, k->doms, (size_t)n * sizeof(**out));
    pthread_mutex_unlock(&k->mu);
    return *out ? n : 0;
}
