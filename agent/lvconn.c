/* lvconn: see lvconn.h. */
#include "lvconn.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <libvirt/virterror.h>

#include "domxml.h"
#include "log.h"
#include "lvcall.h"
#include "mono.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#define BACKOFF_FIRST_MS 500.0
#define BACKOFF_MAX_MS 30000.0

struct lvconn {
    char uri[512];
    int call_timeout_ms;
    struct lvcache *cache;
    struct lvcall_slot slot;        /* the manager's calls */
    pthread_mutex_t mu;             /* guards the fields below */
    pthread_cond_t cond;            /* CLOCK_MONOTONIC: work, lost, stop */
    int stopping, manager_done, work;
    virConnectPtr conn;             /* NULL while down */
    int lost;                       /* closed under us: go down */
    int cb_lifecycle;               /* event callback id, -1 none */
    int cb_metadata;                /* metadata-change callback id, -1 none */
    int cb_live;                    /* event callbacks libvirt may still run */
    int was_connected;              /* for since */
    long epoch, transitions;
    double since;
    char error[256];
    void (*watch)(void *opaque);
    void *watch_opaque;
};

/* ---- the process's libvirt event loop ---------------------------------- */

static pthread_once_t loop_once = PTHREAD_ONCE_INIT;
static int loop_ok;

static void *
event_loop(void *arg)
{
    (void)arg;
    for (;;)
        if (virEventRunDefaultImpl() < 0)
            log_warnx("event=libvirt_event_loop_error msg=\"%s\"",
                      virGetLastErrorMessage());
    return NULL;
}

/* Keepalive and domain events are delivered by this loop; libvirt binds a
 * connection to the loop registered when it opens. */
static void
start_event_loop(void)
{
    pthread_attr_t at;
    pthread_t th;

    if (virEventRegisterDefaultImpl() < 0)
        return;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    loop_ok = pthread_create(&th, &at, event_loop, NULL) == 0;
    pthread_attr_destroy(&at);
}

/* ---- libvirt's callbacks (event loop thread: nothing that blocks) ------- */

/* libvirt is done with one event callback of c: deregistering one does not
 * wait for a dispatch under way on the event loop thread, so c may be freed
 * only once every callback's free function has run (lvconn_free). */
static void
callback_freed(void *opaque)
{
    struct lvconn *c = opaque;

    pthread_mutex_lock(&c->mu);
    c->cb_live--;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->mu);
}

static void
wake(void *opaque)
{
    struct lvconn *c = opaque;

    pthread_mutex_lock(&c->mu);
    c->work = 1;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->mu);
}

static int
on_lifecycle(virConnectPtr conn, virDomainPtr dom, int event, int detail,
             void *opaque)
{
    struct lvconn *c = opaque;

    (void)conn;
    lvcache_event(c->cache, dom, event, detail);
    return 0;
}

/* `virsh metadata ... --set/--remove` changes no lifecycle state, yet
 * whether discovery takes the domain may depend on it ([libvirt]
 * manage_metadata): its XML is read again. */
static void
on_metadata(virConnectPtr conn, virDomainPtr dom, int type, const char *nsuri,
            void *opaque)
{
    struct lvconn *c = opaque;
    const char *name = virDomainGetName(dom);   /* local: no RPC */

    (void)conn;
    if (type == VIR_DOMAIN_METADATA_ELEMENT && nsuri && name &&
        strcmp(nsuri, DOMXML_CUTPOINT_NS) == 0) {
        log_info("event=libvirt_event domain=%s what=metadata", name);
        lvcache_refresh(c->cache, name);
    }
}

static void
on_close(virConnectPtr conn, int reason, void *opaque)
{
    struct lvconn *c = opaque;

    (void)conn;
    log_warnx("event=libvirt_closed uri=%s reason=%s", c->uri,
              reason == VIR_CONNECT_CLOSE_REASON_KEEPALIVE ? "keepalive" :
              reason == VIR_CONNECT_CLOSE_REASON_EOF ? "eof" :
              reason == VIR_CONNECT_CLOSE_REASON_ERROR ? "error" : "client");
    pthread_mutex_lock(&c->mu);
    c->lost = 1;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->mu);
}

/* ---- the manager ------------------------------------------------------- */

struct open_arg {
    const char *uri;
    virConnectPtr conn;
};

static int
call_open(virConnectPtr unused, void *p)
{
    struct open_arg *a = p;

    (void)unused;
    a->conn = virConnectOpen(a->uri);
    return a->conn ? 0 : -1;
}

static void
drop_open(void *p)
{
    struct open_arg *a = p;

    if (a->conn)
        virConnectClose(a->conn);
}

/* DOWN → UP: open, keepalive, callbacks; a full sync follows.  0 or -1
 * with c->error set (c->mu not held). */
