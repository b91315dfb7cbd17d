/* prepare: see prepare.h. */
#include "prepare.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "log.h"
#include "mono.h"
#include "par.h"
#include "quiesce.h"
#include "redirect.h"
#include "resume.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

/* Ends a prepare that failed: the txn is forgotten (a.mu not held). */
static void
fail_prepare(struct agent *a, struct txn *x)
{
    pthread_mutex_lock(&a->mu);
    txn_fail_prepare(&a->txns, x);
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mu);
}

/* 1 when vms names exactly the VMs of x (any order). */
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

/* Step 1: the arguments, and the VMs they name. */
int
prepare_parse(struct prepare *p, json_t *args, const char **code, char *msg,
              size_t msglen)
{
    const char *quiesce = json_string_value(json_object_get(args, "quiesce"));
    json_t *jft = json_object_get(args, "freeze_timeout_ms"), *v;
    size_t i;

    p->id = json_string_value(json_object_get(args, "txn"));
    p->jvms = json_object_get(args, "vms");
    p->lease = json_integer_value(json_object_get(args, "lease_ms"));
    p->n = (int)json_array_size(p->jvms);
    p->freeze_ms = p->a->cfg.freeze_timeout_ms;
    p->failed = -1;
    if (p->n > CFG_MAX_VMS)
        FAIL("BAD_REQUEST", "too many VMs (%d > %d)", p->n, CFG_MAX_VMS);
    if (quiesce && strcmp(quiesce, "crash") && strcmp(quiesce, "fs-freeze"))
        FAIL("BAD_REQUEST", "args.quiesce must be \"crash\" or "
             "\"fs-freeze\", got \"%s\"", quiesce);
    p->freeze = quiesce && strcmp(quiesce, "fs-freeze") == 0;
    /* The coordinator sizes its wait for PREPARED on the freeze timeout it
     * sends; taking the smaller of it and ours keeps that wait long enough
     * by construction, whatever this agent's config says.  Absent (older
     * coordinators): our config alone. */
    if (jft && json_integer_value(jft) < p->freeze_ms)
        p->freeze_ms = (int)json_integer_value(jft);
    json_array_foreach(p->jvms, i, v) {
        p->names[i] = json_string_value(v);
        if (!(p->vms[i] = agent_find_vm(p->a, p->names[i])))
            FAIL("UNKNOWN_VM", "unknown vm %s", p->names[i]);
    }
    return 0;
cleanup:
    return -1;
}

/* A prepare of a txn the table knows (a.mu held): replays the stored
 * result of the same prepare, else the error its state calls for. */
static json_t *
prepare_known(struct prepare *p, struct txn *x, const char **code, char *msg,
              size_t msglen)
{
    switch (x->state) {
    case TXN_PREPARED:
        if (same_vms(x, p->jvms))
            return json_deep_copy(x->prepare_result);
        *code = "BAD_REQUEST";
        snprintf(msg, msglen, "txn %s is already prepared with other VMs",
                 p->id);
        break;
    case TXN_EXPIRED:
        *code = "EXPIRED";
        snprintf(msg, msglen, "txn %s: lease expired", p->id);
        break;
    case TXN_ABORTED:
        *code = "ABORTED";
        snprintf(msg, msglen, "txn %s was aborted", p->id);
        break;
    default:
        *code = "BAD_REQUEST";
        snprintf(msg, msglen, "txn %s is already %s", p->id,
                 txn_state_name(x->state));
    }
    return NULL;
}

/*
 * Step 2: enters PREPARING.  Returns 0 with p->x set, or 1 when the txn
 * is known (*replay: its stored result, or NULL with the error set), or
 * -1 with the error set.
 */
