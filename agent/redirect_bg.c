/* redirect_bg: see redirect.h (the background half of the redirect cut). */
#include "redirect.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "mono.h"
#include "par.h"
#include "txn.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

/* A background merge (recovery, retry) tries this often, 1 s apart. */
#define RD_BG_TRIES 60
/* How long a commit's reply waits for the next cut's overlays: they take
 * tens of ms, but attaching an RBD image in QEMU waits on Ceph (it took
 * 10 s in the lab while a stopped process held the Ceph clients' shared
 * admin socket), and a reply that late would pass the coordinator's deadline for
 * a commit that did succeed. */
#define RD_AHEAD_SYNC_MS 500.0

/*
 * Per VM (index in a->vms), under bg_mu: a merge running in the
 * background; overlays being made ahead of the next cut, and the id of
 * those ready (their journal entry's txn field, and their image names);
 * the id of the overlays the VM's current txn uses.
 */
static pthread_mutex_t bg_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned char bg_running[CFG_MAX_VMS], making[CFG_MAX_VMS];
static char ahead_id[CFG_MAX_VMS][64], cur_id[CFG_MAX_VMS][129];
/* the overlays whose nodes this run deleted from QEMU (redirect_merge);
 * an overlay kept (RD_KEPT), and why: a prepare of the VM says it */
static char dropped_id[CFG_MAX_VMS][129];
static unsigned char kept[CFG_MAX_VMS];
static char kept_msg[CFG_MAX_VMS][512];
/* a commit's merge in the background (redirect_finish_bg): on its first
 * try (a prepare waits for it rather than answer BUSY), and how it ended
 * (0 merged, -1 failed or kept: bg_err says why) once it has */
static unsigned char commit_try[CFG_MAX_VMS], bg_done[CFG_MAX_VMS];
static int bg_rc[CFG_MAX_VMS];
static double bg_ms[CFG_MAX_VMS], bg_t_done[CFG_MAX_VMS];
static char bg_err[CFG_MAX_VMS][512];
static unsigned long ahead_seq;
/* a moving average of one VM's RBD snapshot time, and whether it has one */
static double snap_avg_ms;
static int snap_avg_set;

struct bg_job {
    struct agent *a;
    struct vm *v;
    char id[129];
    const char *why;
};

static int
idx_of(const struct agent *a, const struct vm *v)
{
    return (int)(v - a->vms);
}

static void
nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

    nanosleep(&ts, NULL);
}

static struct bg_job *ahead_claim(struct agent *a, struct vm *v);
static void *bg_ahead(void *arg);

/* The first try of b's merge ended (rc 0 or -1, err): a commit waiting
 * for it (redirect_finish_wait) may answer; a prepare no longer waits. */
static void
bg_result(const struct bg_job *b, int rc, double ms, const char *err)
{
    int idx = idx_of(b->a, b->v);

    pthread_mutex_lock(&bg_mu);
    commit_try[idx] = 0;
    bg_done[idx] = 1;
    bg_rc[idx] = rc;
    bg_ms[idx] = ms;
    bg_t_done[idx] = mono_ms();
    snprintf(bg_err[idx], sizeof(bg_err[0]), "%s", err);
    pthread_mutex_unlock(&bg_mu);
}

