/* agent: see agent.h. */
#include "agent.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

#include "log.h"
#include "mono.h"
#include "runcmd.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#define INVENTORY_TIMEOUT_MS 500
#define RETRY_RESUME_MS 500.0

static double
clock_mono(void *opaque)
{
    (void)opaque;
    return mono_ms();
}

static void
cond_wait_ms(struct agent *a, double ms)
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

static struct vm *
find_vm(struct agent *a, const char *name)
{
    for (int i = 0; i < a->nvms; i++)
        if (strcmp(a->vms[i].cfg->name, name) == 0)
            return &a->vms[i];
    return NULL;
}

/* "vm/node" → VM and disk index; -1 when unknown. */
static int
find_disk(struct agent *a, const char *id, struct vm **vmp, int *idx)
{
    const char *slash = strrchr(id, '/');
    char vmname[256];
    struct vm *v;

    if (!slash || (size_t)(slash - id) >= sizeof(vmname))
        return -1;
    memcpy(vmname, id, (size_t)(slash - id));
    vmname[slash - id] = '\0';
    if (!(v = find_vm(a, vmname)))
        return -1;
    for (int d = 0; d < v->cfg->ndisks; d++)
        if (strcmp(v->cfg->disks[d].node, slash + 1) == 0) {
            *vmp = v;
            *idx = d;
            return 0;
        }
    return -1;
}

/* Runs fn over n items, one thread per item (inline when n == 1). */
typedef void *(*par_fn)(void *);

static void
run_parallel(par_fn fn, void *items, size_t size, int n)
{
    pthread_t th[CFG_MAX_VMS];
    int started[CFG_MAX_VMS] = {0};

    if (n == 1) {
        fn(items);
        return;
    }
    for (int i = 0; i < n && i < CFG_MAX_VMS; i++)
        started[i] = pthread_create(&th[i], NULL, fn,
                                    (char *)items + (size_t)i * size) == 0;
    for (int i = 0; i < n && i < CFG_MAX_VMS; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        else
            fn((char *)items + (size_t)i * size);
    }
}

/* ---- resuming ---------------------------------------------------------- */

struct resume_job {
    struct agent *a;
    struct vm *vm;
    const char *why;
    const char *txn;
    double cont_ms;
    double t_end;           /* when cont returned */
    double paused_ms;       /* pause window ended by this cont, -1 unknown */
    int rc;
    struct qmp_err err;
};

/* Resumes one VM; on success clears its journal entry, on failure marks
 * it for the reaper to retry (invariant 2: never left paused). */
/*
 * Thaws the guest filesystems if this VM's prepare opened its guest agent
 * (after a freeze, and also after a failed one: a slow agent may freeze
 * after we gave up).  Runs after cont: a paused guest cannot answer.  On
 * commit it runs in resume_one, i.e. after this VM's cont and before the
 * commit reply is built, so the reply carries thaw_ms and thaw_error; the
 * thaw never lengthens the pause, only the reply.
 *
 * A thaw the guest agent answered removes the VM's `frozen` journal entry
 * of txn (any txn when NULL); a failed one keeps it, so that the next start
 * of the agent tries once more (agent-protocol §7).  Returns 0 (thawed),
 * -1 (failed, reason in v->thaw_error) or 1 (no guest agent open: nothing
 * to thaw).
 */
static int
thaw_vm(struct agent *a, struct vm *v, const char *txn)
{
    struct vm_guest *g;
    char err[256] = "", jerr[256];
    double t0 = mono_ms();
    int rc, nfs = 0;

    pthread_mutex_lock(&a->mu);
    g = v->guest;
    v->guest = NULL;
    pthread_mutex_unlock(&a->mu);
    if (!g)
        return 1;
    rc = v->ops->guest_thaw(g, &nfs, err, sizeof(err));
    v->ops->guest_close(g);
    pthread_mutex_lock(&a->mu);
    v->thaw_ms = mono_ms() - t0;
    /* A guest left frozen blocks its own writes (an outage), so a failed
     * thaw is reported upstream (commit reply `thaw_error`, stats
     * `thaw_failed`), not only logged.  An empty err still means failure. */
    snprintf(v->thaw_error, sizeof(v->thaw_error), "%s", rc == 0 ? "" :
             err[0] ? err : "guest-fsfreeze-thaw failed");
    pthread_mutex_unlock(&a->mu);
    if (rc == 0) {
        log_info("event=thawed vm=%s txn=%s filesystems=%d thaw_ms=%.3f",
                 v->cfg->name, txn ? txn : "-", nfs, mono_ms() - t0);
        if (journal_remove_kind(a->journal, JOURNAL_FROZEN, v->cfg->name, txn,
                                jerr, sizeof(jerr)) < 0)
            log_warnx("event=journal_error vm=%s msg=\"%s\"", v->cfg->name,
                      jerr);
    } else {
        atomic_fetch_add(&a->n_thaw_failed, 1);
        log_warnx("event=thaw_failed vm=%s txn=%s msg=\"%s\"", v->cfg->name,
                  txn ? txn : "-", err);
    }
    return rc == 0 ? 0 : -1;
}

static void *
resume_one(void *arg)
{
    struct resume_job *j = arg;
    struct agent *a = j->a;
    char jerr[256];
    double t0 = mono_ms();

    j->rc = vm_cont(j->vm, a->cfg.qmp_timeout_ms, &j->err);
    j->t_end = mono_ms();
    j->cont_ms = j->t_end - t0;
    pthread_mutex_lock(&a->mu);
    j->paused_ms = -1;
    if (j->rc == 0) {
        j->vm->needs_resume = 0;
        if (j->vm->paused_at > 0)
            j->paused_ms = j->t_end - j->vm->paused_at;
        j->vm->paused_at = 0;
    } else {
        j->vm->needs_resume = 1;
        /* A retry passes needs_resume_txn itself as txn: copying it onto
         * itself (overlapping snprintf) emptied it, and the thaw after the
         * retry's cont then matched no journal entry. */
        if (j->txn != j->vm->needs_resume_txn)
            snprintf(j->vm->needs_resume_txn,
                     sizeof(j->vm->needs_resume_txn), "%s",
                     j->txn ? j->txn : "-");
    }
    pthread_mutex_unlock(&a->mu);
    if (j->rc == 0) {
        if (journal_remove(a->journal, j->vm->cfg->name, jerr,
                           sizeof(jerr)) < 0)
            log_warnx("event=journal_error vm=%s msg=\"%s\"",
                      j->vm->cfg->name, jerr);
        log_info("event=resumed vm=%s txn=%s why=%s cont_ms=%.3f "
                 "paused_ms=%.3f", j->vm->cfg->name, j->txn ? j->txn : "-",
                 j->why, j->cont_ms, j->paused_ms);
        thaw_vm(a, j->vm, j->txn);
    } else {
        log_warnx("event=resume_failed vm=%s txn=%s why=%s msg=\"%s\" "
                  "retry=yes", j->vm->cfg->name, j->txn ? j->txn : "-",
                  j->why, j->err.msg);
    }
    return NULL;
}

static void
resume_vms(struct agent *a, struct vm **vms, int n, const char *txn,
           const char *why, struct resume_job *jobs)
{
    for (int i = 0; i < n; i++) {
        memset(&jobs[i], 0, sizeof(jobs[i]));
        jobs[i].a = a;
        jobs[i].vm = vms[i];
        jobs[i].why = why;
        jobs[i].txn = txn;
    }
    if (n > 0)
        run_parallel(resume_one, jobs, sizeof(*jobs), n);
}

struct expire_arg {
    struct agent *a;
    struct txn *x;
};

/* The lease fired: resume the txn's VMs, then mark it EXPIRED. */
static void
expire_txn(struct agent *a, struct txn *x)
{
    struct vm *vms[CFG_MAX_VMS];
    struct resume_job jobs[CFG_MAX_VMS];
    int n = 0;

    for (int i = 0; i < x->nvms; i++)
        if ((vms[n] = find_vm(a, x->vms[i])))
            n++;
    resume_vms(a, vms, n, x->id, "lease_expired", jobs);
    atomic_fetch_add(&a->resumed_by_lease, n);
    atomic_fetch_add(&a->n_expired, 1);
    log_info("event=lease_expired txn=%s vms=%d", x->id, n);
    pthread_mutex_lock(&a->mu);
    txn_finish_expire(&a->txns, x);
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mu);
}