int
prepare_begin(struct prepare *p, json_t **replay, const char **code,
              char *msg, size_t msglen)
{
    struct agent *a = p->a;
    struct txn *x;
    int rc = -1;

    pthread_mutex_lock(&a->mu);
    if ((x = agent_txn_stable(a, p->id))) {
        *replay = prepare_known(p, x, code, msg, msglen);
        rc = 1;
        goto cleanup;
    }
    for (int k = 0; k < p->n; k++) {
        char why[300];

        if (p->vms[k]->ops->snap_check &&
            p->vms[k]->ops->snap_check(p->vms[k], why, sizeof(why)) < 0)
            /* its commit could not snapshot it: no pause for nothing */
            FAIL("BAD_REQUEST", "%s", why);
        if (p->vms[k]->starting)
            /* vm.start is still opening its disks: no cut of it yet. */
            FAIL("BUSY", "vm %s is being started (vm.start)", p->names[k]);
        if (p->vms[k]->storage_pending)
            /* bringup has not opened its disks yet (Ceph unreachable
             * since start): a commit could not snapshot them. */
            FAIL("BUSY", "vm %s: its disks are not open yet (the agent is "
                 "still connecting to storage)", p->names[k]);
        if (p->freeze && p->vms[k]->thaw_pending)
            /* A retried thaw could land inside the new freeze and thaw
             * it: no fs-freeze cut until the old thaw is answered. */
            FAIL("BUSY", "vm %s: a thaw of its guest is still pending "
                 "(guest agent not answering)", p->names[k]);
        if (p->vms[k]->needs_resume)
            /* A background resume is pending: pausing now would let that
             * late `cont` break the new cut. */
            FAIL("BUSY", "vm %s has a pending resume (QEMU not answering)",
                 p->names[k]);
    }
    p->x = txn_begin_prepare(&a->txns, p->id, p->names, p->n, code, msg,
                             msglen);
    rc = p->x ? 0 : -1;
cleanup:
    pthread_mutex_unlock(&a->mu);
    return rc;
}

/*
 * Step 2a (invariant 2): no pause that nothing bounds.  A VM whose
 * snapshot method can hold it paused past the commit's budget (QMP
 * transaction on rbd: QEMU's main loop, which serves `cont`, waits for
 * Ceph) is paused only if that wait has a limit.  Refused before anything
 * is journaled or paused; the txn is forgotten.
 */
int
prepare_bound(struct prepare *p, const char **code, char *msg, size_t msglen)
{
    struct snap_err err = {0};

    for (int k = 0; k < p->n; k++) {
        struct vm *v = p->vms[k];
        int was = v->bound_at > 0 ? v->bound_ms : -2;

        if (vm_pause_bound(v, p->a->cfg.qmp_timeout_ms, &err) < 0) {
            fail_prepare(p->a, p->x);
            FAIL(err.kind == SNAP_E_TIMEOUT ? "QMP_TIMEOUT" :
                 err.kind == SNAP_E_STORAGE ? "SNAPSHOT_FAILED" : "QMP_ERROR",
                 "vm %s: no VM paused: cannot tell how long method %s can "
                 "hold it paused: %s", p->names[k], v->snap->name, err.msg);
        }
        if (v->bound_ms != was)
            log_info("event=pause_bound vm=%s method=%s bound_ms=%d "
                     "why=\"%s\"", p->names[k], v->snap->name, v->bound_ms,
                     v->bound_why);
        if (v->bound_ms < 0) {
            fail_prepare(p->a, p->x);
            FAIL("SNAPSHOT_FAILED", "vm %s: no VM paused: method %s would "
                 "leave its pause unbounded if Ceph hangs (QEMU runs the "
                 "snapshot in its main loop, which also serves cont): %s; "
                 "set both in the ceph.conf QEMU uses, or use method = rbd",
                 p->names[k], v->snap->name, v->bound_why);
        }
    }
    return 0;
cleanup:
    return -1;
}

/*
 * Step 2b: no `stop` that would wait on storage that does not answer.
 * QEMU's `stop` stops the vCPUs, then waits in its main loop for the
 * VM's I/O in flight (bdrv_drain_all): with the OSD of that I/O hung, it
 * waits until Ceph answers or QEMU's own Ceph op timeout ends the I/O, and
 * no `cont` is served meanwhile, so no lease can end that pause.  Before
 * anything is journaled or paused, one read of each RBD disk the agent
 * has open (rbdsnap_probe), all at once, by one deadline: a read not
 * answered refuses the prepare, no VM paused.  The deadline is
 * storage_probe_ms, at most a quarter of the lease, so that the refusal
 * reaches the coordinator before its wait for PREPARED (half the lease by
 * default) ends.  What it does not cover: an OSD that hangs after the
 * probe, or one that holds none of the disks' first objects; there stop's
 * own deadline fails the prepare and the reaper resumes the VM once its
 * QEMU answers (prepare_sort, txn_vm_pause).
 */
