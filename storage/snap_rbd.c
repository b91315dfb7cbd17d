/*
 * snap_rbd: the "rbd" member-snapshot backend (snap.h) over rbdsnap.c.
 *
 * librbd has no asynchronous snapshot create, so create runs one thread
 * per disk and waits for them until the deadline.  A thread still running
 * at the deadline is left to finish on its own: the shared job is
 * reference-counted and freed by whoever drops the last reference.
 */
#include "snap.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mono.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

struct rbd_job;

struct rbd_disk {
    struct rbd_job *job;
    struct rbdsnap_image *img;
    char name[256];
    char owner[160];            /* the txn to record as owner, or "" */
    double ms;
    int rc;
    int done;
    char err[256];
};

struct rbd_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* CLOCK_MONOTONIC; a disk finished */
    int refs;
    int pending;
    int timed_out;              /* create gave up waiting: late disks tag
                                   themselves (no confirm runs for them) */
    int n;
    struct rbd_disk d[];
};

static void
rbd_job_unref(struct rbd_job *s)
{
    int last;

    pthread_mutex_lock(&s->mu);
    last = --s->refs == 0;
    pthread_mutex_unlock(&s->mu);
    if (last) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s);
    }
}

static void *
rbd_disk_thread(void *arg)
{
    struct rbd_disk *d = arg;
    char err[256] = "";
    double t0 = mono_ms();
    int rc = d->img ? rbdsnap_create(d->img, d->name, err, sizeof(err)) : -1;

    if (!d->img)
        snprintf(err, sizeof(err), "rbd image not open");
    pthread_mutex_lock(&d->job->mu);
    if (rc == 0 && d->job->timed_out && d->owner[0]) {
        /* Done after the deadline: the commit has moved on and will not
         * confirm this one, so record its owner here; abort and the
         * sweeper find it by that key. */
        uint64_t id;
        char e[256];

        pthread_mutex_unlock(&d->job->mu);
        if (rbdsnap_snap_id(d->img, d->name, &id, e, sizeof(e)) != 0 ||
            rbdsnap_set_owner(d->img, id, d->owner, e, sizeof(e)) < 0)
            fprintf(stderr, "event=snapshot_owner_failed name=%s msg=\"%s\"\n",
                    d->name, e);
        pthread_mutex_lock(&d->job->mu);
    }
    d->ms = mono_ms() - t0;
    d->rc = rc;
    d->done = 1;
    snprintf(d->err, sizeof(d->err), "%s", err);
    d->job->pending--;
    pthread_cond_broadcast(&d->job->cv);
    pthread_mutex_unlock(&d->job->mu);
    rbd_job_unref(d->job);
    return NULL;
}

static int
rbd_create(struct snap_member *m, int n, double deadline, int *timed_out,
           struct snap_err *err)
{
    struct rbd_job *s = calloc(1, sizeof(*s) + (size_t)n * sizeof(s->d[0]));
    double t0 = mono_ms();
    pthread_condattr_t ca;
    struct timespec ts;

