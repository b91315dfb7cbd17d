/* txn_vm: see txn_vm.h. */
#include "txn_vm.h"

#include <stdio.h>
#include <string.h>

#include "hold.h"
#include "log.h"
#include "mono.h"
#include "quiesce.h"
#include "redirect.h"
#include "resume.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

void *
txn_vm_overlay(void *arg)
{
    struct txn_vm_prep *j = arg;
    int hung = 0;

    if (j->redirect != RD_READY)
        return NULL;
    if (redirect_prepare(j->a, j->vm, j->txn, &hung, j->rd_why,
                         sizeof(j->rd_why)) < 0) {
        j->redirect = RD_NONE;
        if (hung) {
            /* Its QEMU does not answer: a stop would wait as long again.
             * The prepare fails before any VM is stopped. */
            j->rc = -1;
            j->skip = 1;
            j->qmp_kind = QMP_E_TIMEOUT;
            j->code = "QMP_TIMEOUT";
            snprintf(j->msg, sizeof(j->msg), "vm %s: not stopped: its QEMU "
                     "did not answer while its overlays were made: %s",
                     j->vm->cfg->name, j->rd_why);
            return NULL;
        }
        log_warnx("event=pause_path txn=%s vm=%s path=in_pause "
                  "why=\"overlays not made: %s\"", j->txn, j->vm->cfg->name,
                  j->rd_why);
        return NULL;
    }
    /* The live cut needs the VM's network held: its filters are made here,
     * while it runs, once per QEMU. */
    if (j->a->cfg.pause_live) {
        char why[256];

        j->live = hold_ready(j->vm, j->stop_timeout_ms, why, sizeof(why));
        if (!j->live) {
            snprintf(j->rd_why, sizeof(j->rd_why), "network not held: %s",
                     why);
            log_warnx("event=pause_path txn=%s vm=%s path=redirect "
                      "why=\"%s\"", j->txn, j->vm->cfg->name, j->rd_why);
        }
    }
    return NULL;
}

void *
txn_vm_freeze(void *arg)
{
    struct txn_vm_prep *j = arg;

    quiesce_freeze(j->a, j->vm, j->txn, j->freeze_timeout_ms);
    return NULL;
}

static void
set_held(struct txn_vm_prep *j, int held, int hold_only)
{
    pthread_mutex_lock(&j->a->mu);
    j->vm->held = held;
    j->vm->hold_only = hold_only;
    pthread_mutex_unlock(&j->a->mu);
}

/* The live cut: the VM's network held, then its switch, with no stop.  1
 * when nothing was held (QEMU refused): the caller stops the VM as on the
 * redirect path.  0 otherwise: cut (j->t0/t1 are the switch, th0 when the
 * hold began), cut in the pause (the switch refused: stopped, and held
 * until its resume all the same), or failed (rc, err; what may be held
 * is released by the resume: the reaper's retry when QEMU did not
 * answer). */
static int
live_cut(struct txn_vm_prep *j, struct qmp_err *err)
{
    struct vm *v = j->vm;

    /* marked before the hold, so that any resume turns it off */
    set_held(j, 1, 1);
    j->th0 = j->t0;
    if (hold_on(v, j->stop_timeout_ms, err) < 0) {
        if (err->kind == QMP_E_ERROR) {
            set_held(j, 0, 0);
            j->live = 0;
            snprintf(j->rd_why, sizeof(j->rd_why), "network not held: %s",
                     err->msg);
            log_warnx("event=pause_path txn=%s vm=%s path=redirect "
                      "why=\"%s\"", j->txn, v->cfg->name, j->rd_why);
            return 1;
        }
        j->rc = -1;
        j->t1 = mono_ms();
        return 0;
    }
    j->tsw0 = j->t0 = mono_ms();
    j->rc = vm_qmp(v, "transaction", redirect_switch_args(v),
                   j->stop_timeout_ms, NULL, err);
    j->tsw1 = j->t1 = mono_ms();
    if (j->rc == 0) {
        j->redirect = RD_SWITCHED;
        return 0;
    }
    if (err->kind != QMP_E_ERROR)
        return 0;       /* no answer: may switch later; the merge reads */
    /* The switch refused: held, on its bases: cut in the pause. */
    j->live = 0;
    snprintf(j->rd_why, sizeof(j->rd_why), "switch: %s", err->msg);
    log_warnx("event=pause_path txn=%s vm=%s path=in_pause why=\"%s\"",
              j->txn, v->cfg->name, j->rd_why);
    set_held(j, 1, 0);
    j->t0 = mono_ms();
    j->rc = vm_stop(v, j->stop_timeout_ms, err);
    j->t1 = mono_ms();
    if (j->rc < 0 && err->kind == QMP_E_ERROR) {
        struct qmp_err e2;

        /* not stopped, runs: its network must not stay held */
        if (hold_off(v, j->stop_timeout_ms, &e2) == 0)
            set_held(j, 0, 0);
        else
            *err = e2;      /* the reaper's retry releases it */
    }
    return 0;
}