int
prepare_probe(struct prepare *p, const char **code, char *msg, size_t msglen)
{
    struct rbdsnap_probe **pr;
    int ms = p->a->cfg.storage_probe_ms, bad_vm = -1, bad_disk = -1;
    double t0 = mono_ms(), deadline;

    if (ms <= 0)
        return 0;
    if (p->lease / 4 < ms)
        ms = p->lease / 4 > 0 ? (int)(p->lease / 4) : 1;
    deadline = t0 + ms;
    if (!(pr = calloc((size_t)p->n * CFG_MAX_DISKS, sizeof(*pr)))) {
        fail_prepare(p->a, p->x);
        FAIL("INTERNAL", "no VM paused: out of memory");
    }
    for (int k = 0; k < p->n; k++)
        for (int d = 0; d < p->vms[k]->cfg->ndisks; d++) {
            char err[256];

            if (p->vms[k]->img[d] &&
                rbdsnap_probe_start(p->vms[k]->img[d],
                                    &pr[k * CFG_MAX_DISKS + d], err,
                                    sizeof(err)) < 0)
                /* not started is not a hang: the stop decides */
                log_warnx("event=storage_probe txn=%s vm=%s disk=%s "
                          "result=not_started msg=\"%s\"", p->id,
                          p->names[k], p->vms[k]->cfg->disks[d].node, err);
        }
    /* every probe is awaited (and so consumed), by the one deadline */
    for (int k = 0; k < p->n; k++)
        for (int d = 0; d < p->vms[k]->cfg->ndisks; d++) {
            struct rbdsnap_probe *q = pr[k * CFG_MAX_DISKS + d];

            if (q && rbdsnap_probe_wait(q, deadline) == 1 && bad_vm < 0) {
                bad_vm = k;
                bad_disk = d;
            }
        }
    free(pr);
    if (bad_vm >= 0) {
        const struct cfg_disk *cd = &p->vms[bad_vm]->cfg->disks[bad_disk];

        fail_prepare(p->a, p->x);
        log_warnx("event=storage_probe txn=%s vm=%s disk=%s image=%s/%s "
                  "result=no_answer waited_ms=%.1f", p->id, p->names[bad_vm],
                  cd->node, cd->pool, cd->image, mono_ms() - t0);
        FAIL("SNAPSHOT_FAILED", "vm %s: no VM paused: disk %s (rbd %s/%s) "
             "did not answer a read within %d ms: its storage does not "
             "answer, and `stop` would hold the VM paused while it waits "
             "for the VM's I/O", p->names[bad_vm], cd->node, cd->pool,
             cd->image, ms);
    }
    return 0;
cleanup:
    return -1;
}

/*
 * Step 3: durable before the pause (agent-protocol §7): a crash after
 * `stop` must leave a record that makes the next start resume the VM.
 * One write for all VMs, so that no VM's pause waits for another's fsync.
 * With fs-freeze the same write records `frozen` for every VM with a guest
 * agent, before its freeze: a crash before the thaw must leave a record
 * that makes the next start thaw the guest.  And `redirect` for every VM
 * that will take the redirect cut, before its overlays are made: a crash
 * after must leave a record that makes the next start merge them back.
 */
