/* quiesce: see quiesce.h. */
#include "quiesce.h"

#include <stdio.h>
#include <string.h>

#include "log.h"
#include "mono.h"

/* Retry backoff of a failed thaw: a frozen guest blocks its own writes
 * (an outage), so the first retry comes soon; a guest agent that stays
 * away is not asked more than twice a minute. */
#define THAW_RETRY_FIRST_MS 500.0
#define THAW_RETRY_MAX_MS 30000.0

static double
thaw_backoff(int attempts)
{
    double ms = THAW_RETRY_FIRST_MS;

    for (int i = 1; i < attempts && ms < THAW_RETRY_MAX_MS; i++)
        ms *= 2;
    return ms > THAW_RETRY_MAX_MS ? THAW_RETRY_MAX_MS : ms;
}

void
quiesce_reset(struct agent *a, struct vm *v)
{
    pthread_mutex_lock(&a->mu);
    v->consistency = "crash";
    v->freeze_ms = 0;
    v->thaw_ms = -1;
    v->freeze_error[0] = '\0';
    v->thaw_error[0] = '\0';
    pthread_mutex_unlock(&a->mu);
}

void
quiesce_freeze(struct agent *a, struct vm *v, const char *txn,
               int timeout_ms)
{
    struct vm_guest *g = NULL;
    char err[256] = "";
    double t0 = mono_ms();
    int nfs = 0, rc = -1;

    if (v->ops->guest_open(v, &g, err, sizeof(err)) == 0)
        rc = v->ops->guest_freeze(g, timeout_ms, &nfs, err, sizeof(err));
    if (rc == VM_GUEST_UNSENT) {
        v->ops->guest_close(g);
        g = NULL;
    }
    pthread_mutex_lock(&a->mu);
    v->freeze_ms = mono_ms() - t0;
    v->consistency = rc == 0 ? "fs-freeze" : "crash";
    snprintf(v->freeze_error, sizeof(v->freeze_error), "%s",
             rc == 0 ? "" : err);
    v->guest = g;               /* thawed after cont, even if freeze failed */
    pthread_mutex_unlock(&a->mu);
    if (rc < 0 && g) {
        /* The guest agent got the freeze and did not answer in time: it
         * may freeze late, with nobody waiting.  Thaw now (the guest agent
         * runs commands in order, so this thaw follows that freeze); the
         * txn goes on crash-consistent. */
        log_warnx("event=freeze_late_thaw vm=%s txn=%s", v->cfg->name, txn);
        quiesce_thaw(a, v, txn);
    }
    if (!g) {
        /* No freeze reached the guest: it cannot be frozen by this txn. */
        char jerr[256];
        if (journal_remove_kind(a->journal, JOURNAL_FROZEN, v->cfg->name,
                                txn, jerr, sizeof(jerr)) < 0)
            log_warnx("event=journal_error vm=%s msg=\"%s\"", v->cfg->name,
                      jerr);
    }
    if (rc == 0)
        log_info("event=frozen vm=%s txn=%s filesystems=%d freeze_ms=%.3f",
                 v->cfg->name, txn, nfs, v->freeze_ms);
    else
        log_warnx("event=freeze_failed vm=%s txn=%s fallback=crash "
                  "msg=\"%s\"", v->cfg->name, txn, err);
}

int
quiesce_thaw(struct agent *a, struct vm *v, const char *txn)
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
        log_warnx("event=thaw_failed vm=%s txn=%s retry=yes msg=\"%s\"",
                  v->cfg->name, txn ? txn : "-", err);
        quiesce_thaw_later(a, v, txn);
    }
    return rc == 0 ? 0 : -1;
}

void
quiesce_thaw_later(struct agent *a, struct vm *v, const char *txn)
{
    pthread_mutex_lock(&a->mu);
    if (!v->thaw_pending) {
        v->thaw_pending = 1;
        v->thaw_attempts = 1;
        v->thaw_next = mono_ms() + thaw_backoff(1);
    }
    /* the newest txn's entry is the one that must go */
    snprintf(v->thaw_txn, sizeof(v->thaw_txn), "%s", txn ? txn : "");
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mu);
}

