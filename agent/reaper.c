/* reaper: see reaper.h. */
#include "reaper.h"

#include <stdio.h>
#include <stdlib.h>

#include "log.h"
#include "mono.h"
#include "par.h"
#include "quiesce.h"
#include "redirect.h"
#include "resume.h"
#include "sdnotify.h"

#define RETRY_RESUME_MS 500.0

void
reaper_expire(struct agent *a, struct txn *x)
{
    struct vm *vms[CFG_MAX_VMS];
    struct resume_job jobs[CFG_MAX_VMS];
    int n = 0;

    for (int i = 0; i < x->nvms; i++)
        if ((vms[n] = agent_find_vm(a, x->vms[i])))
            n++;
    resume_vms(a, vms, n, x->id, "lease_expired", jobs);
    redirect_merge_txn(a, x, "lease_expired");
    atomic_fetch_add(&a->resumed_by_lease, n);
    atomic_fetch_add(&a->n_expired, 1);
    log_info("event=lease_expired txn=%s vms=%d", x->id, n);
    pthread_mutex_lock(&a->mu);
    txn_finish_expire(&a->txns, x);
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mu);
}

struct expire_arg {
    struct agent *a;
    struct txn *x;
};

static void *
expire_thread(void *arg)
{
    struct expire_arg *e = arg;

    reaper_expire(e->a, e->x);
    free(e);
    return NULL;
}

struct retry_arg {
    struct agent *a;
    struct vm *vm;
};

static void *
retry_thread(void *arg)
{
    struct retry_arg *r = arg;
    struct resume_job j = {.a = r->a, .vm = r->vm, .why = "retry",
                           .txn = r->vm->needs_resume_txn};
    int idx = (int)(r->vm - r->a->vms);

    resume_one(&j);
    pthread_mutex_lock(&r->a->mu);
    r->a->retrying[idx] = 0;
    pthread_mutex_unlock(&r->a->mu);
    free(r);
    return NULL;
}

struct thaw_arg {
    struct agent *a;
    struct vm *vm;
};

static void *
thaw_thread(void *arg)
{
    struct thaw_arg *t = arg;

    quiesce_thaw_retry(t->a, t->vm, t->a->cfg.qmp_timeout_ms);
    free(t);
    return NULL;
}

/* Hands every due thaw retry to a thread, one per VM (a.mu held). */
static void
claim_thaws(struct agent *a)
{
    double now = mono_ms();

    for (int i = 0; i < a->nvms; i++) {
        struct thaw_arg *t;

        if (!quiesce_thaw_due(&a->vms[i], now) || !(t = malloc(sizeof(*t))))
            continue;
        t->a = a;
        t->vm = &a->vms[i];
        a->vms[i].thaw_running = 1;
        par_detach(thaw_thread, t);
    }
}

/* Hands every due lease to an expire thread (a.mu held). */
static void
claim_expired(struct agent *a)
{
    struct txn *x;

    while ((x = lease_claim_due(&a->txns))) {
        struct expire_arg *e = malloc(sizeof(*e));
        if (!e) {
            pthread_mutex_unlock(&a->mu);
            reaper_expire(a, x);
            pthread_mutex_lock(&a->mu);
            continue;
        }
        e->a = a;
        e->x = x;
        par_detach(expire_thread, e);
    }
}

/* Hands every VM whose resume failed to a retry thread, at most one per
 * VM and one per RETRY_RESUME_MS (a.mu held). */
static void
claim_retries(struct agent *a)
{
    for (int i = 0; i < a->nvms; i++) {
        if (a->vms[i].needs_resume && !a->retrying[i] &&
            mono_ms() - a->last_retry[i] >= RETRY_RESUME_MS) {
            struct retry_arg *r = malloc(sizeof(*r));
            if (!r)
                continue;
            r->a = a;
            r->vm = &a->vms[i];
            a->retrying[i] = 1;
            a->last_retry[i] = mono_ms();
            par_detach(retry_thread, r);
        }
    }
}

static void *
reaper_main(void *arg)
{
    struct agent *a = arg;
    double wd_ms = sdnotify_watchdog_ms(), wd_last = 0;

    pthread_mutex_lock(&a->mu);
    while (!a->stopping) {
        double next;

        /* The watchdog pings come from here, the lease guard: if this
         * loop stops, systemd restarts the agent, whose recovery resumes
         * what it paused. */
        if (wd_ms > 0 && mono_ms() - wd_last >= wd_ms) {
            sdnotify_send("WATCHDOG=1");
            wd_last = mono_ms();
        }
        claim_expired(a);
        claim_retries(a);
        claim_thaws(a);
        txn_gc(&a->txns);
        next = lease_next_in(&a->txns);
        agent_wait(a, next < 0 || next > 100 ? 100 : next);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

int
reaper_start(struct agent *a, char *err, size_t errlen)
{
    if (pthread_create(&a->reaper, NULL, reaper_main, a) != 0) {
        snprintf(err, errlen, "cannot start the lease thread");
        return -1;
    }
    a->reaper_started = 1;
    return 0;
}

void
reaper_join(struct agent *a)
{
    if (a->reaper_started)
        pthread_join(a->reaper, NULL);
    a->reaper_started = 0;
}

int
reaper_busy(struct agent *a)
{
    int busy = 0;

    for (int i = 0; i < a->nvms; i++)
        busy |= a->retrying[i] | a->vms[i].thaw_running;
    return busy;
}