int
prepare_journal(struct prepare *p, const char **code, char *msg,
                size_t msglen)
{
    char jerr[256] = "out of memory";
    struct journal_entry *je;
    int nje = 0, rc = -1;
    double now = mono_ms();
    double settle_by = now + (p->lease / 4 < RD_SETTLE_WAIT_MS ?
                              (double)(p->lease / 4) : RD_SETTLE_WAIT_MS);
    int settled[CFG_MAX_VMS];

    /* A VM still on the overlays of an earlier cut (its merge failed):
     * its bases miss the writes since, so no cut of it until they are
     * merged back; and its journal entry must not be overwritten.  A VM
     * whose next overlays are still being made is cut in the pause. */
    for (int k = 0; k < p->n; k++) {
        settled[k] = redirect_settle(p->a, p->vms[k], settle_by,
                                     now + redirect_ahead_wait_ms(), jerr,
                                     sizeof(jerr));
        if (settled[k] < 0) {
            fail_prepare(p->a, p->x);
            FAIL("BUSY", "vm %s: no VM paused: the overlays of its previous "
                 "cut are not merged back yet: %s", p->names[k], jerr);
        }
        p->rd_why[k][0] = '\0';
        if (settled[k] == 1) {
            snprintf(p->rd_why[k], sizeof(p->rd_why[k]), "%s", jerr);
            log_warnx("event=pause_path txn=%s vm=%s path=in_pause "
                      "why=\"%s\"", p->id, p->names[k], jerr);
        }
    }
    snprintf(jerr, sizeof(jerr), "out of memory");
    je = calloc((size_t)(3 * p->n + 1), sizeof(*je));

    for (int k = 0, inline_n = 0; je && k < p->n; k++) {
        char why[256];

        p->rd[k] = settled[k] == 0 &&
            redirect_usable(p->a, p->vms[k], why, sizeof(why));
        /* No overlays made ahead (its first cut since the agent started,
         * or after a cut in the pause): making them here delays this
         * agent's PREPARED while other agents' VMs are paused already.
         * At 25 VMs per agent they took 2.2-3.0 s per VM (bench scale,
         * 100 VMs) and the prepare timed out.  So only a few make them
         * here; the others are cut in the pause and get theirs after the
         * txn (redirect_ahead_after_cut), for their next cut. */
        if (p->rd[k] && !redirect_ahead_ready(p->a, p->vms[k]) &&
            inline_n++ >= p->a->cfg.redirect_inline_max) {
            p->rd[k] = 0;
            snprintf(p->rd_why[k], sizeof(p->rd_why[k]),
                     "no overlays were made ahead for it, and %d VMs of "
                     "this prepare made theirs inside it (redirect_inline_max)",
                     p->a->cfg.redirect_inline_max);
            log_warnx("event=pause_path txn=%s vm=%s path=in_pause "
                      "why=\"%s\"", p->id, p->names[k], p->rd_why[k]);
        }
        je[nje].kind = JOURNAL_PAUSED;
        snprintf(je[nje].txn, sizeof(je[nje].txn), "%s", p->x->id);
        snprintf(je[nje].vm, sizeof(je[nje].vm), "%s", p->names[k]);
        nje++;
        if (p->freeze && p->vms[k]->ops->guest_configured(p->vms[k])) {
            je[nje] = je[nje - 1];
            je[nje].kind = JOURNAL_FROZEN;
            nje++;
        }
        /* overlays made ahead have their entry already */
        if (p->rd[k] && !redirect_ahead_ready(p->a, p->vms[k])) {
            je[nje] = je[nje - 1];
            je[nje].kind = JOURNAL_REDIRECT;
            nje++;
        }
    }
    p->t_journal0 = mono_ms();
    if (je)
        rc = journal_put(p->a->journal, je, nje, jerr, sizeof(jerr));
    p->t_journal1 = mono_ms();
    free(je);
    if (rc < 0) {
        fail_prepare(p->a, p->x);
        FAIL("INTERNAL", "no VM paused: %s", jerr);
    }
    return 0;
cleanup:
    return -1;
}

/* Step 4: the overlays of the redirect cut first (the VMs run), then all
 * freezes, then all stops: the overlays and the freeze wait (up to sync +
 * freeze deadlines) are outside every VM's pause window. */