static int
do_connect(struct lvconn *c)
{
    struct open_arg oa = {.uri = c->uri};
    struct lvcall_err e;
    virConnectPtr conn;
    int id, mid;

    if (lvcall_run(&c->slot, "virConnectOpen", NULL, call_open, &oa,
                   sizeof(oa), drop_open, c->call_timeout_ms, &e) < 0)
        goto failed;
    conn = oa.conn;
    /* Without keepalive a stopped libvirtd is never noticed: calls on the
     * connection would wait forever.  Local drivers (test:///) have none. */
    if (virConnectSetKeepAlive(conn, LVCONN_KEEPALIVE_INTERVAL_S,
                               LVCONN_KEEPALIVE_COUNT) < 0)
        log_debug("event=libvirt_keepalive uri=%s result=unsupported",
                  c->uri);
    if (virConnectRegisterCloseCallback(conn, on_close, c, NULL) < 0)
        log_debug("event=libvirt_close_callback uri=%s result=unsupported",
                  c->uri);
    id = virConnectDomainEventRegisterAny(
        conn, NULL, VIR_DOMAIN_EVENT_ID_LIFECYCLE,
        VIR_DOMAIN_EVENT_CALLBACK(on_lifecycle), c, callback_freed);
    if (id < 0) {
        lvcall_last_error("virConnectDomainEventRegisterAny", &e);
        virConnectUnregisterCloseCallback(conn, on_close);
        virConnectClose(conn);
        goto failed;
    }
    /* older libvirt has no metadata event: then a changed element counts
     * from the domain's next lifecycle event */
    mid = virConnectDomainEventRegisterAny(
        conn, NULL, VIR_DOMAIN_EVENT_ID_METADATA_CHANGE,
        VIR_DOMAIN_EVENT_CALLBACK(on_metadata), c, callback_freed);
    lvcache_resync(c->cache);
    pthread_mutex_lock(&c->mu);
    c->conn = conn;
    c->cb_lifecycle = id;
    c->cb_metadata = mid;
    c->cb_live += 1 + (mid >= 0);
    c->lost = 0;
    c->epoch++;
    c->transitions++;
    pthread_mutex_unlock(&c->mu);
    log_info("event=libvirt_connected uri=%s epoch=%ld", c->uri, c->epoch);
    return 0;
failed:
    pthread_mutex_lock(&c->mu);
    snprintf(c->error, sizeof(c->error), "%s", e.msg);
    pthread_mutex_unlock(&c->mu);
    return -1;
}

/* UP → DOWN (c->mu held, released meanwhile; the calls on a closed
 * connection fail at once). */
static void
do_disconnect(struct lvconn *c, const char *why)
{
    virConnectPtr conn = c->conn;
    int id = c->cb_lifecycle, mid = c->cb_metadata;

    c->conn = NULL;
    c->cb_lifecycle = c->cb_metadata = -1;
    c->lost = 0;
    c->transitions++;
    snprintf(c->error, sizeof(c->error), "%s", why);
    pthread_mutex_unlock(&c->mu);
    lvcache_resync(c->cache);       /* unsynced: the inventory is stale */
    if (id >= 0)
        virConnectDomainEventDeregisterAny(conn, id);
    if (mid >= 0)
        virConnectDomainEventDeregisterAny(conn, mid);
    virConnectUnregisterCloseCallback(conn, on_close);
    virConnectClose(conn);
    log_warnx("event=libvirt_down uri=%s inventory=stale msg=\"%s\"", c->uri,
              why);
    pthread_mutex_lock(&c->mu);
}

static void
timed_wait(struct lvconn *c, double ms)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)((ms - (double)(long)(ms / 1000) * 1000) * 1e6);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&c->cond, &c->mu, &ts);
}

/* Waits up to ms for work, a lost connection or stop (c->mu held). */
static void
wait_ms(struct lvconn *c, double ms)
{
    if (!c->work && !c->lost && !c->stopping)
        timed_wait(c, ms);
}

static long
generation(struct lvconn *c)
{
    return c->transitions + lvcache_generation(c->cache);
}

/* One turn of the manager (c->mu held): connect, go down, or work. */
static void
turn(struct lvconn *c, double *backoff)
{
    virConnectPtr conn = c->conn;
    int rc;

    if (!conn) {
        pthread_mutex_unlock(&c->mu);
        rc = do_connect(c);
        pthread_mutex_lock(&c->mu);
        if (rc < 0) {
            log_warnx("event=libvirt_retry uri=%s retry_ms=%.0f msg=\"%s\"",
                      c->uri, *backoff, c->error);
            c->work = 0;
            wait_ms(c, *backoff);
            *backoff = *backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS :
                       *backoff * 2;
        }
        return;
    }
    if (c->lost) {
        do_disconnect(c, "the connection to libvirtd was closed");
        return;
    }
    c->work = 0;
    if (!lvcache_pending(c->cache)) {
        wait_ms(c, 1000);
        return;
    }
    virConnectRef(conn);
    pthread_mutex_unlock(&c->mu);
    rc = lvcache_work(c->cache, &c->slot, conn, c->call_timeout_ms);
    virConnectClose(conn);
    pthread_mutex_lock(&c->mu);
    if (rc == 0)
        *backoff = BACKOFF_FIRST_MS;
    else                /* libvirtd slow or going away: not in a loop */
        wait_ms(c, 1000);
}