int
quiesce_thaw_due(const struct vm *v, double now)
{
    return v->thaw_pending && !v->thaw_running && !v->needs_resume &&
           v->paused_at == 0 && !v->guest && now >= v->thaw_next;
}

/* 1 when the guest is gone for good: nothing left to thaw. */
static int
guest_gone(struct vm *v, int qmp_timeout_ms)
{
    if (v->ops->present && !v->ops->present(v))
        return 1;
    return strcmp(vm_state(v, qmp_timeout_ms), "shutoff") == 0;
}

void
quiesce_thaw_retry(struct agent *a, struct vm *v, int qmp_timeout_ms)
{
    struct vm_guest *g = NULL;
    char err[256] = "", jerr[256], txn[129];
    int rc = -1, nfs = 0, attempt, gone;
    double t0 = mono_ms();

    pthread_mutex_lock(&a->mu);
    snprintf(txn, sizeof(txn), "%s", v->thaw_txn);
    attempt = ++v->thaw_attempts;
    pthread_mutex_unlock(&a->mu);
    gone = guest_gone(v, qmp_timeout_ms);
    if (!gone && v->ops->guest_open(v, &g, err, sizeof(err)) == 0) {
        rc = v->ops->guest_thaw(g, &nfs, err, sizeof(err));
        v->ops->guest_close(g);
    }
    if (rc == 0 || gone) {
        if (rc == 0)
            log_info("event=thaw_retry vm=%s txn=%s attempt=%d result=ok "
                     "filesystems=%d thaw_ms=%.3f", v->cfg->name, txn,
                     attempt, nfs, mono_ms() - t0);
        else
            log_warnx("event=thaw_retry vm=%s txn=%s attempt=%d "
                      "result=guest_gone entry=dropped", v->cfg->name, txn,
                      attempt);
        if (journal_remove_kind(a->journal, JOURNAL_FROZEN, v->cfg->name,
                                txn[0] ? txn : NULL, jerr, sizeof(jerr)) < 0)
            log_warnx("event=journal_error vm=%s msg=\"%s\"", v->cfg->name,
                      jerr);
    } else {
        atomic_fetch_add(&a->n_thaw_failed, 1);
        log_warnx("event=thaw_retry vm=%s txn=%s attempt=%d result=failed "
                  "retry_ms=%.0f msg=\"%s\"", v->cfg->name, txn, attempt,
                  thaw_backoff(attempt), err);
    }
    pthread_mutex_lock(&a->mu);
    v->thaw_running = 0;
    if (rc == 0 || gone) {
        v->thaw_pending = 0;
        v->thaw_error[0] = '\0';
    } else {
        v->thaw_next = mono_ms() + thaw_backoff(attempt);
        snprintf(v->thaw_error, sizeof(v->thaw_error), "%s",
                 err[0] ? err : "guest-fsfreeze-thaw failed");
    }
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mu);
}

/* a.mu held */
static void
report_thaw(json_t *o, const struct vm *v)
{
    json_object_set_new(o, "thaw_ms", v->thaw_ms < 0 ? json_null() :
                        json_real(v->thaw_ms));
    json_object_set_new(o, "thaw_error", v->thaw_error[0] ?
                        json_string(v->thaw_error) : json_null());
}

void
quiesce_report(struct agent *a, json_t *o, struct vm *v, int with_thaw)
{
    pthread_mutex_lock(&a->mu);
    json_object_set_new(o, "consistency",
                        json_string(v->consistency ? v->consistency :
                                    "crash"));
    json_object_set_new(o, "freeze_ms", json_real(v->freeze_ms));
    if (with_thaw)
        report_thaw(o, v);
    json_object_set_new(o, "freeze_error", v->freeze_error[0] ?
                        json_string(v->freeze_error) : json_null());
    pthread_mutex_unlock(&a->mu);
}

void
quiesce_report_thaw(struct agent *a, json_t *o, struct vm *v)
{
    pthread_mutex_lock(&a->mu);
    report_thaw(o, v);
    pthread_mutex_unlock(&a->mu);
}