static void *
expire_thread(void *arg)
{
    struct expire_arg *e = arg;

    expire_txn(e->a, e->x);
    free(e);
    return NULL;
}

struct retry_arg {
    struct agent *a;
    struct vm *vm;
};

static int retrying[CFG_MAX_VMS];   /* guarded by a->mu */
static double last_retry[CFG_MAX_VMS];

static void *
retry_thread(void *arg)
{
    struct retry_arg *r = arg;
    struct resume_job j = {.a = r->a, .vm = r->vm, .why = "retry",
                           .txn = r->vm->needs_resume_txn};
    int idx = (int)(r->vm - r->a->vms);

    resume_one(&j);
    pthread_mutex_lock(&r->a->mu);
    retrying[idx] = 0;
    pthread_mutex_unlock(&r->a->mu);
    free(r);
    return NULL;
}

static void
spawn_detached(void *(*fn)(void *), void *arg)
{
    pthread_t th;
    pthread_attr_t at;

    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &at, fn, arg) != 0)
        fn(arg);    /* no thread: do it here, late rather than never */
    pthread_attr_destroy(&at);
}

/*
 * The reaper never calls a VM itself (a hung QEMU would delay every other
 * lease); it claims due work under a.mu and hands it to detached threads.
 */
static void *
reaper_main(void *arg)
{
    struct agent *a = arg;

    pthread_mutex_lock(&a->mu);
    while (!a->stopping) {
        struct txn *x;
        double next;

        while ((x = lease_claim_due(&a->txns))) {
            struct expire_arg *e = malloc(sizeof(*e));
            if (!e) {
                pthread_mutex_unlock(&a->mu);
                expire_txn(a, x);
                pthread_mutex_lock(&a->mu);
                continue;
            }
            e->a = a;
            e->x = x;
            spawn_detached(expire_thread, e);
        }
        for (int i = 0; i < a->nvms; i++) {
            if (a->vms[i].needs_resume && !retrying[i] &&
                mono_ms() - last_retry[i] >= RETRY_RESUME_MS) {
                struct retry_arg *r = malloc(sizeof(*r));
                if (!r)
                    continue;
                r->a = a;
                r->vm = &a->vms[i];
                retrying[i] = 1;
                last_retry[i] = mono_ms();
                spawn_detached(retry_thread, r);
            }
        }
        txn_gc(&a->txns);
        next = lease_next_in(&a->txns);
        cond_wait_ms(a, next < 0 || next > 100 ? 100 : next);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

/* ---- start / stop -------------------------------------------------------- */

/* The journal's entry of (kind, vm) among e[0..n), or NULL. */
static const struct journal_entry *
entry_of(const struct journal_entry *e, int n, enum journal_kind kind,
         const char *vm)
{
    for (int i = 0; i < n; i++)
        if (e[i].kind == kind && strcmp(e[i].vm, vm) == 0)
            return &e[i];
    return NULL;
}

/*
 * At start, undo what a previous run left done (agent-protocol §7), per
 * VM named in the journal:
 *
 *   paused + frozen:  open the guest agent, cont, then thaw (resume_one;
 *                     a paused guest cannot answer the thaw).  If cont
 *                     fails, the reaper's retry thaws after its cont.
 *   paused only:      cont.
 *   frozen only:      thaw (killed after cont, or between freeze and
 *                     stop, or a thaw that failed before).
 *
 * The recovery thaw is tried once: a failure is logged (journal_thaw
 * result=failed) and the entry dropped, since retrying a guest agent that
 * does not answer would only repeat the log; the guest may still be frozen
 * and needs an operator.  A thaw of a guest that is not frozen is harmless
 * (guest-fsfreeze-thaw returns 0), so an entry left by a freeze that never
 * happened costs one round trip.
 */
static void
journal_recover(struct agent *a)
{
    struct journal_entry *e = NULL;
    int n = 0;

    if (journal_entries(a->journal, &e, &n) < 0)
        return;
    for (int i = 0; i < n; i++) {
        const struct journal_entry *p, *fz;
        struct vm *v;
        char jerr[256], err[256] = "";
        int deferred;

        /* one pass per VM: at its first entry */
        if (entry_of(e, i, JOURNAL_PAUSED, e[i].vm) ||
            entry_of(e, i, JOURNAL_FROZEN, e[i].vm))
            continue;
        p = entry_of(e, n, JOURNAL_PAUSED, e[i].vm);
        fz = entry_of(e, n, JOURNAL_FROZEN, e[i].vm);
        if (!(v = find_vm(a, e[i].vm))) {
            if (p)
                log_warnx("event=journal_resume txn=%s vm=%s "
                          "result=unknown_vm", p->txn, p->vm);
            if (fz)
                log_warnx("event=journal_thaw txn=%s vm=%s result=unknown_vm",
                          fz->txn, fz->vm);
            journal_remove(a->journal, e[i].vm, jerr, sizeof(jerr));
            journal_remove_kind(a->journal, JOURNAL_FROZEN, e[i].vm, NULL,
                                jerr, sizeof(jerr));
            continue;
        }
        if (fz) {
            struct vm_guest *g = NULL;

            if (v->ops->guest_open(v, &g, err, sizeof(err)) == 0) {
                pthread_mutex_lock(&a->mu);
                v->guest = g;   /* thaw_vm takes it */
                pthread_mutex_unlock(&a->mu);
            }
        }
        pthread_mutex_lock(&a->mu);
        v->thaw_error[0] = '\0';
        pthread_mutex_unlock(&a->mu);
        if (p) {
            struct resume_job j = {.a = a, .vm = v, .why = "journal",
                                   .txn = p->txn};

            resume_one(&j);     /* cont, then thaw_vm if v->guest is open */
            atomic_fetch_add(&a->resumed_by_journal, j.rc == 0);
            log_info("event=journal_resume txn=%s vm=%s result=%s",
                     p->txn, p->vm, j.rc == 0 ? "resumed" : "retrying");
            pthread_mutex_lock(&a->mu);
            deferred = v->guest != NULL;
            pthread_mutex_unlock(&a->mu);
            if (fz && deferred) {
                /* cont failed: the reaper's retry thaws after its cont,
                 * and the entry stays until a thaw is answered. */
                log_warnx("event=journal_thaw txn=%s vm=%s result=deferred "
                          "msg=\"thaw after the resume retry\"", fz->txn,
                          fz->vm);
                continue;
            }
        } else {
            thaw_vm(a, v, fz->txn);
        }
        if (!fz)
            continue;
        pthread_mutex_lock(&a->mu);
        if (!err[0] && v->thaw_error[0])
            snprintf(err, sizeof(err), "%s", v->thaw_error);
        pthread_mutex_unlock(&a->mu);
        if (!err[0])
            log_info("event=journal_thaw txn=%s vm=%s result=ok", fz->txn,
                     fz->vm);
        else
            log_warnx("event=journal_thaw txn=%s vm=%s result=failed "
                      "entry=dropped msg=\"%s\"", fz->txn, fz->vm, err);
        /* thaw_vm removed it when the txns agree; this covers an entry of
         * an older txn, and the failure that is dropped on purpose. */
        if (journal_remove_kind(a->journal, JOURNAL_FROZEN, fz->vm, NULL,
                                jerr, sizeof(jerr)) < 0)
            log_warnx("event=journal_error vm=%s msg=\"%s\"", fz->vm, jerr);
    }
    free(e);
}

/*
 * Records this agent's RADOS client address next to the journal and
 * blocklists the one recorded by the previous run, if any (see
 * rbdsnap_blocklist for why).  Failures are logged, not fatal.
 */
static void
fence_previous(struct agent *a)
{
    char path[1100], old[256] = "", cur[256], err[256];
    FILE *f;

    snprintf(path, sizeof(path), "%s.rados-client", a->cfg.journal);
    if ((f = fopen(path, "r"))) {
        if (!fgets(old, sizeof(old), f))
            old[0] = '\0';
        old[strcspn(old, "\n")] = '\0';
        fclose(f);
    }
    if (rbdsnap_client_addr(a->ceph, cur, sizeof(cur), err, sizeof(err)) < 0) {
        log_warnx("event=rados_addr_failed msg=\"%s\"", err);
        return;
    }
    if (old[0] && strcmp(old, cur) != 0) {
        if (rbdsnap_blocklist(a->ceph, old, 3600, err, sizeof(err)) < 0)
            log_warnx("event=fence_previous_failed addr=%s msg=\"%s\"", old,
                      err);
        else
            log_info("event=fence_previous addr=%s", old);
    }
    if ((f = fopen(path, "w"))) {
        fprintf(f, "%s\n", cur);
        fflush(f);
        fsync(fileno(f));
        fclose(f);
    }
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

/* Opens every QMP socket now, so that no pause window holds a connect,
 * greeting and qmp_capabilities (design "Coordinator latency"). */
static void
connect_all(struct agent *a)
{
    if (a->nvms > 0)
        run_parallel(connect_one, a->vms, sizeof(a->vms[0]), a->nvms);
}

/* Opens the VM's rbd disks that are not open yet; -1 with err on the
 * first failure (those opened stay open). */
static int
open_images(struct agent *a, struct vm *v, char *err, size_t errlen)
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

int
agent_start(struct agent *a, const struct agent_config *cfg, char *err,
            size_t errlen)
{
    pthread_condattr_t ca;
    int need_ceph = 0;

    memset(a, 0, sizeof(*a));
    a->cfg = *cfg;
    a->started_ms = mono_ms();
    pthread_mutex_init(&a->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->cond, &ca);
    pthread_condattr_destroy(&ca);
    txn_table_init(&a->txns, clock_mono, NULL);

    if (vm_host_open(&a->host, &a->cfg, err, errlen) < 0)
        return -1;
    for (int i = 0; i < a->cfg.nvms; i++) {
        if (vm_open(&a->vms[i], &a->cfg.vms[i], &a->host) < 0) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        a->nvms++;
        for (int d = 0; d < a->cfg.vms[i].ndisks; d++)
            if (a->cfg.vms[i].disks[d].backend == CFG_BACKEND_RBD)
                need_ceph = 1;
    }
    if (need_ceph && a->cfg.ceph_conf[0]) {
        if (rbdsnap_connect(a->cfg.ceph_conf, a->cfg.ceph_id,
                            a->cfg.ceph_keyring[0] ? a->cfg.ceph_keyring : NULL,
                            &a->ceph, err, errlen) < 0)
            return -1;
        fence_previous(a);
        /* Images are opened once, now, so that commit holds no open.  A
         * standby VM (start =, no QMP socket yet: a DR copy that failover
         * boots) is the exception: its images may not exist yet (the first
         * replication creates them) and an open handle would watch images
         * that replication and rollback rewrite; vm.start opens them. */
        for (int i = 0; i < a->nvms; i++) {
            if (vm_is_standby(&a->vms[i])) {
                a->vms[i].images_deferred = 1;
                log_info("event=standby vm=%s qmp=%s images=deferred",
                         a->cfg.vms[i].name, a->cfg.vms[i].qmp);
                continue;
            }
            if (open_images(a, &a->vms[i], err, errlen) < 0) {
                if (!a->cfg.vms[i].start[0])
                    return -1;
                a->vms[i].images_deferred = 1;
                log_warnx("event=rbd_open_deferred vm=%s msg=\"%s\"",
                          a->cfg.vms[i].name, err);
                err[0] = '\0';
            }
        }
    }
    if (journal_open(a->cfg.journal, &a->journal, err, errlen) < 0)
        return -1;
    connect_all(a);
    journal_recover(a);
    if (pthread_create(&a->reaper, NULL, reaper_main, a) != 0) {
        snprintf(err, errlen, "cannot start the lease thread");
        return -1;
    }
    a->reaper_started = 1;
    for (int i = 0; i < a->nvms; i++)
        log_info("event=vm vm=%s driver=%s method=%s disks=%d",
                 a->cfg.vms[i].name,
                 a->vms[i].ops->name,
                 config_method_name(a->cfg.vms[i].method),
                 a->cfg.vms[i].ndisks);
    return 0;
}

void
agent_stop(struct agent *a)
{
    struct vm *vms[CFG_MAX_VMS];
    struct resume_job jobs[CFG_MAX_VMS];
    int n = 0;

    /* Let in-flight prepares, commits, expiries, aborts and resume retries
     * finish (bounded): they use the VMs that are about to be freed. */
    pthread_mutex_lock(&a->mu);
    for (double end = mono_ms() + 15000; mono_ms() < end;) {
        int busy = 0;
        for (struct txn *x = a->txns.head; x; x = x->next)
            busy |= x->state == TXN_PREPARING || x->state == TXN_COMMITTING ||
                    x->state == TXN_EXPIRING || x->state == TXN_ABORTING;
        for (int i = 0; i < a->nvms; i++)
            busy |= retrying[i];
        if (!busy)
            break;
        cond_wait_ms(a, 50);
    }
    /* Leaving: nobody will commit, so resume everything still paused. */
    a->stopping = 1;
    for (struct txn *x = a->txns.head; x; x = x->next)
        if (x->state == TXN_PREPARED)
            for (int i = 0; i < x->nvms && n < CFG_MAX_VMS; i++)
                if ((vms[n] = find_vm(a, x->vms[i])))
                    n++;
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mu);
    resume_vms(a, vms, n, NULL, "agent_stop", jobs);
    if (a->reaper_started)
        pthread_join(a->reaper, NULL);
    for (int i = 0; i < a->nvms; i++)
        vm_close(&a->vms[i]);
    rbdsnap_cluster_free(a->ceph);
    vm_host_close(&a->host);
    journal_free(a->journal);
    pthread_mutex_lock(&a->mu);
    txn_table_clear(&a->txns);
    pthread_mutex_unlock(&a->mu);
}

/* ---- handlers ---------------------------------------------------------- */

#define FAIL(c, ...) do { *code = (c); snprintf(msg, msglen, __VA_ARGS__); \
                          goto cleanup; } while (0)

static json_t *
disk_json(const struct vm *v, int d)
{
    const struct cfg_disk *dk = &v->cfg->disks[d];
    json_t *o = json_pack("{s:s++,s:s,s:s}", "id", v->cfg->name, "/",
                          dk->node, "node", dk->node, "backend",
                          dk->backend == CFG_BACKEND_RBD ? "rbd" : "qcow2");

    if (dk->backend == CFG_BACKEND_RBD) {
        json_object_set_new(o, "pool", json_string(dk->pool));
        json_object_set_new(o, "image", json_string(dk->image));
    } else {
        json_object_set_new(o, "file", json_string(dk->file));
    }
    return o;
}

static json_t *
h_hello(struct agent *a)
{
    json_t *methods = json_pack("[s]", snap_qmp_ops.name);
    json_t *drivers = json_array();
    const struct vm_ops *d;

    /* librbd snapshots need the [ceph] connection */
    if (a->ceph)
        json_array_insert_new(methods, 0, json_string(snap_rbd_ops.name));
    for (int i = 0; (d = vm_driver_at(i)); i++)
        json_array_append_new(drivers, json_string(d->name));
    return json_pack("{s:s,s:i,s:s,s:o,s:[sssssssssss],s:o}",
                     "version", CUTPOINT_VERSION, "protocol", 1,
                     "host", a->cfg.host, "drivers", drivers,
                     "capabilities", "hello", "inventory", "prepare",
                     "commit", "abort", "resume", "snapshot.list",
                     "snapshot.delete", "vm.start", "vm.stop", "stats",
                     "snapshot_methods", methods);
}

struct inv_job {
    struct agent *a;
    struct vm *vm;
    const char *state;
};

static void *
inv_one(void *arg)
{
    struct inv_job *j = arg;

    j->state = vm_state(j->vm, INVENTORY_TIMEOUT_MS);
    return NULL;
}

static json_t *
h_inventory(struct agent *a)
{
    struct inv_job jobs[CFG_MAX_VMS];
    json_t *vms = json_array();

    for (int i = 0; i < a->nvms; i++)
        jobs[i] = (struct inv_job){.a = a, .vm = &a->vms[i]};
    if (a->nvms)
        run_parallel(inv_one, jobs, sizeof(*jobs), a->nvms);
    for (int i = 0; i < a->nvms; i++) {
        struct vm *v = &a->vms[i];
        json_t *disks = json_array();
        for (int d = 0; d < v->cfg->ndisks; d++)
            json_array_append_new(disks, disk_json(v, d));
        json_array_append_new(vms, json_pack(
            "{s:s,s:s,s:s,s:s,s:o}", "name", v->cfg->name, "driver",
            v->ops->name, "state",
            jobs[i].state, "method", v->snap->name, "disks", disks));
    }
    return json_pack("{s:o}", "vms", vms);
}

static json_t *
h_stats(struct agent *a)
{
    return json_pack("{s:f,s:I,s:I,s:I,s:{s:I,s:I,s:I,s:I},s:I,s:I,s:I}",
                     "uptime_ms", mono_ms() - a->started_ms,
                     "connections", (json_int_t)atomic_load(&a->connections),
                     "requests", (json_int_t)atomic_load(&a->requests),
                     "errors", (json_int_t)atomic_load(&a->errors),
                     "txns",
                     "prepared", (json_int_t)atomic_load(&a->n_prepared),
                     "committed", (json_int_t)atomic_load(&a->n_committed),
                     "aborted", (json_int_t)atomic_load(&a->n_aborted),
                     "expired", (json_int_t)atomic_load(&a->n_expired),
                     "resumed_by_lease",
                     (json_int_t)atomic_load(&a->resumed_by_lease),
                     "resumed_by_journal",
                     (json_int_t)atomic_load(&a->resumed_by_journal),
                     "thaw_failed",
                     (json_int_t)atomic_load(&a->n_thaw_failed));
}

/* The stored error code of a failed txn, as the static string. */
static const char *
code_static(const char *c)
{
    static const char *codes[] = {"BUDGET_EXCEEDED", "SNAPSHOT_FAILED",
                                  "QMP_TIMEOUT", "QMP_ERROR", "INTERNAL"};

    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
        if (strcmp(c, codes[i]) == 0)
            return codes[i];
    return "INTERNAL";
}

/* Waits (a.mu held) until txn id is not in a transitional state. */
static struct txn *
wait_stable(struct agent *a, const char *id)
{
    struct txn *x;

    for (;;) {
        x = txn_find(&a->txns, id);
        if (!x || !(x->state == TXN_PREPARING || x->state == TXN_COMMITTING ||
                    x->state == TXN_EXPIRING || x->state == TXN_ABORTING))
            return x;
        cond_wait_ms(a, 100);
    }
}

struct prep_job {
    struct agent *a;
    struct vm *vm;
    const char *txn;
    int freeze_timeout_ms;      /* min(config, prepare's freeze_timeout_ms) */
    double t0, t1;
    int rc;
    int journaled;
    enum qmp_errkind qmp_kind;
    const char *code;
    char msg[512];
};

static void *
prep_one(void *arg)
{
    struct prep_job *j = arg;
    struct qmp_err err;

    j->t0 = mono_ms();
    j->rc = vm_stop(j->vm, j->a->cfg.qmp_timeout_ms, &err);
    j->t1 = mono_ms();
    if (j->rc == 0) {
        pthread_mutex_lock(&j->a->mu);
        j->vm->paused_at = j->t0;
        pthread_mutex_unlock(&j->a->mu);
    }
    if (j->rc < 0) {
        j->qmp_kind = err.kind;
        j->code = vm_err_code(&err);
        snprintf(j->msg, sizeof(j->msg), "vm %s: %s", j->vm->cfg->name,
                 err.msg);
    }
    return NULL;
}

/*
 * quiesce fs-freeze, one VM, before any VM of the txn is stopped (so the
 * freeze wait is never inside a pause window).  Any failure falls back to
 * crash consistency with the reason recorded; the txn carries on.
 */
static void *
freeze_one(void *arg)
{
    struct prep_job *j = arg;
    struct vm *v = j->vm;
    struct vm_guest *g = NULL;
    char err[256] = "";
    double t0 = mono_ms();
    int nfs = 0, rc = -1;

    if (v->ops->guest_open(v, &g, err, sizeof(err)) == 0)
        rc = v->ops->guest_freeze(g, j->freeze_timeout_ms, &nfs, err,
                                  sizeof(err));
    pthread_mutex_lock(&j->a->mu);
    v->freeze_ms = mono_ms() - t0;
    v->consistency = rc == 0 ? "fs-freeze" : "crash";
    snprintf(v->freeze_error, sizeof(v->freeze_error), "%s",
             rc == 0 ? "" : err);
    v->guest = g;               /* thawed after cont, even if freeze failed */
    pthread_mutex_unlock(&j->a->mu);
    if (!g) {
        /* Nothing reached the guest: it cannot be frozen by this txn. */
        char jerr[256];
        if (journal_remove_kind(j->a->journal, JOURNAL_FROZEN, v->cfg->name,
                                j->txn, jerr, sizeof(jerr)) < 0)
            log_warnx("event=journal_error vm=%s msg=\"%s\"", v->cfg->name,
                      jerr);
    }
    if (rc == 0)
        log_info("event=frozen vm=%s txn=%s filesystems=%d freeze_ms=%.3f",
                 v->cfg->name, j->txn, nfs, v->freeze_ms);
    else
        log_warnx("event=freeze_failed vm=%s txn=%s fallback=crash "
                  "msg=\"%s\"", v->cfg->name, j->txn, err);
    return NULL;
}

/* The quiesce facts of one VM for a reply. */
static void
add_quiesce(struct agent *a, json_t *o, struct vm *v, int with_thaw)
{
    pthread_mutex_lock(&a->mu);
    json_object_set_new(o, "consistency",
                        json_string(v->consistency ? v->consistency :
                                    "crash"));
    json_object_set_new(o, "freeze_ms", json_real(v->freeze_ms));
    if (with_thaw) {
        json_object_set_new(o, "thaw_ms", v->thaw_ms < 0 ? json_null() :
                            json_real(v->thaw_ms));
        json_object_set_new(o, "thaw_error", v->thaw_error[0] ?
                            json_string(v->thaw_error) : json_null());
    }
    json_object_set_new(o, "freeze_error", v->freeze_error[0] ?
                        json_string(v->freeze_error) : json_null());
    pthread_mutex_unlock(&a->mu);
}

static int
same_vms(const struct txn *x, json_t *vms)
{
    size_t i;
    json_t *v;

    if ((size_t)x->nvms != json_array_size(vms))
        return 0;
    json_array_foreach(vms, i, v) {
        int found = 0;
        for (int k = 0; k < x->nvms; k++)
            found |= strcmp(x->vms[k], json_string_value(v)) == 0;
        if (!found)
            return 0;
    }
    return 1;
}

static json_t *
h_prepare(struct agent *a, json_t *args, const char **code, char *msg,
          size_t msglen, json_t **err_result)
{
    const char *id = json_string_value(json_object_get(args, "txn"));
    json_t *jvms = json_object_get(args, "vms"), *v, *result = NULL, *arr;
    json_int_t lease = json_integer_value(json_object_get(args, "lease_ms"));
    const char *quiesce = json_string_value(json_object_get(args, "quiesce"));
    json_t *jft = json_object_get(args, "freeze_timeout_ms");
    int freeze, freeze_ms = a->cfg.freeze_timeout_ms;
    struct prep_job jobs[CFG_MAX_VMS];
    struct vm *vms[CFG_MAX_VMS], *undo[CFG_MAX_VMS];
    struct resume_job rj[CFG_MAX_VMS];
    const char *names[CFG_MAX_VMS];
    struct txn *x;
    int n = (int)json_array_size(jvms), nundo = 0, failed = -1;
    size_t i;

    if (n > CFG_MAX_VMS)
        FAIL("BAD_REQUEST", "too many VMs (%d > %d)", n, CFG_MAX_VMS);
    if (quiesce && strcmp(quiesce, "crash") && strcmp(quiesce, "fs-freeze"))
        FAIL("BAD_REQUEST", "args.quiesce must be \"crash\" or "
             "\"fs-freeze\", got \"%s\"", quiesce);
    freeze = quiesce && strcmp(quiesce, "fs-freeze") == 0;
    /* The coordinator sizes its wait for PREPARED on the freeze timeout it
     * sends; taking the smaller of it and ours keeps that wait long enough
     * by construction, whatever this agent's config says.  Absent (older
     * coordinators): our config alone. */
    if (jft && json_integer_value(jft) < freeze_ms)
        freeze_ms = (int)json_integer_value(jft);
    json_array_foreach(jvms, i, v) {
        names[i] = json_string_value(v);
        if (!(vms[i] = find_vm(a, names[i])))
            FAIL("UNKNOWN_VM", "unknown vm %s", names[i]);
    }
    pthread_mutex_lock(&a->mu);
    x = wait_stable(a, id);
    if (x) {
        switch (x->state) {
        case TXN_PREPARED:
            if (same_vms(x, jvms))
                result = json_deep_copy(x->prepare_result);
            else
                *code = "BAD_REQUEST", snprintf(msg, msglen, "txn %s is "
                        "already prepared with other VMs", id);
            break;
        case TXN_EXPIRED:
            *code = "EXPIRED";
            snprintf(msg, msglen, "txn %s: lease expired", id);
            break;
        case TXN_ABORTED:
            *code = "ABORTED";
            snprintf(msg, msglen, "txn %s was aborted", id);
            break;
        default:
            *code = "BAD_REQUEST";
            snprintf(msg, msglen, "txn %s is already %s", id,
                     txn_state_name(x->state));
        }
        pthread_mutex_unlock(&a->mu);
        return result;
    }
    for (int k = 0; k < n; k++) {
        if (vms[k]->starting) {
            /* vm.start is still opening its disks: no cut of it yet. */
            pthread_mutex_unlock(&a->mu);
            FAIL("BUSY", "vm %s is being started (vm.start)", names[k]);
        }
        if (vms[k]->needs_resume) {
            /* A background resume is pending: pausing now would let that
             * late `cont` break the new cut. */
            pthread_mutex_unlock(&a->mu);
            FAIL("BUSY", "vm %s has a pending resume (QEMU not answering)",
                 names[k]);
        }
    }
    x = txn_begin_prepare(&a->txns, id, names, n, code, msg, msglen);
    pthread_mutex_unlock(&a->mu);
    if (!x)
        return NULL;

    /* Durable before the pause (agent-protocol §7): a crash after `stop`
     * must leave a record that makes the next start resume the VM.  One
     * write for all VMs, so that no VM's pause waits for another's fsync.
     * With fs-freeze the same write records `frozen` for every VM with a
     * guest agent, before its freeze: a crash before the thaw must leave a
     * record that makes the next start thaw the guest. */
    {
        char jerr[256] = "out of memory";
        struct journal_entry *je = calloc((size_t)(2 * n + 1), sizeof(*je));
        int nje = 0, jrc = -1;

        for (int k = 0; je && k < n; k++) {
            je[nje].kind = JOURNAL_PAUSED;
            snprintf(je[nje].txn, sizeof(je[nje].txn), "%s", x->id);
            snprintf(je[nje].vm, sizeof(je[nje].vm), "%s", names[k]);
            nje++;
            if (freeze && vms[k]->ops->guest_configured(vms[k])) {
                je[nje] = je[nje - 1];
                je[nje].kind = JOURNAL_FROZEN;
                nje++;
            }
        }
        if (je)
            jrc = journal_put(a->journal, je, nje, jerr, sizeof(jerr));
        free(je);
        if (jrc < 0) {
            pthread_mutex_lock(&a->mu);
            txn_fail_prepare(&a->txns, x);
            pthread_cond_broadcast(&a->cond);
            pthread_mutex_unlock(&a->mu);
            FAIL("INTERNAL", "no VM paused: %s", jerr);
        }
    }
    for (int k = 0; k < n; k++) {
        jobs[k] = (struct prep_job){.a = a, .vm = vms[k], .txn = x->id,
                                    .journaled = 1,
                                    .freeze_timeout_ms = freeze_ms};
        pthread_mutex_lock(&a->mu);
        vms[k]->consistency = "crash";
        vms[k]->freeze_ms = 0;
        vms[k]->thaw_ms = -1;
        vms[k]->freeze_error[0] = '\0';
        vms[k]->thaw_error[0] = '\0';
        pthread_mutex_unlock(&a->mu);
    }
    /* All freezes first, then all stops: the freeze wait (up to sync +
     * freeze deadlines) is outside every VM's pause window. */
    if (freeze)
        run_parallel(freeze_one, jobs, sizeof(*jobs), n);
    run_parallel(prep_one, jobs, sizeof(*jobs), n);

    for (int k = 0; k < n; k++) {
        if (jobs[k].rc < 0 && failed < 0)
            failed = k;
        if (!jobs[k].journaled)
            continue;
        if (jobs[k].rc == 0) {
            undo[nundo++] = vms[k];
        } else if (jobs[k].qmp_kind == QMP_E_ERROR) {
            /* QEMU refused the stop: not paused, nothing to undo. */
            char jerr[256];
            journal_remove(a->journal, vms[k]->cfg->name, jerr, sizeof(jerr));
        } else {
            /* Timed out or lost: a hung QEMU may still run the queued
             * `stop` later.  The reaper keeps sending `cont` in the
             * background, so the error reply is not delayed by it. */
            pthread_mutex_lock(&a->mu);
            vms[k]->needs_resume = 1;
            snprintf(vms[k]->needs_resume_txn,
                     sizeof(vms[k]->needs_resume_txn), "%s", x->id);
            pthread_mutex_unlock(&a->mu);
        }
    }
    if (failed >= 0) {
        resume_vms(a, undo, nundo, x->id, "prepare_failed", rj);
        for (int k = 0; k < n; k++)
            if (jobs[k].rc < 0)     /* not paused: thaw now */
                thaw_vm(a, vms[k], x->id);
        /* Partial facts (agent-protocol §3.4): what was paused and undone. */
        arr = json_array();
        for (int k = 0, u = 0; k < n; k++) {
            json_t *o = json_pack("{s:s,s:b}", "vm", names[k], "stopped",
                                  jobs[k].rc == 0);
            if (jobs[k].journaled)
                json_object_set_new(o, "stop_ms",
                                    json_real(jobs[k].t1 - jobs[k].t0));
            if (jobs[k].rc == 0 && u < nundo) {
                json_object_set_new(o, "resumed", json_boolean(rj[u].rc == 0));
                json_object_set_new(o, "cont_ms", json_real(rj[u].cont_ms));
                json_object_set_new(o, "paused_ms",
                                    json_real(rj[u].paused_ms));
                u++;
            } else if (jobs[k].rc < 0) {
                json_object_set_new(o, "error", json_string(jobs[k].msg));
            }
            json_array_append_new(arr, o);
        }
        *err_result = json_pack("{s:s,s:o}", "txn", id, "vms", arr);
        pthread_mutex_lock(&a->mu);
        txn_fail_prepare(&a->txns, x);
        pthread_cond_broadcast(&a->cond);
        pthread_mutex_unlock(&a->mu);
        log_warnx("event=prepare_failed txn=%s code=%s msg=\"%s\"", id,
                  jobs[failed].code, jobs[failed].msg);
        *code = jobs[failed].code;
        snprintf(msg, msglen, "%s", jobs[failed].msg);
        return NULL;
    }
    arr = json_array();
    for (int k = 0; k < n; k++) {
        x->t_stop0[k] = jobs[k].t0;
        x->t_stop1[k] = jobs[k].t1;
        json_t *o = json_pack("{s:s,s:f}", "vm", names[k], "stop_ms",
                              jobs[k].t1 - jobs[k].t0);
        add_quiesce(a, o, vms[k], 0);
        json_array_append_new(arr, o);
    }
    result = json_pack("{s:s,s:s,s:o,s:I}", "txn", id, "state", "prepared",
                       "vms", arr, "lease_ms", lease);
    pthread_mutex_lock(&a->mu);
    txn_prepared(&a->txns, x, (double)lease, json_deep_copy(result));
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mu);
    atomic_fetch_add(&a->n_prepared, 1);
    log_info("event=prepared txn=%s vms=%d lease_ms=%lld", id, n,
             (long long)lease);
    return result;
cleanup:
    return NULL;
}