    *timed_out = 0;
    if (!s) {
        err->kind = SNAP_E_STORAGE;
        snprintf(err->msg, sizeof(err->msg), "out of memory");
        return -1;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    s->refs = 1;
    s->n = n;
    for (int k = 0; k < n; k++) {
        struct rbd_disk *d = &s->d[k];
        pthread_t th;

        d->job = s;
        d->img = m[k].disk.img;
        snprintf(d->name, sizeof(d->name), "%s", m[k].name);
        snprintf(d->owner, sizeof(d->owner), "%s",
                 m[k].owner ? m[k].owner : "");
        pthread_mutex_lock(&s->mu);
        s->refs++;
        s->pending++;
        pthread_mutex_unlock(&s->mu);
        if (pthread_create(&th, NULL, rbd_disk_thread, d) == 0)
            pthread_detach(th);
        else
            rbd_disk_thread(d);
    }
    pthread_mutex_lock(&s->mu);
    while (s->pending > 0) {
        double left = deadline - mono_ms();
        if (left <= 0) {
            *timed_out = 1;
            s->timed_out = 1;
            break;
        }
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += (long)(left * 1e6);
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    for (int k = 0; k < n; k++) {
        m[k].ok = s->d[k].done && s->d[k].rc == 0;
        m[k].pending = !s->d[k].done;
        m[k].ms = s->d[k].done ? s->d[k].ms : mono_ms() - t0;
        snprintf(m[k].err, sizeof(m[k].err), "%s", s->d[k].done ?
                 s->d[k].err : "still running at the budget deadline");
    }
    pthread_mutex_unlock(&s->mu);
    rbd_job_unref(s);
    return 0;
}

/*
 * A disk counts as done only if its snapshot exists.  In the lab librbd
 * returned 0 for a snapshot the lock owner refused (snap limit reached),
 * so every create is checked against the image header.  The caller runs
 * this after resuming the VM: the snapshot is immutable, and the check (a
 * header refresh) must not lengthen the pause.
 */
static void
rbd_confirm(struct snap_member *m, int n)
{
    for (int k = 0; k < n; k++) {
        char e[256] = "";
        int exists = 0;

        if (!m[k].ok || !m[k].disk.img)
            continue;
        if (rbdsnap_exists(m[k].disk.img, m[k].name, &exists, e,
                           sizeof(e)) < 0) {
            m[k].ok = 0;
            snprintf(m[k].err, sizeof(m[k].err), "cannot confirm the "
                     "snapshot: %s", e);
        } else if (!exists) {
            m[k].ok = 0;
            snprintf(m[k].err, sizeof(m[k].err), "librbd reported the "
                     "snapshot created but the image header does not list "
                     "it (refused by the lock owner?)");
        } else if (rbdsnap_snap_id(m[k].disk.img, m[k].name, &m[k].id, e,
                                   sizeof(e)) != 0) {
            m[k].ok = 0;
            snprintf(m[k].err, sizeof(m[k].err), "cannot read the snap "
                     "id: %s", e);
        } else {
            /* From here abort can delete it by id, whatever follows. */
            m[k].has_id = 1;
            if (m[k].owner && rbdsnap_set_owner(m[k].disk.img, m[k].id,
                                                m[k].owner, e,
                                                sizeof(e)) < 0) {
                m[k].ok = 0;
                snprintf(m[k].err, sizeof(m[k].err), "cannot record the "
                         "owner: %s", e);
            }
        }
    }
}

static int
rbd_remove(const struct snap_disk *d, const char *name, int timeout_ms,
           struct snap_err *err)
{
    int rc;

    uint64_t id;

    (void)timeout_ms;   /* librbd's own op timeouts bound it (rbdsnap.c) */
    /* By id, so that its owner key goes with it: a key left behind names a
     * dead snap id for good. */
    rc = rbdsnap_snap_id(d->img, name, &id, err->msg, sizeof(err->msg));
    if (rc == 0)
        rc = rbdsnap_remove_id(d->img, id, err->msg, sizeof(err->msg));
    if (rc == RBDSNAP_ENOENT)
        return SNAP_ENOENT;
    if (rc < 0)
        err->kind = SNAP_E_STORAGE;
    return rc;
}

static int
rbd_list(const struct snap_disk *d, int timeout_ms, json_t **out,
         struct snap_err *err)
{
    (void)timeout_ms;
    if (rbdsnap_list(d->img, out, err->msg, sizeof(err->msg)) < 0) {
        err->kind = SNAP_E_STORAGE;
        return -1;
    }
    return 0;
}

const struct snap_ops snap_rbd_ops = {
    .name = "rbd",
    .tags_owner = 1,
    .create = rbd_create,
    .confirm = rbd_confirm,
    .remove = rbd_remove,
    .list = rbd_list,
};
