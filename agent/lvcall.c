/* lvcall: see lvcall.h. */
#include "lvcall.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <libvirt/virterror.h>

#include "mono.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

struct job {
    pthread_mutex_t mu;
    pthread_cond_t cond;        /* CLOCK_MONOTONIC */
    int done, abandoned;
    int kept;                   /* err holds the call's error already */
    int rc;
    struct lvcall_err err;
    struct lvcall_slot *slot;
    virConnectPtr conn;
    lvcall_fn fn;
    void (*drop)(void *arg);
    char what[48];
    size_t argsize;
    unsigned char arg[];        /* argsize bytes */
};

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static __thread struct job *current;    /* the worker's job */

/* libvirt's per-thread error state needs the library initialized before
 * a worker touches it (virConnectOpen does it too, but may not have run
 * yet). */
static void
init_libvirt(void)
{
    virInitialize();
}

void
lvcall_slot_init(struct lvcall_slot *s)
{
    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->mu, NULL);
}

int
lvcall_slot_busy(struct lvcall_slot *s)
{
    int b;

    pthread_mutex_lock(&s->mu);
    b = s->busy;
    pthread_mutex_unlock(&s->mu);
    return b;
}

/* A failure of the connection itself, rather than libvirt's answer to the
 * request: the client's RPC layer, or a connection closed under the call
 * (keepalive, EOF).  The request may have reached libvirtd. */
static int
is_transport(const virError *e)
{
    return e->domain == VIR_FROM_RPC || e->code == VIR_ERR_RPC ||
           e->code == VIR_ERR_NO_CONNECT || e->code == VIR_ERR_INVALID_CONN ||
           e->code == VIR_ERR_SYSTEM_ERROR;
}

void
lvcall_domain_free(virDomainPtr d)
{
    if (current && virGetLastError()) {
        lvcall_last_error(current->what, &current->err);
        current->kept = 1;
    }
    virDomainFree(d);
}

void
lvcall_last_error(const char *what, struct lvcall_err *err)
{
    virErrorPtr e = virGetLastError();

    err->kind = e && !is_transport(e) ? LVCALL_REFUSED : LVCALL_TRANSPORT;
    err->code = e ? e->code : 0;
    snprintf(err->msg, sizeof(err->msg), "%s: %s", what,
             e && e->message ? e->message : "libvirt call failed");
}

static void
job_free(struct job *j)
{
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cond);
    if (j->conn)
        virConnectClose(j->conn);
    free(j);
}

static void *
worker(void *p)
{
    struct job *j = p;
    unsigned long seq;
    int abandoned;

    virResetLastError();
    current = j;
    j->rc = j->fn(j->conn, j->arg);
    current = NULL;
    seq = j->err.seq;
    if (j->rc == LVCALL_SKIPPED) {
        j->err.kind = LVCALL_REFUSED;
        snprintf(j->err.msg, sizeof(j->err.msg), "%s: not made: its caller "
                 "had given up", j->what);
        j->rc = -1;
    } else if (j->rc < 0) {
        if (!j->kept || virGetLastError())
            lvcall_last_error(j->what, &j->err);
    } else {
        j->err.kind = LVCALL_OK;
    }
    j->err.seq = seq;
    pthread_mutex_lock(&j->mu);
    j->done = 1;
    abandoned = j->abandoned;
    pthread_cond_signal(&j->cond);
    pthread_mutex_unlock(&j->mu);
    /* Answered in time: the caller owns j and the slot from here on, and
     * this thread touches neither again. */
    if (abandoned) {
        /* Nobody waits: this thread owns the job and the slot now. */
        if (j->drop)
            j->drop(j->arg);
        pthread_mutex_lock(&j->slot->mu);
        j->slot->busy = 0;
        j->slot->late = j->err;
        pthread_mutex_unlock(&j->slot->mu);
        job_free(j);
    }
    return NULL;
}

int
lvcall_abandoned(void)
{
    int a;

    if (!current)
        return 0;
    pthread_mutex_lock(&current->mu);
    a = current->abandoned;
    pthread_mutex_unlock(&current->mu);
    return a;
}

static struct timespec
deadline_ts(int timeout_ms)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* Claims slot for what; 0, or -1 with err (BUSY). */
static int
claim(struct lvcall_slot *slot, const char *what, struct lvcall_err *err)
{
    int rc = 0;

    pthread_mutex_lock(&slot->mu);
    if (slot->busy) {
        err->kind = LVCALL_BUSY;
        err->code = 0;
        snprintf(err->msg, sizeof(err->msg), "%s: an earlier %s has not "
                 "returned after %.0f ms (libvirtd or QEMU not answering)",
                 what, slot->what, mono_ms() - slot->since);
        rc = -1;
    } else {
        slot->busy = 1;
        err->seq = ++slot->seq;
        snprintf(slot->what, sizeof(slot->what), "%s", what);
        slot->since = mono_ms();
    }
    pthread_mutex_unlock(&slot->mu);
    return rc;
}

static void
release(struct lvcall_slot *slot)
{
    pthread_mutex_lock(&slot->mu);
    slot->busy = 0;
    pthread_mutex_unlock(&slot->mu);
}

int
lvcall_run(struct lvcall_slot *slot, const char *what, virConnectPtr conn,
           lvcall_fn fn, void *arg, size_t argsize, void (*drop)(void *arg),
           int timeout_ms, struct lvcall_err *err)
{
    struct job *j = NULL;
    pthread_condattr_t ca;
    pthread_attr_t at;
    pthread_t th;
    struct timespec ts;
    int rc = -1, r = 0;

    memset(err, 0, sizeof(*err));
    pthread_once(&init_once, init_libvirt);
    if (claim(slot, what, err) < 0)
        return -1;
    if (!(j = calloc(1, sizeof(*j) + argsize))) {
        release(slot);
        err->kind = LVCALL_REFUSED;
        snprintf(err->msg, sizeof(err->msg), "%s: out of memory", what);
        return -1;
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cond, &ca);
    pthread_condattr_destroy(&ca);
    j->slot = slot;
    j->fn = fn;
    j->drop = drop;
    j->argsize = argsize;
    snprintf(j->what, sizeof(j->what), "%s", what);
    j->err.seq = err->seq;
    memcpy(j->arg, arg, argsize);
    if (conn && virConnectRef(conn) == 0)
        j->conn = conn;
    ts = deadline_ts(timeout_ms > 0 ? timeout_ms : 1);
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if ((conn && !j->conn) || pthread_create(&th, &at, worker, j) != 0) {
        pthread_attr_destroy(&at);
        release(slot);
        err->kind = LVCALL_REFUSED;
        snprintf(err->msg, sizeof(err->msg), "%s: cannot start a thread for "
                 "the call", what);
        job_free(j);
        return -1;
    }
    pthread_attr_destroy(&at);
    pthread_mutex_lock(&j->mu);
    while (!j->done && r != ETIMEDOUT)
        r = pthread_cond_timedwait(&j->cond, &j->mu, &ts);
    if (!j->done) {
        j->abandoned = 1;
        pthread_mutex_unlock(&j->mu);
        err->kind = LVCALL_TIMEOUT;      /* err->seq: this call's */
        snprintf(err->msg, sizeof(err->msg), "%s: no answer from libvirt "
                 "within %d ms (libvirtd or QEMU not answering)", what,
                 timeout_ms);
        return -1;      /* the worker frees j */
    }
    pthread_mutex_unlock(&j->mu);
    release(slot);
    memcpy(arg, j->arg, argsize);
    rc = j->rc;
    if (rc < 0)
        *err = j->err;
    job_free(j);
    return rc;
}