/* --- commit ---- */

struct commit_job {
    struct agent *a;
    struct vm *vm;
    struct txn *x;
    int vmidx;                      /* index in x->vms */
    int disks[CFG_MAX_DISKS];       /* disk indexes to snapshot */
    const char *names[CFG_MAX_DISKS];
    int ndisks;
    double t_arrive, deadline;
    json_t *out;                    /* per-VM result */
    const char *code;               /* NULL when ok */
    char msg[512];
    /* filled by the steps of commit_one */
    struct snap_member *m;          /* ndisks, on commit_one's stack */
    int budget_hit;
    double ts0, ts1, tc0, tc1;      /* snapshot and cont, start and end */
    int resumed;
    const char *resume_code;
    char resume_msg[512];
};

/* Step 1: snapshot every disk of the VM through its backend, by the
 * budget deadline. */
static void
commit_snapshot(struct commit_job *j)
{
    struct snap_err err = {0};

    for (int k = 0; k < j->ndisks; k++) {
        memset(&j->m[k], 0, sizeof(j->m[k]));
        vm_snap_disk(j->vm, j->disks[k], &j->m[k].disk);
        j->m[k].name = j->names[k];
    }
    j->ts0 = mono_ms();
    if (j->ndisks > 0 &&
        j->vm->snap->create(j->m, j->ndisks, j->deadline, &j->budget_hit,
                            &err) < 0) {
        j->code = "INTERNAL";
        snprintf(j->msg, sizeof(j->msg), "%s", err.msg);
    }
    j->ts1 = mono_ms();
}