void *
txn_vm_pause(void *arg)
{
    struct txn_vm_prep *j = arg;
    struct qmp_err err;

    if (j->skip)
        return NULL;
    /* No stop while overlays of the VM are being formatted (redirect.h:
     * QEMU 7.2 aborts): a VM cut in the pause while its next overlays are
     * made waits for their jobs, before its pause begins; and none starts
     * until its cont (redirect_resumed). */
    if (redirect_stop_begin(j->a, j->vm, mono_ms() + j->stop_timeout_ms) < 0) {
        j->rc = -1;
        j->qmp_kind = QMP_E_ERROR;      /* not stopped: nothing to undo */
        j->code = "BUSY";
        snprintf(j->msg, sizeof(j->msg), "vm %s: not stopped: its overlays "
                 "were still being formatted after %d ms (a stop during "
                 "blockdev-create aborts QEMU 7.2)", j->vm->cfg->name,
                 j->stop_timeout_ms);
        return NULL;
    }
    j->t0 = mono_ms();
    if (j->redirect == RD_READY && j->live && live_cut(j, &err) == 0) {
        /* cut with its vCPUs running (or failed: rc) */
    } else if (j->redirect == RD_READY) {
        /* The cut: stop, then one transaction, atomic over the VM's disks,
         * sent together so that QEMU switches right after the stop with no
         * round trip to us in the pause.  A refused switch switched
         * nothing: the VM is cut in the pause instead, and its unused
         * overlays are removed after it.  A failed stop fails the prepare;
         * the switch may have run, and the merge that follows reads the
         * graph (redirect_merge). */
        int which = 1;

        j->rc = vm_stop_then(j->vm, "transaction",
                             redirect_switch_args(j->vm), j->stop_timeout_ms,
                             &j->t1, &which, &err);
        j->tsw0 = j->t1;
        j->tsw1 = mono_ms();
        if (j->rc == 0) {
            j->redirect = RD_SWITCHED;
        } else if (which == 2) {
            j->rc = 0;          /* paused; the switch refused */
            snprintf(j->rd_why, sizeof(j->rd_why), "switch: %s", err.msg);
            log_warnx("event=pause_path txn=%s vm=%s path=in_pause "
                      "why=\"%s\"", j->txn, j->vm->cfg->name, j->rd_why);
        }
    } else {
        j->rc = vm_stop(j->vm, j->stop_timeout_ms, &err);
        j->t1 = mono_ms();
    }
    if (j->rc < 0 && err.kind == QMP_E_ERROR)
        redirect_resumed(j->a, j->vm);      /* refused: it runs */
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

/* Step 1: snapshot every disk of the VM through its backend, by the
 * budget deadline. */
static void
commit_snapshot(struct txn_vm_commit *j)
{
    struct snap_err err = {0};

    for (int k = 0; k < j->ndisks; k++) {
        memset(&j->m[k], 0, sizeof(j->m[k]));
        vm_snap_disk(j->vm, j->disks[k], &j->m[k].disk);
        j->m[k].name = j->names[k];
        j->m[k].owner = j->x->id;
    }
    j->ts0 = mono_ms();
    if (j->ndisks > 0 &&
        j->vm->snap->create(j->m, j->ndisks, j->deadline, &j->budget_hit,
                            &err) < 0) {
        j->code = "INTERNAL";
        snprintf(j->msg, sizeof(j->msg), "%s", err.msg);
    }
    j->ts1 = mono_ms();
    if (j->ndisks > 0 && !j->code)
        redirect_note_snapshot_ms(j->ts1 - j->ts0);
}

/* Step 2: resume at once: this VM's disks are done (or the budget is
 * spent).  The pause ends when cont returns, not after the journal. */
static void
commit_resume(struct txn_vm_commit *j)
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
commit_confirm(struct txn_vm_commit *j)
{
    if (j->vm->snap->confirm)
        j->vm->snap->confirm(j->m, j->ndisks);
    /* What abort may delete: only what this commit made.  A create that
     * found the name taken fails and is not ours (m.ok == 0, no id). */
    for (int k = 0; k < j->ndisks; k++) {
        j->has_id[k] = j->m[k].has_id;
        j->snap_id[k] = j->m[k].id;
        j->created[k] = j->m[k].ok || j->m[k].has_id;
        j->pending[k] = j->m[k].pending;
    }
}

/* Step 4: the VM's entry of the reply, and its error if any:
 * BUDGET_EXCEEDED or SNAPSHOT_FAILED for the first failed disk, then a
 * failed resume. */
static void
commit_report(struct txn_vm_commit *j)
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
    if (x->cut_live[j->vmidx]) {
        /* never stopped: the guest waited only for its switch (its block
         * I/O); its sent packets waited from the hold until the resume */
        json_object_set_new(j->out, "paused_ms", json_real(
            x->t_stop1[j->vmidx] - x->t_stop0[j->vmidx]));
        json_object_set_new(j->out, "held_ms", json_real(
            j->tc1 - x->t_hold0[j->vmidx]));
        json_object_set_new(j->out, "pause_path", json_string("live"));
    } else {
        json_object_set_new(j->out, "pause_path", json_string(
            redirect_path_name(j->rd == RD_SWITCHED)));
    }
    if ((j->rd == RD_READY || j->rd == RD_SWITCHED) && !j->merge_bg) {
        json_object_set_new(j->out, "merge_ms", json_real(j->merge_ms));
        if (j->merge_err[0])
            json_object_set_new(j->out, "merge_error",
                                json_string(j->merge_err));
    }
    quiesce_report(j->a, j->out, j->vm, 1);
}

