/* agent: see agent.h.  Start, stop, and the lookups every handler uses. */
#include "agent.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "mono.h"
#include "bringup.h"
#include "inventory.h"
#include "par.h"
#include "reaper.h"
#include "recover.h"
#include "redirect.h"
#include "resume.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

static double
clock_mono(void *opaque)
{
    (void)opaque;
    return mono_ms();
}

void
agent_wait(struct agent *a, double ms)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)((ms - (double)(long)(ms / 1000) * 1000) * 1e6);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&a->cond, &a->mu, &ts);
}

struct txn *
agent_txn_stable(struct agent *a, const char *id)
{
    struct txn *x;

    for (;;) {
        x = txn_find(&a->txns, id);
        if (!x || !(x->state == TXN_PREPARING || x->state == TXN_COMMITTING ||
                    x->state == TXN_EXPIRING || x->state == TXN_ABORTING))
            return x;
        agent_wait(a, 100);
    }
}

struct vm *
agent_find_vm(struct agent *a, const char *name)
{
    for (int i = 0; i < a->nvms; i++)
        if (strcmp(a->vms[i].cfg->name, name) == 0)
            return &a->vms[i];
    return NULL;
}

int
agent_find_disk(struct agent *a, const char *id, struct vm **vmp, int *idx)
{
    const char *slash = strrchr(id, '/');
    char vmname[256];
    struct vm *v;

    if (!slash || (size_t)(slash - id) >= sizeof(vmname))
        return -1;
    memcpy(vmname, id, (size_t)(slash - id));
    vmname[slash - id] = '\0';
    if (!(v = agent_find_vm(a, vmname)))
        return -1;
    for (int d = 0; d < v->cfg->ndisks; d++)
        if (strcmp(v->cfg->disks[d].node, slash + 1) == 0) {
            *vmp = v;
            *idx = d;
            return 0;
        }
    return -1;
}

int
agent_open_images(struct agent *a, struct vm *v, char *err, size_t errlen)
{
    for (int d = 0; d < v->cfg->ndisks; d++) {
        const struct cfg_disk *dk = &v->cfg->disks[d];
        if (dk->backend != CFG_BACKEND_RBD || v->img[d])
            continue;
        if (!a->ceph) {
            snprintf(err, errlen, "vm %s: rbd disk %s but no [ceph] "
                     "connection", v->cfg->name, dk->node);
            return -1;
        }
        if (rbdsnap_open(a->ceph, dk->pool, dk->image, &v->img[d], err,
                         errlen) < 0)
            return -1;
        log_info("event=rbd_open vm=%s disk=%s image=%s/%s", v->cfg->name,
                 dk->node, dk->pool, dk->image);
    }
    return 0;
}

/* ---- start: the steps of agent_start, in order ------------------------- */

static void
init_state(struct agent *a, const struct agent_config *cfg)
{
    pthread_condattr_t ca;

    memset(a, 0, sizeof(*a));
    a->cfg = *cfg;
    a->started_ms = mono_ms();
    pthread_mutex_init(&a->mu, NULL);
    pthread_mutex_init(&a->adopt_mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->cond, &ca);
    pthread_condattr_destroy(&ca);
    txn_table_init(&a->txns, clock_mono, NULL);
}

/* One struct vm per configured VM, without hypervisor connections yet
 * (bringup attaches them); a VM with disks is storage_pending until
 * bringup has opened them. */
static int
open_vms(struct agent *a, char *err, size_t errlen)
{
    for (int i = 0; i < a->cfg.nvms; i++) {
        if (vm_open(&a->vms[i], &a->cfg.vms[i], &a->host) < 0) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        /* A driver that fills disks in (libvirt: from the domain XML)
         * needs its connection first: no cut until bringup opened it. */
        a->vms[i].storage_pending = a->cfg.vms[i].ndisks > 0 ||
                                    a->vms[i].ops->fill != NULL;
        a->nvms++;
    }
    return 0;
}