/* Step 2: resume at once: this VM's disks are done (or the budget is
 * spent).  The pause ends when cont returns, not after the journal. */
static void
commit_resume(struct commit_job *j)
{
    struct resume_job r = {.a = j->a, .vm = j->vm, .why = "commit",
                           .txn = j->x->id};

    j->tc0 = mono_ms();
    resume_one(&r);
    j->tc1 = mono_ms();
    j->resumed = r.rc == 0;
    if (j->resumed) {
        j->tc1 = j->tc0 + r.cont_ms;
    } else {
        j->resume_code = vm_err_code(&r.err);
        snprintf(j->resume_msg, sizeof(j->resume_msg), "vm %s: %s (resume "
                 "is being retried)", j->vm->cfg->name, r.err.msg);
    }
}

/* Step 3 (invariant 3): a disk counts as done only if its snapshot
 * exists; the backend checks, after cont, where its create alone is no
 * proof. */
static void
commit_confirm(struct commit_job *j)
{
    if (j->vm->snap->confirm)
        j->vm->snap->confirm(j->m, j->ndisks);
}

/* Step 4: the VM's entry of the reply, and its error if any:
 * BUDGET_EXCEEDED or SNAPSHOT_FAILED for the first failed disk, then a
 * failed resume. */
static void
commit_report(struct commit_job *j)
{
    struct txn *x = j->x;
    json_t *disks = json_array();

    for (int k = 0; k < j->ndisks; k++) {
        char did[400];
        json_t *o;

        snprintf(did, sizeof(did), "%s/%s", j->vm->cfg->name,
                 j->vm->cfg->disks[j->disks[k]].node);
        o = json_pack("{s:s,s:s,s:f,s:b}", "disk", did, "name", j->names[k],
                      "snapshot_ms", j->m[k].ms, "ok", j->m[k].ok);
        if (!j->m[k].ok) {
            json_object_set_new(o, "error", json_string(j->m[k].err));
            if (!j->code) {
                j->code = j->budget_hit ? "BUDGET_EXCEEDED" :
                    "SNAPSHOT_FAILED";
                snprintf(j->msg, sizeof(j->msg), "%s@%s: %s", did,
                         j->names[k], j->m[k].err);
            }
        }
        json_array_append_new(disks, o);
    }
    if (j->budget_hit && !j->code) {
        j->code = "BUDGET_EXCEEDED";
        snprintf(j->msg, sizeof(j->msg), "vm %s: snapshots exceeded the "
                 "budget", j->vm->cfg->name);
    }
    if (j->resume_code && !j->code) {
        j->code = j->resume_code;
        snprintf(j->msg, sizeof(j->msg), "%s", j->resume_msg);
    }
    j->out = json_pack("{s:s,s:f,s:f,s:f,s:f,s:f,s:s,s:o,s:b}",
                       "vm", j->vm->cfg->name,
                       "stop_ms", x->t_stop1[j->vmidx] - x->t_stop0[j->vmidx],
                       "barrier_ms", j->t_arrive - x->t_stop1[j->vmidx],
                       "snapshot_ms", j->ts1 - j->ts0,
                       "cont_ms", j->tc1 - j->tc0,
                       "paused_ms", j->tc1 - x->t_stop0[j->vmidx],
                       "method", j->vm->snap->name, "disks", disks,
                       "resumed", j->resumed);
    add_quiesce(j->a, j->out, j->vm, 1);
}

