/* quiesce: see quiesce.h. */
#include "quiesce.h"

#include <stdio.h>

#include "log.h"
#include "mono.h"

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
    pthread_mutex_lock(&a->mu);
    v->freeze_ms = mono_ms() - t0;
    v->consistency = rc == 0 ? "fs-freeze" : "crash";
    snprintf(v->freeze_error, sizeof(v->freeze_error), "%s",
             rc == 0 ? "" : err);
    v->guest = g;               /* thawed after cont, even if freeze failed */
    pthread_mutex_unlock(&a->mu);
    if (!g) {
        /* Nothing reached the guest: it cannot be frozen by this txn. */
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
        log_warnx("event=thaw_failed vm=%s txn=%s msg=\"%s\"", v->cfg->name,
                  txn ? txn : "-", err);
    }
    return rc == 0 ? 0 : -1;
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