static void *
connect_one(void *arg)
{
    struct vm *v = arg;
    struct qmp_err e;

    if (vm_connect(v, 2000, &e) < 0)
        log_warnx("event=qmp_connect_failed vm=%s msg=\"%s\"", v->cfg->name,
                  e.msg);
    return NULL;
}

/* Opens every VM's monitor now, so that no pause window holds a connect,
 * greeting and qmp_capabilities (design "Coordinator latency"). */
static void
connect_all(struct agent *a)
{
    if (a->nvms > 0)
        par_run(connect_one, a->vms, sizeof(a->vms[0]), a->nvms);
}

int
agent_start(struct agent *a, const struct agent_config *cfg, char *err,
            size_t errlen)
{
    init_state(a, cfg);
    /* Recovery: local files and the VMs' own sockets only.  A VM whose
     * driver needs a connection (libvirt) fails its resume here and is
     * retried by the reaper once bringup has attached the connection. */
    if (open_vms(a, err, errlen) < 0 ||
        journal_open(a->cfg.journal, &a->journal, err, errlen) < 0)
        return -1;
    connect_all(a);
    recover_journal(a);
    if (reaper_start(a, err, errlen) < 0 ||
        inventory_start(a, err, errlen) < 0)
        return -1;
    log_info("event=recovered ms=%.3f", mono_ms() - a->started_ms);
    /* The rest: never fatal, retried while the agent serves. */
    return bringup_start(a, err, errlen);
}

/* ---- stop ---------------------------------------------------------------- */

/* 1 while a request or a background thread still uses the VMs (a.mu). */
static int
busy(struct agent *a)
{
    int b = reaper_busy(a);

    for (struct txn *x = a->txns.head; x; x = x->next)
        b |= x->state == TXN_PREPARING || x->state == TXN_COMMITTING ||
             x->state == TXN_EXPIRING || x->state == TXN_ABORTING;
    return b;
}

void
agent_stop(struct agent *a)
{
    struct vm *vms[CFG_MAX_VMS];
    struct resume_job jobs[CFG_MAX_VMS];
    int n = 0, hung;

    /* Let in-flight prepares, commits, expiries, aborts and resume retries
     * finish (bounded): they use the VMs that are about to be freed. */
    pthread_mutex_lock(&a->mu);
    for (double end = mono_ms() + 15000; mono_ms() < end && busy(a);)
        agent_wait(a, 50);
    /* Leaving: nobody will commit, so resume everything still paused. */
    a->stopping = 1;
    for (struct txn *x = a->txns.head; x; x = x->next)
        if (x->state == TXN_PREPARED)
            for (int i = 0; i < x->nvms && n < CFG_MAX_VMS; i++)
                if ((vms[n] = agent_find_vm(a, x->vms[i])))
                    n++;
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mu);
    resume_vms(a, vms, n, NULL, "agent_stop", jobs);
    reaper_join(a);
    inventory_join(a);
    /* bringup uses the host, Ceph and the VMs; a step hung in a connect
     * (a stopped mon) is left behind, and so is what it uses. */
    pthread_mutex_lock(&a->mu);
    for (double end = mono_ms() + 2000; a->bringup_state == 1 &&
         mono_ms() < end;)
        agent_wait(a, 50);
    hung = a->bringup_state == 1;
    pthread_mutex_unlock(&a->mu);
    if (hung) {
        log_warnx("event=stop bringup=hung msg=\"exiting without freeing "
                  "what it uses\"");
        return;
    }
    /* After the resumes: the redirect cut's overlays go while QEMU runs. */
    redirect_agent_stop(a);
    for (int i = 0; i < a->nvms; i++)
        vm_close(&a->vms[i]);
    rbdsnap_cluster_free(a->ceph);
    vm_host_close(&a->host);
    journal_free(a->journal);
    pthread_mutex_lock(&a->mu);
    txn_table_clear(&a->txns);
    pthread_mutex_unlock(&a->mu);
}