/* One VM's commit, in its own thread (run_parallel). */
static void *
commit_one(void *arg)
{
    struct commit_job *j = arg;
    struct snap_member m[CFG_MAX_DISKS];

    j->m = m;
    commit_snapshot(j);
    commit_resume(j);
    commit_confirm(j);
    commit_report(j);
    return NULL;
}

static json_t *
h_commit(struct agent *a, json_t *args, const char **code, char *msg,
         size_t msglen, json_t **err_result)
{
    const char *id = json_string_value(json_object_get(args, "txn"));
    json_t *snaps = json_object_get(args, "snapshots"), *nv, *result = NULL;
    json_int_t budget = json_integer_value(json_object_get(args, "budget_ms"));
    struct commit_job jobs[CFG_MAX_VMS];
    double t_arrive = mono_ms();
    const char *key, *ecode = NULL;
    char emsg[512] = "";
    struct txn *x;
    enum txn_claim claim;
    json_t *vmarr;
    int n;

    pthread_mutex_lock(&a->mu);
    x = wait_stable(a, id);
    if (!x) {
        pthread_mutex_unlock(&a->mu);
        FAIL("UNKNOWN_TXN", "txn %s was never prepared here (or the agent "
             "restarted)", id);
    }
    switch (x->state) {
    case TXN_COMMITTED:
        result = json_deep_copy(x->commit_result);
        pthread_mutex_unlock(&a->mu);
        return result;
    case TXN_FAILED:
        *code = code_static(x->err_code);
        snprintf(msg, msglen, "%s", x->err_msg);
        *err_result = json_deep_copy(x->commit_result);
        pthread_mutex_unlock(&a->mu);
        return NULL;
    case TXN_EXPIRED:
        pthread_mutex_unlock(&a->mu);
        FAIL("EXPIRED", "txn %s: lease expired before commit; its VMs were "
             "resumed", id);
    case TXN_ABORTED:
        pthread_mutex_unlock(&a->mu);
        FAIL("ABORTED", "txn %s was aborted", id);
    default:
        break;
    }
    /* Validate disks before claiming, so a bad request changes nothing. */
    n = x->nvms;
    for (int i = 0; i < n; i++) {
        jobs[i] = (struct commit_job){.a = a, .x = x, .vmidx = i,
                                      .t_arrive = t_arrive,
                                      .deadline = t_arrive + (double)budget};
        jobs[i].vm = find_vm(a, x->vms[i]);
    }
    json_object_foreach(snaps, key, nv) {
        struct vm *v;
        int d, k;
        if (find_disk(a, key, &v, &d) < 0) {
            pthread_mutex_unlock(&a->mu);
            FAIL("UNKNOWN_DISK", "unknown disk %s", key);
        }
        for (k = 0; k < n; k++)
            if (jobs[k].vm == v)
                break;
        if (k == n) {
            pthread_mutex_unlock(&a->mu);
            FAIL("UNKNOWN_DISK", "disk %s is not on a VM of txn %s", key, id);
        }
        jobs[k].disks[jobs[k].ndisks] = d;
        jobs[k].names[jobs[k].ndisks++] = json_string_value(nv);
        json_object_set(x->created, key, nv);
    }
    claim = txn_claim_commit(&a->txns, x);
    pthread_mutex_unlock(&a->mu);
    if (claim == TXN_CLAIM_EXPIRE) {
        expire_txn(a, x);
        FAIL("EXPIRED", "txn %s: lease expired before commit; its VMs were "
             "resumed", id);
    }
    if (claim != TXN_CLAIM_COMMIT)
        FAIL("INTERNAL", "txn %s in unexpected state", id);

    run_parallel(commit_one, jobs, sizeof(*jobs), n);

    vmarr = json_array();
    for (int i = 0; i < n; i++) {
        json_array_append_new(vmarr, jobs[i].out);
        /* BUDGET_EXCEEDED outranks SNAPSHOT_FAILED outranks the rest */
        if (jobs[i].code && (!ecode || (strcmp(jobs[i].code,
                                               "BUDGET_EXCEEDED") == 0 &&
                                        strcmp(ecode, "BUDGET_EXCEEDED")))) {
            ecode = jobs[i].code;
            snprintf(emsg, sizeof(emsg), "%s", jobs[i].msg);
        }
    }
    result = json_pack("{s:s,s:s,s:o,s:f}", "txn", id, "state",
                       ecode ? "failed" : "committed", "vms", vmarr,
                       "budget_ms", (double)budget);
    pthread_mutex_lock(&a->mu);
    txn_finish_commit(&a->txns, x, json_deep_copy(result), ecode, emsg);
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mu);
    if (ecode) {
        log_warnx("event=commit_failed txn=%s code=%s msg=\"%s\"", id, ecode,
                  emsg);
        *code = ecode;
        snprintf(msg, msglen, "%s", emsg);
        *err_result = result;
        return NULL;
    }
    atomic_fetch_add(&a->n_committed, 1);
    log_info("event=committed txn=%s vms=%d snapshots=%zu total_ms=%.3f", id,
             n, json_object_size(snaps), mono_ms() - t_arrive);
    return result;