void
prepare_pause(struct prepare *p)
{
    /* A stop that has not returned within the lease fails: the others,
     * already paused, must not wait longer than the lease for it. */
    int stop_ms = p->lease < p->a->cfg.qmp_timeout_ms ? (int)p->lease :
                  p->a->cfg.qmp_timeout_ms;

    p->t_pause0 = mono_ms();

    for (int k = 0; k < p->n; k++) {
        p->jobs[k] = (struct txn_vm_prep){.a = p->a, .vm = p->vms[k],
                                          .txn = p->x->id, .journaled = 1,
                                          .freeze_timeout_ms = p->freeze_ms,
                                          .stop_timeout_ms = stop_ms,
                                          .redirect = p->rd[k] ? RD_READY :
                                                      RD_NONE};
        snprintf(p->jobs[k].rd_why, sizeof(p->jobs[k].rd_why), "%s",
                 p->rd_why[k]);
        quiesce_reset(p->a, p->vms[k]);
    }
    par_run(txn_vm_overlay, p->jobs, sizeof(p->jobs[0]), p->n);
    for (int k = 0; k < p->n; k++)
        if (p->jobs[k].skip) {
            /* A VM's QEMU does not answer: the prepare fails; stop none. */
            for (int i = 0; i < p->n; i++)
                if (!p->jobs[i].skip) {
                    p->jobs[i].rc = -1;
                    p->jobs[i].skip = 1;
                    p->jobs[i].qmp_kind = QMP_E_ERROR;
                    p->jobs[i].code = p->jobs[k].code;
                    snprintf(p->jobs[i].msg, sizeof(p->jobs[i].msg),
                             "vm %s: not stopped: vm %s did not answer",
                             p->names[i], p->names[k]);
                }
            return;
        }
    if (p->freeze)
        par_run(txn_vm_freeze, p->jobs, sizeof(p->jobs[0]), p->n);
    par_run(txn_vm_pause, p->jobs, sizeof(p->jobs[0]), p->n);
}

/* Step 5: what each stop left: paused (undo it if the prepare fails),
 * refused by QEMU (not paused), or unknown (the reaper resumes it). */
void
prepare_sort(struct prepare *p)
{
    struct agent *a = p->a;

    for (int k = 0; k < p->n; k++) {
        struct txn_vm_prep *j = &p->jobs[k];

        /* the txn owns the overlays from here: commit, abort, an expired
         * lease or a failed prepare merges them back */
        p->x->rd[k] = (unsigned char)j->redirect;
        p->x->cut_live[k] = j->rc == 0 && j->live &&
                            j->redirect == RD_SWITCHED;
        p->x->t_hold0[k] = j->th0;
        if (j->rc < 0 && p->failed < 0)
            p->failed = k;
        if (!j->journaled)
            continue;
        if (j->rc == 0) {
            p->undo[p->nundo++] = p->vms[k];
        } else if (j->qmp_kind == QMP_E_ERROR) {
            /* QEMU refused the stop: not paused, nothing to undo. */
            char jerr[256];
            journal_remove(a->journal, p->vms[k]->cfg->name, jerr,
                           sizeof(jerr));
        } else {
            /* Timed out or lost: a hung QEMU may still run the queued
             * `stop` later.  The reaper keeps sending `cont` in the
             * background, so the error reply is not delayed by it. */
            pthread_mutex_lock(&a->mu);
            p->vms[k]->needs_resume = 1;
            snprintf(p->vms[k]->needs_resume_txn,
                     sizeof(p->vms[k]->needs_resume_txn), "%s", p->x->id);
            /* Its vCPUs may be stopped from here on (a `stop` draining
             * I/O that Ceph does not answer): the retry's `event=resumed
             * ... paused_ms` counts from this stop, an upper bound. */
            p->vms[k]->paused_at = j->t0;
            pthread_mutex_unlock(&a->mu);
            log_warnx("event=stop_unanswered txn=%s vm=%s waited_ms=%.1f "
                      "msg=\"its QEMU did not answer stop; resumed by the "
                      "retry once it answers\"", p->x->id, p->names[k],
                      j->t1 - j->t0);
        }
    }
}

/* Step 6a: all or nothing: resume what was paused, thaw the rest, and
 * fail with the first VM's error and the partial facts (§3.4). */
