/* resume: see resume.h. */
#include "resume.h"

#include <stdio.h>
#include <string.h>

#include "hold.h"
#include "log.h"
#include "mono.h"
#include "par.h"
#include "quiesce.h"
#include "redirect.h"

void *
resume_one(void *arg)
{
    struct resume_job *j = arg;
    struct agent *a = j->a;
    char jerr[256];
    double t0 = mono_ms();
    int held, hold_only;

    pthread_mutex_lock(&a->mu);
    held = j->vm->held;
    hold_only = j->vm->hold_only;
    pthread_mutex_unlock(&a->mu);
    /* The live cut's hold first (hold.h): a VM it held is never left
     * holding its network.  A VM held without a stop needs no cont. */
    j->rc = 0;
    if (held) {
        j->rc = hold_off(j->vm, a->cfg.qmp_timeout_ms, &j->err);
        /* not released: held until a retry releases it (a recovery's too) */
        pthread_mutex_lock(&a->mu);
        j->vm->held = j->rc < 0;
        pthread_mutex_unlock(&a->mu);
    }
    if (j->rc == 0 && !hold_only)
        j->rc = vm_cont(j->vm, a->cfg.qmp_timeout_ms, &j->err);
    if (j->rc == 0 && hold_only) {
        pthread_mutex_lock(&a->mu);
        j->vm->hold_only = 0;
        pthread_mutex_unlock(&a->mu);
    }
    j->t_end = mono_ms();
    j->cont_ms = j->t_end - t0;
    if (j->rc == 0)
        redirect_resumed(a, j->vm);     /* overlays may be made again */
    pthread_mutex_lock(&a->mu);
    j->paused_ms = -1;
    if (j->rc == 0) {
        j->vm->needs_resume = 0;
        if (j->vm->paused_at > 0)
            j->paused_ms = j->t_end - j->vm->paused_at;
        j->vm->paused_at = 0;
        if (j->vm->thaw_pending)
            j->vm->thaw_next = 0;   /* running again: its guest can answer */
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
        quiesce_thaw(a, j->vm, j->txn);
    } else {
        log_warnx("event=resume_failed vm=%s txn=%s why=%s msg=\"%s\" "
                  "retry=yes", j->vm->cfg->name, j->txn ? j->txn : "-",
                  j->why, j->err.msg);
    }
    return NULL;
}

void
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
        par_run(resume_one, jobs, sizeof(*jobs), n);
}