cleanup:
    return NULL;
}

/* Deletes one member snapshot.  1 deleted, 0 absent, -1 error. */
static int
delete_snap(struct agent *a, struct vm *v, int d, const char *name,
            char *err, size_t errlen)
{
    struct snap_disk sd;
    struct snap_err se = {0};
    int rc;

    vm_snap_disk(v, d, &sd);
    rc = snap_disk_backend(&sd)->remove(&sd, name, a->cfg.qmp_timeout_ms,
                                        &se);
    if (rc == SNAP_ENOENT)
        return 0;
    if (rc == 0)
        return 1;
    snprintf(err, errlen, "%s", se.msg);
    return -1;
}

static json_t *
h_abort(struct agent *a, json_t *args, const char **code, char *msg,
        size_t msglen)
{
    const char *id = json_string_value(json_object_get(args, "txn"));
    json_t *extra = json_object_get(args, "snapshots"), *todo, *nv;
    json_t *resumed = json_array(), *deleted = json_array();
    json_t *not_deleted = json_array(), *timings = json_array();
    struct vm *vms[CFG_MAX_VMS];
    struct resume_job rj[CFG_MAX_VMS];
    struct txn *x;
    const char *key;
    int was_prepared = 0, n = 0;

    (void)code;
    (void)msg;
    (void)msglen;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        x = wait_stable(a, id);
        if ((x = txn_begin_abort(&a->txns, id, &was_prepared)))
            break;
        cond_wait_ms(a, 10);
    }
    todo = json_deep_copy(x->created);
    if (was_prepared)
        for (int i = 0; i < x->nvms; i++)
            if ((vms[n] = find_vm(a, x->vms[i])))
                n++;
    pthread_mutex_unlock(&a->mu);
    if (extra)
        json_object_update(todo, extra);

    resume_vms(a, vms, n, id, "abort", rj);
    for (int i = 0; i < n; i++)
        if (rj[i].rc == 0) {
            json_t *o = json_pack("{s:s,s:f,s:f}", "vm", vms[i]->cfg->name,
                                  "cont_ms", rj[i].cont_ms, "paused_ms",
                                  rj[i].paused_ms);
            /* The thaw ran in resume_one (after cont, before this reply):
             * an aborted fs-freeze txn can leave a guest frozen too. */
            pthread_mutex_lock(&a->mu);
            json_object_set_new(o, "thaw_ms", vms[i]->thaw_ms < 0 ?
                                json_null() : json_real(vms[i]->thaw_ms));
            json_object_set_new(o, "thaw_error", vms[i]->thaw_error[0] ?
                                json_string(vms[i]->thaw_error) :
                                json_null());
            pthread_mutex_unlock(&a->mu);
            json_array_append_new(resumed, json_string(vms[i]->cfg->name));
            json_array_append_new(timings, o);
        }
    json_object_foreach(todo, key, nv) {
        struct vm *v;
        int d, rc;
        char err[512] = "";
        if (find_disk(a, key, &v, &d) < 0) {
            json_array_append_new(not_deleted, json_pack(
                "{s:s,s:s,s:s}", "disk", key, "name", json_string_value(nv),
                "error", "UNKNOWN_DISK"));
            continue;
        }
        rc = delete_snap(a, v, d, json_string_value(nv), err, sizeof(err));
        if (rc == 1)
            json_array_append_new(deleted, json_pack(
                "{s:s,s:s}", "disk", key, "name", json_string_value(nv)));
        else if (rc < 0)
            json_array_append_new(not_deleted, json_pack(
                "{s:s,s:s,s:s}", "disk", key, "name", json_string_value(nv),
                "error", err));
    }
    json_decref(todo);
    pthread_mutex_lock(&a->mu);
    txn_finish_abort(&a->txns, x);
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mu);
    atomic_fetch_add(&a->n_aborted, 1);
    log_info("event=aborted txn=%s resumed=%zu deleted=%zu not_deleted=%zu",
             id, json_array_size(resumed), json_array_size(deleted),
             json_array_size(not_deleted));
    return json_pack("{s:s,s:s,s:o,s:o,s:o,s:o}", "txn", id, "state",
                     "aborted", "resumed", resumed, "deleted", deleted,
                     "not_deleted", not_deleted, "timings", timings);
}

