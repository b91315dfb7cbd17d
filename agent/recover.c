/* recover: see recover.h. */
#include "recover.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "quiesce.h"
#include "redirect.h"
#include "resume.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

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

/* A VM the config no longer names: nothing to resume; drop its entries.
 * Unless a driver discovers VMs: then it may be one of those, not known
 * before its connection is up; its entries stay, and recover_adopted
 * acts on them when discovery adds it. */
static void
recover_unknown(struct agent *a, const char *vm,
                const struct journal_entry *p, const struct journal_entry *fz)
{
    char jerr[256];

    if (vm_may_discover(&a->cfg)) {
        if (p)
            log_warnx("event=journal_resume txn=%s vm=%s result=deferred "
                      "msg=\"not known until discovery\"", p->txn, p->vm);
        if (fz)
            log_warnx("event=journal_thaw txn=%s vm=%s result=deferred "
                      "msg=\"not known until discovery\"", fz->txn, fz->vm);
        return;
    }

    if (p)
        log_warnx("event=journal_resume txn=%s vm=%s result=unknown_vm",
                  p->txn, p->vm);
    if (fz)
        log_warnx("event=journal_thaw txn=%s vm=%s result=unknown_vm",
                  fz->txn, fz->vm);
    journal_remove(a->journal, vm, jerr, sizeof(jerr));
    journal_remove_kind(a->journal, JOURNAL_FROZEN, vm, NULL, jerr,
                        sizeof(jerr));
}

/* Logs the outcome of the recovery thaw of fz.  A failed one keeps its
 * entry and stays pending: the reaper retries it with backoff
 * (quiesce_thaw_retry) until the guest agent answers or the guest is
 * gone. */
static void
recover_thawed(struct agent *a, struct vm *v, const struct journal_entry *fz,
               char *err, size_t errlen)
{
    char jerr[256];

    pthread_mutex_lock(&a->mu);
    if (!err[0] && v->thaw_error[0])
        snprintf(err, errlen, "%s", v->thaw_error);
    pthread_mutex_unlock(&a->mu);
    if (err[0]) {
        log_warnx("event=journal_thaw txn=%s vm=%s result=failed "
                  "entry=kept retry=yes msg=\"%s\"", fz->txn, fz->vm, err);
        quiesce_thaw_later(a, v, fz->txn);
        return;
    }
    log_info("event=journal_thaw txn=%s vm=%s result=ok", fz->txn, fz->vm);
    /* quiesce_thaw removed it when the txns agree; this covers an entry of
     * an older txn. */
    if (journal_remove_kind(a->journal, JOURNAL_FROZEN, fz->vm, NULL, jerr,
                            sizeof(jerr)) < 0)
        log_warnx("event=journal_error vm=%s msg=\"%s\"", fz->vm, jerr);
}

/* One configured VM with a `paused` entry p and/or a `frozen` entry fz. */
static void
recover_vm(struct agent *a, struct vm *v, const struct journal_entry *p,
           const struct journal_entry *fz)
{
    char err[256] = "";
    int deferred;

    if (fz) {
        struct vm_guest *g = NULL;

        if (v->ops->guest_open(v, &g, err, sizeof(err)) == 0) {
            pthread_mutex_lock(&a->mu);
            v->guest = g;       /* quiesce_thaw takes it */
            pthread_mutex_unlock(&a->mu);
        }
    }
    pthread_mutex_lock(&a->mu);
    v->thaw_error[0] = '\0';
    pthread_mutex_unlock(&a->mu);
    if (p) {
        struct resume_job j = {.a = a, .vm = v, .why = "journal",
                               .txn = p->txn};

        /* The previous run may have cut it live: its network may be held
         * (hold.h), and it may be stopped too (the resume sends cont). */
        pthread_mutex_lock(&a->mu);
        v->held = 1;
        pthread_mutex_unlock(&a->mu);
        resume_one(&j);     /* cont, then quiesce_thaw if v->guest is open */
        atomic_fetch_add(&a->resumed_by_journal, j.rc == 0);
        log_info("event=journal_resume txn=%s vm=%s result=%s", p->txn,
                 p->vm, j.rc == 0 ? "resumed" : "retrying");
        pthread_mutex_lock(&a->mu);
        deferred = v->guest != NULL;
        pthread_mutex_unlock(&a->mu);
        if (fz && deferred) {
            /* cont failed: the reaper's retry thaws after its cont, and
             * the entry stays until a thaw is answered. */
            log_warnx("event=journal_thaw txn=%s vm=%s result=deferred "
                      "msg=\"thaw after the resume retry\"", fz->txn,
                      fz->vm);
            return;
        }
    } else {
        quiesce_thaw(a, v, fz->txn);
    }
    if (fz)
        recover_thawed(a, v, fz, err, sizeof(err));
}