static void *
bg_merge(void *arg)
{
    struct bg_job *b = arg;
    double t0 = mono_ms(), first_ok = -1;
    char err[512];
    int ok = 0;
    struct bg_job *ahead;

    /* At start the agent opens the RBD images, which the removal needs,
     * after recovery: wait for them (a prepare of the VM is BUSY until
     * this merge is done), then retry for a while, Ceph may be down. */
    for (;;) {
        int pending;

        pthread_mutex_lock(&b->a->mu);
        pending = b->v->storage_pending;
        pthread_mutex_unlock(&b->a->mu);
        if (!pending || mono_ms() - t0 > RD_BG_TRIES * 1000.0)
            break;
        nap_ms(20);
    }
    for (int tries = 0; tries < RD_BG_TRIES; tries++) {
        int r = redirect_merge(b->a, b->v, b->id, b->why, err, sizeof(err));

        if (tries == 0 && r != 0)   /* a commit's wait ends: it failed */
            bg_result(b, -1, mono_ms() - t0, err);
        else if (tries == 0)
            first_ok = mono_ms() - t0;

        if (r == RD_KEPT) {     /* not retried: it stays until an operator
                                 * acts; each prepare of the VM looks again */
            pthread_mutex_lock(&bg_mu);
            kept[idx_of(b->a, b->v)] = 1;
            snprintf(kept_msg[idx_of(b->a, b->v)], sizeof(kept_msg[0]), "%s",
                     err);
            pthread_mutex_unlock(&bg_mu);
            break;
        }
        if (r == 0) {
            ok = 1;
            break;
        }
        nap_ms(1000);
    }
    /* After a merge, as redirect_finish does: the next cut's overlays, so
     * that its prepare finds them ready.  Also after a recovery's or a
     * retry's: a prepare that makes them itself took 2.2-3.0 s per VM at
     * 25 VMs per agent (bench scale, 100 VMs), past the coordinator's
     * wait.  Not for a VM whose QEMU is gone.  Marked as being made in
     * the same lock that ends the merge: a prepare between the two would
     * find neither, and make overlays of the same nodes beside them. */
    ok = ok && strcmp(b->why, "vm_gone") != 0 &&
        redirect_usable(b->a, b->v, err, sizeof(err));
    pthread_mutex_lock(&bg_mu);
    bg_running[idx_of(b->a, b->v)] = 0;
    ahead = ok ? ahead_claim(b->a, b->v) : NULL;
    pthread_mutex_unlock(&bg_mu);
    if (ahead)
        par_detach(bg_ahead, ahead);
    if (first_ok >= 0)
        bg_result(b, 0, first_ok, "");
    free(b);
    return NULL;
}

/* With bg_mu held: a job that merges v's overlays of id (why: commit,
 * recovery, retry...), marked as running, unless a merge of v runs
 * already; NULL then.  The caller starts it (bg_merge) after unlocking. */
static struct bg_job *
merge_claim(struct agent *a, struct vm *v, const char *id, const char *why)
{
    int idx = idx_of(a, v);
    struct bg_job *b;

    if (bg_running[idx] || !(b = calloc(1, sizeof(*b))))
        return NULL;
    *b = (struct bg_job){.a = a, .v = v, .why = why};
    snprintf(b->id, sizeof(b->id), "%s", id);
    bg_running[idx] = 1;
    bg_done[idx] = 0;
    commit_try[idx] = strcmp(why, "commit") == 0;
    return b;
}

int
redirect_kick(struct agent *a, struct vm *v, const char *txn,
              const char *why)
{
    struct bg_job *b;
    int running;

    pthread_mutex_lock(&bg_mu);
    b = merge_claim(a, v, txn, why);
    running = bg_running[idx_of(a, v)];
    pthread_mutex_unlock(&bg_mu);
    if (b)
        par_detach(bg_merge, b);
    return running;
}

/* Makes the next cut's overlays while the VM runs, so that a prepare
 * finds them ready and the agents' stops do not wait for them. */
static void *
bg_ahead(void *arg)
{
    struct bg_job *b = arg;
    struct journal_entry je = {.kind = JOURNAL_REDIRECT};
    char err[512];
    int hung = 0, ok = 0;

    snprintf(je.txn, sizeof(je.txn), "%s", b->id);
    snprintf(je.vm, sizeof(je.vm), "%s", b->v->cfg->name);
    if (journal_put(b->a->journal, &je, 1, err, sizeof(err)) == 0 &&
        redirect_make(b->a, b->v, b->id, &hung, err, sizeof(err)) == 0)
        ok = 1;
    else
        log_warnx("event=redirect_ahead_failed vm=%s id=%s msg=\"%s\"",
                  b->v->cfg->name, b->id, err);
    pthread_mutex_lock(&bg_mu);
    if (ok)
        snprintf(ahead_id[idx_of(b->a, b->v)], sizeof(ahead_id[0]), "%s",
                 b->id);
    making[idx_of(b->a, b->v)] = 0;
    pthread_mutex_unlock(&bg_mu);
    free(b);
    return NULL;
}