void
prepare_undo(struct prepare *p, const char **code, char *msg, size_t msglen,
             json_t **err_result)
{
    struct resume_job rj[CFG_MAX_VMS];
    struct txn_vm_prep *f = &p->jobs[p->failed];
    json_t *arr = json_array();

    resume_vms(p->a, p->undo, p->nundo, p->x->id, "prepare_failed", rj);
    redirect_merge_txn(p->a, p->x, "prepare_failed");
    for (int k = 0; k < p->n; k++)
        if (p->jobs[k].rc < 0)      /* not paused: thaw now */
            quiesce_thaw(p->a, p->vms[k], p->x->id);
    for (int k = 0, u = 0; k < p->n; k++) {
        struct txn_vm_prep *j = &p->jobs[k];
        json_t *o = json_pack("{s:s,s:b}", "vm", p->names[k], "stopped",
                              j->rc == 0);

        if (j->journaled)
            json_object_set_new(o, "stop_ms", json_real(j->t1 - j->t0));
        if (j->rc == 0 && u < p->nundo) {
            json_object_set_new(o, "resumed", json_boolean(rj[u].rc == 0));
            json_object_set_new(o, "cont_ms", json_real(rj[u].cont_ms));
            json_object_set_new(o, "paused_ms", json_real(rj[u].paused_ms));
            u++;
        } else if (j->rc < 0) {
            json_object_set_new(o, "error", json_string(j->msg));
        }
        json_array_append_new(arr, o);
    }
    *err_result = json_pack("{s:s,s:o}", "txn", p->id, "vms", arr);
    fail_prepare(p->a, p->x);
    log_warnx("event=prepare_failed txn=%s code=%s msg=\"%s\"", p->id,
              f->code, f->msg);
    *code = f->code;
    snprintf(msg, msglen, "%s", f->msg);
}

/* Step 6b: every VM is paused: PREPARED, and the lease is armed. */
json_t *
prepare_done(struct prepare *p)
{
    struct agent *a = p->a;
    json_t *arr = json_array(), *result;

    for (int k = 0; k < p->n; k++) {
        json_t *o;

        p->x->t_stop0[k] = p->jobs[k].t0;
        p->x->t_stop1[k] = p->jobs[k].t1;
        o = json_pack("{s:s,s:f,s:i,s:s}", "vm", p->names[k], "stop_ms",
                      p->jobs[k].t1 - p->jobs[k].t0, "overrun_ms",
                      p->vms[k]->bound_ms, "pause_path",
                      p->x->cut_live[k] ? "live" :
                      redirect_path_name(p->x->rd[k] == RD_SWITCHED));
        if (p->x->rd[k] == RD_SWITCHED)
            json_object_set_new(o, "switch_ms", json_real(p->jobs[k].tsw1 -
                                                          p->jobs[k].tsw0));
        if (p->x->cut_live[k])
            /* no stop: stop_ms is the switch, and the hold began this
             * long before it */
            json_object_set_new(o, "hold_on_ms", json_real(p->jobs[k].tsw0 -
                                                           p->jobs[k].th0));
        if (!p->x->cut_live[k] && p->jobs[k].rd_why[0])
            json_object_set_new(o, "pause_path_why",
                                json_string(p->jobs[k].rd_why));
        quiesce_report(a, o, p->vms[k], 0);
        json_array_append_new(arr, o);
    }
    result = json_pack("{s:s,s:s,s:o,s:I}", "txn", p->id, "state",
                       "prepared", "vms", arr, "lease_ms", p->lease);
    /* Where this agent's prepare spent its time (agent-protocol §4.3):
     * what comes before the stops is what other agents' paused VMs wait
     * for when this agent is the last to stop. */
    json_object_set_new(result, "steps_ms", json_pack(
        "{s:f,s:f,s:f,s:f}", "before_journal", p->t_journal0 - p->t_in,
        "journal", p->t_journal1 - p->t_journal0, "before_stops",
        p->t_pause0 - p->t_journal1, "stops", mono_ms() - p->t_pause0));
    pthread_mutex_lock(&a->mu);
    txn_prepared(&a->txns, p->x, (double)p->lease, json_deep_copy(result));
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mu);
    atomic_fetch_add(&a->n_prepared, 1);
    log_info("event=prepared txn=%s vms=%d lease_ms=%lld before_journal_ms=%.3f "
             "journal_ms=%.3f before_stops_ms=%.3f stops_ms=%.3f", p->id, p->n,
             (long long)p->lease, p->t_journal0 - p->t_in,
             p->t_journal1 - p->t_journal0, p->t_pause0 - p->t_journal1,
             mono_ms() - p->t_pause0);
    return result;
}