static json_t *
h_resume(struct agent *a, json_t *args, const char **code, char *msg,
         size_t msglen)
{
    json_t *jvms = json_object_get(args, "vms"), *v, *arr;
    struct vm *vms[CFG_MAX_VMS];
    struct resume_job rj[CFG_MAX_VMS];
    size_t i;
    int n = (int)json_array_size(jvms);

    if (n > CFG_MAX_VMS)
        FAIL("BAD_REQUEST", "too many VMs");
    json_array_foreach(jvms, i, v)
        if (!(vms[i] = find_vm(a, json_string_value(v))))
            FAIL("UNKNOWN_VM", "unknown vm %s", json_string_value(v));
    resume_vms(a, vms, n, NULL, "resume", rj);
    for (int k = 0; k < n; k++)
        if (rj[k].rc < 0) {
            *code = vm_err_code(&rj[k].err);
            snprintf(msg, msglen, "vm %s: %s", vms[k]->cfg->name,
                     rj[k].err.msg);
            return NULL;
        }
    arr = json_array();
    for (int k = 0; k < n; k++)
        json_array_append_new(arr, json_pack("{s:s,s:f,s:f}", "vm",
                                             vms[k]->cfg->name, "cont_ms",
                                             rj[k].cont_ms, "paused_ms",
                                             rj[k].paused_ms));
    return json_pack("{s:o}", "vms", arr);
cleanup:
    return NULL;
}

/* The reply code of a backend error (agent-protocol §3.3). */
static const char *
snap_err_code(const struct snap_err *e)
{
    return e->kind == SNAP_E_STORAGE ? "SNAPSHOT_FAILED" :
        e->kind == SNAP_E_TIMEOUT ? "QMP_TIMEOUT" : "QMP_ERROR";
}

static json_t *
h_snap_list(struct agent *a, json_t *args, const char **code, char *msg,
            size_t msglen)
{
    const char *disk = json_string_value(json_object_get(args, "disk"));
    json_t *list = NULL;
    struct snap_disk sd;
    struct snap_err se = {0};
    struct vm *v;
    int d;

    if (find_disk(a, disk, &v, &d) < 0)
        FAIL("UNKNOWN_DISK", "unknown disk %s", disk);
    vm_snap_disk(v, d, &sd);
    if (snap_disk_backend(&sd)->list(&sd, a->cfg.qmp_timeout_ms, &list,
                                     &se) < 0)
        FAIL(snap_err_code(&se), "%s", se.msg);
    return json_pack("{s:s,s:o}", "disk", disk, "snapshots", list);
cleanup:
    return NULL;
}