/* With bg_mu held: a job that makes v's overlays ahead of its next cut,
 * marked as being made, unless they are ready or being made or merged;
 * NULL then.  The caller starts it (bg_ahead) after unlocking. */
static struct bg_job *
ahead_claim(struct agent *a, struct vm *v)
{
    int idx = idx_of(a, v);
    struct bg_job *b;

    if (making[idx] || bg_running[idx] || ahead_id[idx][0] ||
        !(b = calloc(1, sizeof(*b))))
        return NULL;
    *b = (struct bg_job){.a = a, .v = v, .why = "ahead"};
    /* unique across restarts of the agent too: its pid and the time */
    snprintf(b->id, sizeof(b->id), "ahead-%lx-%lx-%lu",
             (unsigned long)time(NULL), (unsigned long)getpid(), ++ahead_seq);
    making[idx] = 1;
    return b;
}

/* Starts making v's overlays ahead of its next cut, in a thread of its
 * own, unless they are ready or being made, or v cannot take the redirect
 * cut. */
static void
ahead_kick(struct agent *a, struct vm *v)
{
    struct bg_job *b;
    char why[256];

    if (!redirect_usable(a, v, why, sizeof(why)))
        return;
    pthread_mutex_lock(&bg_mu);
    b = ahead_claim(a, v);
    pthread_mutex_unlock(&bg_mu);
    if (b)
        par_detach(bg_ahead, b);
}

/* Waits up to max_ms for v's overlays being made ahead to be done. */
static void
ahead_wait(struct agent *a, const struct vm *v, double max_ms)
{
    double t0 = mono_ms();
    int mk;

    for (;;) {
        pthread_mutex_lock(&bg_mu);
        mk = making[idx_of(a, v)];
        pthread_mutex_unlock(&bg_mu);
        if (!mk || mono_ms() - t0 > max_ms)
            return;
        nap_ms(2);
    }
}

int
redirect_ahead_ready(struct agent *a, const struct vm *v)
{
    int ready;

    pthread_mutex_lock(&bg_mu);
    ready = ahead_id[idx_of(a, v)][0] != '\0';
    pthread_mutex_unlock(&bg_mu);
    return ready;
}

int
redirect_prepare(struct agent *a, struct vm *v, const char *txn, int *hung,
                 char *err, size_t errlen)
{
    int idx = idx_of(a, v);

    *hung = 0;
    pthread_mutex_lock(&bg_mu);
    if (ahead_id[idx][0]) {
        snprintf(cur_id[idx], sizeof(cur_id[0]), "%s", ahead_id[idx]);
        ahead_id[idx][0] = '\0';
        pthread_mutex_unlock(&bg_mu);
        log_info("event=redirect_prepared txn=%s vm=%s id=%s ahead=yes", txn,
                 v->cfg->name, cur_id[idx]);
        return 0;
    }
    snprintf(cur_id[idx], sizeof(cur_id[0]), "%s", txn);
    pthread_mutex_unlock(&bg_mu);
    return redirect_make(a, v, txn, hung, err, errlen);
}

void
redirect_note_snapshot_ms(double ms)
{
    pthread_mutex_lock(&bg_mu);
    /* weight 1/4: a few commits follow a change of the backend's latency */
    snap_avg_ms = snap_avg_set ? 0.75 * snap_avg_ms + 0.25 * ms : ms;
    snap_avg_set = 1;
    pthread_mutex_unlock(&bg_mu);
}

double
redirect_ahead_wait_ms(void)
{
    double w;

    pthread_mutex_lock(&bg_mu);
    w = snap_avg_ms > RD_AHEAD_WAIT_MS ? snap_avg_ms : RD_AHEAD_WAIT_MS;
    pthread_mutex_unlock(&bg_mu);
    return w;
}