void *
txn_vm_commit(void *arg)
{
    struct txn_vm_commit *j = arg;
    struct snap_member m[CFG_MAX_DISKS];

    j->m = m;
    j->rd = j->x->rd ? j->x->rd[j->vmidx] : RD_NONE;
    if (j->rd == RD_SWITCHED) {
        /* The cut was made in prepare: resume first.  The bases' snapshots
         * are outside the pause; they still must exist before COMMITTED,
         * by the same budget as on the other path. */
        commit_resume(j);
        commit_snapshot(j);
    } else {
        commit_snapshot(j);
        commit_resume(j);
    }
    commit_confirm(j);
    if (j->rd == RD_READY || j->rd == RD_SWITCHED) {
        /* After the snapshots exist (or failed): the overlays go back, in
         * the background; the reply waits for them only up to its
         * deadline (txn_vm_commit_merged).  Here when a merge of the VM
         * runs already (none should: a prepare waits for it). */
        double t0 = mono_ms();

        if (!(j->merge_bg = redirect_finish_bg(j->a, j->vm))) {
            if (redirect_finish(j->a, j->vm, "commit", j->merge_err,
                                sizeof(j->merge_err)) == 0)
                j->merge_err[0] = '\0';
            j->merge_ms = mono_ms() - t0;
        }
        j->x->rd[j->vmidx] = RD_MERGED;
    } else if (j->rd == RD_NONE) {
        /* cut in the pause: its next cut's overlays, made from here */
        redirect_ahead_after_cut(j->a, j->vm);
    }
    commit_report(j);
    j->m = NULL;
    return NULL;
}

void
txn_vm_commit_merged(struct txn_vm_commit *j, double deadline)
{
    char err[512];
    double ms = 0;
    int rc;

    if (!j->merge_bg)
        return;
    rc = redirect_finish_wait(j->a, j->vm, deadline, &ms, err, sizeof(err));
    if (rc == 1) {
        /* the reply does not wait longer: the merge goes on, and the
         * VM's next prepare waits for it before any stop */
        json_object_set_new(j->out, "merge", json_string("background"));
        log_info("event=redirect_merge_background txn=%s vm=%s",
                 j->x->id, j->vm->cfg->name);
        return;
    }
    json_object_set_new(j->out, "merge_ms", json_real(ms));
    if (rc < 0)
        json_object_set_new(j->out, "merge_error", json_string(err));
}