static json_t *
h_snap_delete(struct agent *a, json_t *args, const char **code, char *msg,
              size_t msglen)
{
    const char *disk = json_string_value(json_object_get(args, "disk"));
    const char *name = json_string_value(json_object_get(args, "name"));
    struct vm *v;
    int d, rc;
    char err[512];

    if (find_disk(a, disk, &v, &d) < 0)
        FAIL("UNKNOWN_DISK", "unknown disk %s", disk);
    rc = delete_snap(a, v, d, name, err, sizeof(err));
    if (rc < 0)
        FAIL("SNAPSHOT_FAILED", "%s", err);
    log_info("event=snapshot_delete disk=%s name=%s deleted=%d", disk, name,
             rc);
    return json_pack("{s:s,s:s,s:b}", "disk", disk, "name", name, "deleted",
                     rc == 1);
cleanup:
    return NULL;
}

/* vm.start from a definition (spec.xml: a transient libvirt domain). */
static json_t *
vm_start_xml(struct agent *a, const char *xml, const char **code, char *msg,
             size_t msglen)
{
    char name[256];
    const char *via = "";
    double t0 = mono_ms();
    struct qmp_err qe;
    int rc;

    rc = vm_host_create(&a->host, xml, &via, name, sizeof(name), &qe);
    if (rc == VM_ENODRIVER)
        FAIL("BAD_REQUEST", "args.spec.xml needs the libvirt driver "
             "([libvirt] uri)");
    if (rc < 0)
        FAIL(vm_err_code(&qe), "%s", qe.msg);
    log_info("event=vm_start vm=%s via=%s start_ms=%.3f", name, via,
             mono_ms() - t0);
    return json_pack("{s:s,s:s,s:f}", "vm", name, "state", "running",
                     "start_ms", mono_ms() - t0);
cleanup:
    return NULL;
}

/*
 * vm.start of a configured VM (agent-protocol §4.9):
 *
 *   state running/paused ─────────────────────────► reply, nothing run
 *   state unknown (QMP hung) ─────────────────────► BUSY, nothing run
 *   shutoff ─► the driver's start (qmp: run `start =`, then query-status
 *              until "running"; deadline start_timeout_ms) ─► open
 *              deferred rbd disks ─► reply
 *
 * v->starting (under a.mu) makes a second concurrent vm.start of the VM,
 * or a prepare, BUSY.
 */
static json_t *
vm_start_cmd(struct agent *a, struct vm *v, const char **code, char *msg,
             size_t msglen)
{
    const struct cfg_vm *m = v->cfg;
    char err[512] = "";
    struct qmp_err qe = {0};
    const char *st;
    double t0 = mono_ms(), end = t0 + m->start_timeout_ms, cmd_ms = 0;
    json_t *r = NULL;
    int claimed = 0;

    if (!m->start[0])
        FAIL("BAD_REQUEST", "vm %s has no start command in the agent "
             "config ([vm %s] start = ...)", m->name, m->name);
    pthread_mutex_lock(&a->mu);
    if (v->starting) {
        pthread_mutex_unlock(&a->mu);
        FAIL("BUSY", "vm %s: a vm.start is already running", m->name);
    }
    v->starting = claimed = 1;
    pthread_mutex_unlock(&a->mu);

    /* Never a second QEMU on the same disks: a VM that answers is left. */
    st = vm_state(v, a->cfg.qmp_timeout_ms);
    if (strcmp(st, "running") == 0 || strcmp(st, "paused") == 0) {
        log_info("event=vm_start vm=%s result=already_%s", m->name, st);
        r = json_pack("{s:s,s:s,s:f,s:b}", "vm", m->name, "state", st,
                      "start_ms", 0.0, "already_running", 1);
        goto cleanup;
    }
    if (strcmp(st, "unknown") == 0)
        FAIL("BUSY", "vm %s: its QMP socket %s exists but does not answer; "
             "not starting a second QEMU", m->name, m->qmp);
    if (v->ops->start(v, end, &cmd_ms, &qe) < 0)
        FAIL(vm_err_code(&qe), "%s", qe.msg);
    if (v->images_deferred) {
        if (open_images(a, v, err, sizeof(err)) < 0)
            /* Running, but no rbd snapshot of it can be taken here. */
            FAIL("SNAPSHOT_FAILED", "vm %s started, but its rbd disks cannot "
                 "be opened: %s", m->name, err);
        v->images_deferred = 0;
    }
    log_info("event=vm_start vm=%s result=started start_ms=%.3f "
             "command_ms=%.3f", m->name, mono_ms() - t0, cmd_ms);
    r = json_pack("{s:s,s:s,s:f,s:f,s:b}", "vm", m->name, "state", "running",
                  "start_ms", mono_ms() - t0, "command_ms", cmd_ms,
                  "already_running", 0);
cleanup:
    if (claimed) {
        pthread_mutex_lock(&a->mu);
        v->starting = 0;
        pthread_mutex_unlock(&a->mu);
    }
    return r;
}

static json_t *
h_vm_start(struct agent *a, json_t *args, const char **code, char *msg,
           size_t msglen)
{
    json_t *spec = json_object_get(args, "spec");
    const char *xml = json_string_value(json_object_get(spec, "xml"));
    json_t *jname = json_object_get(spec, "vm");
    const char *name = json_string_value(jname);
    struct vm *v;

    if (jname && !name)
        FAIL("BAD_REQUEST", "args.spec.vm must be a string");
    if (name && xml)
        FAIL("BAD_REQUEST", "args.spec takes vm (a configured VM) or xml "
             "(a libvirt domain), not both");
    if (xml)
        return vm_start_xml(a, xml, code, msg, msglen);
    if (!name)
        FAIL("BAD_REQUEST", "args.spec needs vm (a VM of the agent config) "
             "or xml (a libvirt domain)");
    if (!(v = find_vm(a, name)))
        FAIL("UNKNOWN_VM", "unknown vm %s", name);
    if (!v->ops->start)
        FAIL("BAD_REQUEST", "vm %s uses the %s driver: start it with "
             "args.spec.xml", name, v->ops->name);
    return vm_start_cmd(a, v, code, msg, msglen);
cleanup:
    return NULL;
}

static json_t *
h_vm_stop(struct agent *a, json_t *args, const char **code, char *msg,
          size_t msglen)
{
    const char *name = json_string_value(json_object_get(args, "vm"));
    struct qmp_err qe;
    struct vm *v;

    if (!(v = find_vm(a, name)))
        FAIL("UNKNOWN_VM", "unknown vm %s", name);
    if (vm_poweroff(v, a->cfg.qmp_timeout_ms, &qe) < 0)
        FAIL(vm_err_code(&qe), "%s", qe.msg);
    log_info("event=vm_stop vm=%s", name);
    return json_pack("{s:s,s:s}", "vm", name, "state", "shutoff");
cleanup:
    return NULL;
}

json_t *
agent_handle(struct agent *a, const struct proto_request *req,
             const char **code, char *msg, size_t msglen,
             json_t **err_result)
{
    json_t *r = NULL;

    *err_result = NULL;
    switch (req->cmd) {
    case PROTO_CMD_HELLO:
        r = h_hello(a);
        break;
    case PROTO_CMD_INVENTORY:
        r = h_inventory(a);
        break;
    case PROTO_CMD_PREPARE:
        r = h_prepare(a, req->args, code, msg, msglen, err_result);
        break;
    case PROTO_CMD_COMMIT:
        r = h_commit(a, req->args, code, msg, msglen, err_result);
        break;
    case PROTO_CMD_ABORT:
        r = h_abort(a, req->args, code, msg, msglen);
        break;
    case PROTO_CMD_RESUME:
        r = h_resume(a, req->args, code, msg, msglen);
        break;
    case PROTO_CMD_SNAP_LIST:
        r = h_snap_list(a, req->args, code, msg, msglen);
        break;
    case PROTO_CMD_SNAP_DELETE:
        r = h_snap_delete(a, req->args, code, msg, msglen);
        break;
    case PROTO_CMD_VM_START:
        r = h_vm_start(a, req->args, code, msg, msglen);
        break;
    case PROTO_CMD_VM_STOP:
        r = h_vm_stop(a, req->args, code, msg, msglen);
        break;
    case PROTO_CMD_STATS:
        r = h_stats(a);
        break;
    default:
        *code = "UNKNOWN_COMMAND";
        snprintf(msg, msglen, "unknown command");
    }
    if (!r && !*code) {
        *code = "INTERNAL";
        snprintf(msg, msglen, "handler returned nothing");
    }
    return r;
}