int
redirect_settle(struct agent *a, struct vm *v, double deadline,
                double ahead_by, char *err, size_t errlen)
{
    struct journal_entry *e = NULL;
    int idx = idx_of(a, v), n = 0, running, mk, mine = 0;
    char id[129] = "";

    err[0] = '\0';
    /* A commit's merge on its first try is about to end (and then makes
     * the next overlays, redirect_finish_bg): wait for it until deadline,
     * before any VM is stopped.  A merge retried after a failure is not
     * waited for: BUSY says why at once.  Overlays being made ahead are
     * waited for only until ahead_by: other agents' VMs may be paused
     * already, waiting for this agent's PREPARED, and this VM can be cut
     * in the pause instead. */
    for (;;) {
        int fresh;
        double now;

        pthread_mutex_lock(&bg_mu);
        running = bg_running[idx];
        mk = making[idx];
        fresh = running && commit_try[idx];
        pthread_mutex_unlock(&bg_mu);
        now = mono_ms();
        if ((!mk && !fresh) || now > deadline || (mk && now > ahead_by))
            break;
        nap_ms(5);
    }
    if (running) {
        snprintf(err, errlen, "their merge runs");
        return -1;
    }
    if (mk) {
        /* Making starts only after a merge that succeeded (bg_merge,
         * redirect_finish), and the journal holds one `redirect` entry per
         * VM: the VM writes to its bases, and a cut in the pause is safe.
         * The overlays stay for the next cut. */
        snprintf(err, errlen, "the overlays of its next cut were still being "
                 "made");
        return 1;
    }
    if (journal_entries(a->journal, &e, &n) < 0) {
        snprintf(err, errlen, "journal: out of memory");
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (e[i].kind == JOURNAL_REDIRECT && strcmp(e[i].vm, v->cfg->name) == 0)
            snprintf(id, sizeof(id), "%s", e[i].txn);
    free(e);
    if (!id[0])
        return 0;
    pthread_mutex_lock(&bg_mu);
    mine = strcmp(id, ahead_id[idx]) == 0;
    if (kept[idx])
        snprintf(err, errlen, "%s", kept_msg[idx]);
    kept[idx] = 0;      /* looked at again below */
    pthread_mutex_unlock(&bg_mu);
    if (mine)       /* ready for this cut */
        return 0;
    redirect_kick(a, v, id, "retry");
    if (!err[0])
        snprintf(err, errlen, "the merge of txn %s is retried", id);
    return -1;
}

int
redirect_bg_wait(struct agent *a, const struct vm *v, double max_ms)
{
    double t0 = mono_ms();
    int idx = idx_of(a, v), busy;

    for (;;) {
        pthread_mutex_lock(&bg_mu);
        busy = making[idx] || bg_running[idx];
        pthread_mutex_unlock(&bg_mu);
        if (!busy)
            return 0;
        if (mono_ms() - t0 > max_ms)
            return -1;
        nap_ms(5);
    }
}

int
redirect_bg_busy(struct agent *a, const struct vm *v)
{
    int idx = idx_of(a, v), busy;

    pthread_mutex_lock(&bg_mu);
    busy = making[idx] || bg_running[idx] || kept[idx];
    pthread_mutex_unlock(&bg_mu);
    return busy;
}

void
redirect_note_dropped(struct agent *a, const struct vm *v, const char *id)
{
    pthread_mutex_lock(&bg_mu);
    snprintf(dropped_id[idx_of(a, v)], sizeof(dropped_id[0]), "%s", id);
    pthread_mutex_unlock(&bg_mu);
}

int
redirect_was_dropped(struct agent *a, const struct vm *v, const char *id)
{
    int r;

    pthread_mutex_lock(&bg_mu);
    r = strcmp(dropped_id[idx_of(a, v)], id) == 0;
    pthread_mutex_unlock(&bg_mu);
    return r;
}

void
redirect_forget(struct agent *a, const struct vm *v, const char *id)
{
    int idx = idx_of(a, v);

    pthread_mutex_lock(&bg_mu);
    if (strcmp(ahead_id[idx], id) == 0)
        ahead_id[idx][0] = '\0';
    if (strcmp(dropped_id[idx], id) == 0)
        dropped_id[idx][0] = '\0';
    kept[idx] = 0;
    pthread_mutex_unlock(&bg_mu);
}

int
redirect_finish(struct agent *a, struct vm *v, const char *why, char *err,
                size_t errlen)
{
    char id[129];
    int rc;

    pthread_mutex_lock(&bg_mu);
    snprintf(id, sizeof(id), "%s", cur_id[idx_of(a, v)]);
    pthread_mutex_unlock(&bg_mu);
    rc = redirect_merge(a, v, id, why, err, errlen);
    /* After a commit, before its reply (for up to RD_AHEAD_SYNC_MS): every
     * agent of the group then has its overlays ready when the next prepare
     * comes, however soon, so no agent's stops wait for them while another's
     * VMs are paused (in the lab, overlays made in the background after the
     * reply still ran when back-to-back group snapshots came, and the pause
     * p99 doubled). */
    if (rc == 0) {
        ahead_kick(a, v);
        if (strcmp(why, "commit") == 0)
            ahead_wait(a, v, RD_AHEAD_SYNC_MS);
    }
    return rc;
}

struct merge_job {
    struct agent *a;
    struct vm *v;
    const char *why;
};

static void *
merge_one(void *arg)
{
    struct merge_job *m = arg;
    char err[512];

    redirect_finish(m->a, m->v, m->why, err, sizeof(err));
    return NULL;
}

void
redirect_ahead_after_cut(struct agent *a, struct vm *v)
{
    struct journal_entry *e = NULL;
    int n = 0, listed = 0;
    char why[256];

    if (!redirect_usable(a, v, why, sizeof(why)))
        return;
    /* An entry of v is overlays that exist or are being made: a kept
     * merge's (v runs on them), or ahead ones.  None: v is on its bases.
     * No other txn of v can start meanwhile: the caller's txn holds it. */
    if (journal_entries(a->journal, &e, &n) < 0)
        return;
    for (int i = 0; i < n; i++)
        if (e[i].kind == JOURNAL_REDIRECT && strcmp(e[i].vm, v->cfg->name) == 0)
            listed = 1;
    free(e);
    if (!listed)
        ahead_kick(a, v);
}

void
redirect_merge_txn(struct agent *a, struct txn *x, const char *why)
{
    struct merge_job jobs[CFG_MAX_VMS];
    int n = 0;

    for (int i = 0; i < x->nvms && n < CFG_MAX_VMS; i++) {
        struct vm *v;

        if (!x->rd)
            continue;
        if (x->rd[i] == RD_NONE && (v = agent_find_vm(a, x->vms[i])))
            redirect_ahead_after_cut(a, v);
        if (x->rd[i] != RD_READY && x->rd[i] != RD_SWITCHED)
            continue;
        if ((v = agent_find_vm(a, x->vms[i])))
            jobs[n++] = (struct merge_job){.a = a, .v = v, .why = why};
        x->rd[i] = RD_MERGED;
    }
    /* one thread per VM: one after another, 25 VMs' merges after a failed
     * prepare took 17 s (bench scale, 100 VMs), each VM BUSY meanwhile */
    par_run(merge_one, jobs, sizeof(*jobs), n);
}

int
redirect_finish_bg(struct agent *a, struct vm *v)
{
    struct bg_job *b;

    pthread_mutex_lock(&bg_mu);
    b = merge_claim(a, v, cur_id[idx_of(a, v)], "commit");
    pthread_mutex_unlock(&bg_mu);
    if (b)
        par_detach(bg_merge, b);
    return b != NULL;
}

int
redirect_finish_wait(struct agent *a, const struct vm *v, double deadline,
                     double *ms, char *err, size_t errlen)
{
    int idx = idx_of(a, v), done, rc, mk;
    double t_done;

    for (;;) {
        pthread_mutex_lock(&bg_mu);
        done = bg_done[idx];
        rc = bg_rc[idx];
        mk = making[idx];
        *ms = bg_ms[idx];
        t_done = bg_t_done[idx];
        snprintf(err, errlen, "%s", bg_err[idx]);
        pthread_mutex_unlock(&bg_mu);
        /* merged, and the next overlays made, for at most
         * RD_AHEAD_SYNC_MS after the merge (as a synchronous commit's
         * reply waits), or the deadline came */
        if (done && (rc < 0 || !mk || mono_ms() >= deadline ||
                     mono_ms() - t_done >= RD_AHEAD_SYNC_MS))
            return rc;
        if (mono_ms() >= deadline)
            return 1;
        nap_ms(2);
    }
}