/* A `redirect` entry: the merge of the VM's overlays, whatever step the
 * previous run reached; a failed one keeps the entry, and the next
 * prepare of the VM (BUSY) or start retries it. */
static void
recover_redirect(struct agent *a, const struct journal_entry *r)
{
    struct vm *v = agent_find_vm(a, r->vm);
    char jerr[256];

    if (!v) {
        log_warnx("event=journal_redirect txn=%s vm=%s result=%s", r->txn,
                  r->vm, vm_may_discover(&a->cfg) ? "deferred" :
                  "unknown_vm");
        if (!vm_may_discover(&a->cfg))
            journal_remove_kind(a->journal, JOURNAL_REDIRECT, r->vm, NULL,
                                jerr, sizeof(jerr));
        return;
    }
    /* In the background: the merge needs Ceph (QEMU's and the agent's),
     * and recovery must not wait for it; a prepare of v is BUSY until it
     * is done (redirect_settle). */
    redirect_kick(a, v, r->txn, "recovery");
    log_info("event=journal_redirect txn=%s vm=%s result=merging", r->txn,
             r->vm);
}

void
recover_journal(struct agent *a)
{
    struct journal_entry *e = NULL;
    int n = 0;

    if (journal_entries(a->journal, &e, &n) < 0)
        return;
    for (int i = 0; i < n; i++) {
        const struct journal_entry *p, *fz;
        struct vm *v;

        /* one pass per VM: at its first entry; `redirect` ones below */
        if (e[i].kind == JOURNAL_REDIRECT ||
            entry_of(e, i, JOURNAL_PAUSED, e[i].vm) ||
            entry_of(e, i, JOURNAL_FROZEN, e[i].vm))
            continue;
        p = entry_of(e, n, JOURNAL_PAUSED, e[i].vm);
        fz = entry_of(e, n, JOURNAL_FROZEN, e[i].vm);
        if (!(v = agent_find_vm(a, e[i].vm)))
            recover_unknown(a, e[i].vm, p, fz);
        else if (p || fz)
            recover_vm(a, v, p, fz);
    }
    /* After the resumes: a VM the previous run switched onto overlays
     * writes there; merge them back (the VM runs meanwhile). */
    for (int i = 0; i < n; i++)
        if (e[i].kind == JOURNAL_REDIRECT)
            recover_redirect(a, &e[i]);
    free(e);
}

void
recover_adopted(struct agent *a, struct vm *v)
{
    struct journal_entry *e = NULL;
    int n = 0;

    if (journal_entries(a->journal, &e, &n) < 0)
        return;
    for (int i = 0; i < n; i++) {
        if (strcmp(e[i].vm, v->cfg->name) != 0)
            continue;
        if (e[i].kind == JOURNAL_PAUSED) {
            /* the reaper's resume retry, then its thaw */
            pthread_mutex_lock(&a->mu);
            v->needs_resume = 1;
            snprintf(v->needs_resume_txn, sizeof(v->needs_resume_txn), "%s",
                     e[i].txn);
            pthread_mutex_unlock(&a->mu);
            log_info("event=journal_resume txn=%s vm=%s result=retrying "
                     "why=discovered", e[i].txn, e[i].vm);
        } else if (e[i].kind == JOURNAL_FROZEN) {
            quiesce_thaw_later(a, v, e[i].txn);
            log_info("event=journal_thaw txn=%s vm=%s result=deferred "
                     "why=discovered", e[i].txn, e[i].vm);
        }
    }
    free(e);
}

void
recover_fence(struct agent *a)
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