static void *
manager_main(void *arg)
{
    struct lvconn *c = arg;
    double backoff = BACKOFF_FIRST_MS;
    long gen = -1;

    pthread_mutex_lock(&c->mu);
    while (!c->stopping) {
        int connected;

        turn(c, &backoff);
        connected = c->conn && !c->lost && lvcache_synced(c->cache);
        if (connected != c->was_connected) {
            c->was_connected = connected;
            c->since = mono_ms();
            if (connected)
                c->error[0] = '\0';
        }
        if (generation(c) != gen) {
            void (*fn)(void *) = c->watch;
            void *opaque = c->watch_opaque;

            gen = generation(c);
            pthread_mutex_unlock(&c->mu);
            if (fn)
                fn(opaque);
            pthread_mutex_lock(&c->mu);
        }
    }
    c->manager_done = 1;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* ---- the interface ------------------------------------------------------ */

struct lvconn *
lvconn_new(const char *uri, int call_timeout_ms)
{
    struct lvconn *c = calloc(1, sizeof(*c));
    pthread_condattr_t ca;
    pthread_attr_t at;
    pthread_t th;

    pthread_once(&loop_once, start_event_loop);
    if (!c || !loop_ok || !(c->cache = lvcache_new(wake, c))) {
        free(c);
        return NULL;
    }
    snprintf(c->uri, sizeof(c->uri), "%s", uri);
    c->call_timeout_ms = call_timeout_ms;
    c->cb_lifecycle = c->cb_metadata = -1;
    c->since = mono_ms();
    snprintf(c->error, sizeof(c->error), "not connected yet");
    lvcall_slot_init(&c->slot);
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cond, &ca);
    pthread_condattr_destroy(&ca);
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &at, manager_main, c) != 0) {
        pthread_attr_destroy(&at);
        lvcache_free(c->cache);
        free(c);
        return NULL;
    }
    pthread_attr_destroy(&at);
    return c;
}

void
lvconn_free(struct lvconn *c)
{
    int done;

    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->stopping = 1;
    c->watch = NULL;
    pthread_cond_broadcast(&c->cond);
    for (double end = mono_ms() + 2000; !c->manager_done && mono_ms() < end;)
        timed_wait(c, 50);
    done = c->manager_done;
    if (done && c->conn)
        do_disconnect(c, "closed by the agent");
    /* an event being dispatched still uses c */
    for (double end = mono_ms() + 2000; c->cb_live > 0 && mono_ms() < end;)
        timed_wait(c, 50);
    done = done && c->cb_live == 0;
    pthread_mutex_unlock(&c->mu);
    if (!done || lvcall_slot_busy(&c->slot)) {
        log_warnx("event=libvirt_stop uri=%s msg=\"a libvirt call still "
                  "hangs; leaving the connection\"", c->uri);
        return;
    }
    lvcache_free(c->cache);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cond);
    free(c);
}

int
lvconn_ready(struct lvconn *c, char *err, size_t errlen)
{
    struct lvconn_status st;

    lvconn_status(c, &st);
    if (st.connected)
        return 0;
    snprintf(err, errlen, "libvirt %s: %s", c->uri, st.error[0] ? st.error :
             "synchronizing the domain list");
    return -1;
}

void
lvconn_status(struct lvconn *c, struct lvconn_status *st)
{
    pthread_mutex_lock(&c->mu);
    st->connected = c->conn && !c->lost && lvcache_synced(c->cache);
    st->epoch = c->epoch;
    st->since = c->since;
    st->generation = generation(c);
    st->events = lvcache_events(c->cache);
    snprintf(st->error, sizeof(st->error), "%s", st->connected ? "" :
             c->error);
    pthread_mutex_unlock(&c->mu);
}

virConnectPtr
lvconn_get(struct lvconn *c, long *epoch)
{
    virConnectPtr conn = NULL;

    pthread_mutex_lock(&c->mu);
    if (c->conn && !c->lost && virConnectRef(c->conn) == 0)
        conn = c->conn;
    if (epoch)
        *epoch = c->epoch;
    pthread_mutex_unlock(&c->mu);
    return conn;
}

struct lvcache *
lvconn_cache(struct lvconn *c)
{
    return c->cache;
}

void
lvconn_watch(struct lvconn *c, void (*fn)(void *opaque), void *opaque)
{
    pthread_mutex_lock(&c->mu);
    c->watch = fn;
    c->watch_opaque = opaque;
    pthread_mutex_unlock(&c->mu);
}
