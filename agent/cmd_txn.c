/*
 * cmd_txn: the transaction commands (agent-protocol §4.3-4.6, §5):
 *
 *   prepare  parse ─► begin (replay a known txn, BUSY checks, PREPARING)
 *            ─► bound (refuse a pause nothing bounds) ─► journal (durable before any pause) ─► pause (freezes,
 *            then stops, one thread per VM) ─► sort the outcome ─►
 *            PREPARED with the lease armed, or undo (resume what was
 *            paused, thaw) and fail the whole prepare
 *   commit   begin (replay, validate disks, claim the txn before its lease
 *            expires) ─► each VM's commit in parallel (txn_vm.c) ─►
 *            COMMITTED or FAILED
 *   abort    claim ─► resume (if still paused) ─► merge the overlays of
 *            the redirect cut back (redirect_merge.c) ─► delete the member
 *            snapshots (one thread per VM) ─► ABORTED
 *   resume   cont the named VMs
 *
 * prepare's steps are prepare.c; one VM's part of each is txn_vm.c.  A
 * txn's state lives in the table of txn.c; a request that finds its txn in
 * a transitional state waits for the owner (agent_txn_stable).
 */
#include "cmd.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "mono.h"
#include "par.h"
#include "prepare.h"
#include "quiesce.h"
#include "reaper.h"
#include "redirect.h"
#include "resume.h"
#include "txn_vm.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

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

/* ---- prepare (the steps: prepare.c) ---------------------------------- */

json_t *
cmd_prepare(struct agent *a, json_t *args, const char **code, char *msg,
            size_t msglen, json_t **err_result)
{
    struct prepare p = {.a = a, .t_in = mono_ms()};
    json_t *result = NULL;

    if (prepare_parse(&p, args, code, msg, msglen) < 0 ||
        prepare_begin(&p, &result, code, msg, msglen) != 0 ||
        prepare_bound(&p, code, msg, msglen) < 0 ||
        prepare_probe(&p, code, msg, msglen) < 0 ||
        prepare_journal(&p, code, msg, msglen) < 0)
        return result;
    prepare_pause(&p);
    prepare_sort(&p);
    if (p.failed >= 0) {
        prepare_undo(&p, code, msg, msglen, err_result);
        return NULL;
    }
    return prepare_done(&p);
}

/* ---- commit ---------------------------------------------------------- */

/* Aborts txn id for a commit that found vm resumed since prepare. */
static void
commit_abort(struct agent *a, const char *id, const char *vm)
{
    json_t *args = json_pack("{s:s}", "txn", id), *res, *err_result = NULL;
    const char *code = NULL;
    char msg[256];

    log_warnx("event=commit_refused txn=%s vm=%s why=resumed_since_prepare",
              id, vm);
    res = cmd_abort(a, args, &code, msg, sizeof(msg), &err_result);
    json_decref(res);
    json_decref(err_result);
    json_decref(args);
}

/*
 * Finds txn id PREPARED and claims it for this commit (COMMITTING), after
 * the request's disks were checked, so that a bad request changes
 * nothing.  t_arrive: when the commit arrived; its budget counts from
 * there.  Returns 0 with jobs[0..*n) ready, 1 with *replay (a finished
 * commit's stored result, or NULL with the error set), or -1 with the
 * error set.
 */
static int
commit_begin(struct agent *a, json_t *args, double t_arrive,
             struct txn_vm_commit *jobs, int *n, struct txn **xp,
             json_t **replay, const char **code, char *msg, size_t msglen,
             json_t **err_result)
{
    const char *id = json_string_value(json_object_get(args, "txn"));
    json_t *snaps = json_object_get(args, "snapshots"), *nv;
    json_int_t budget = json_integer_value(json_object_get(args, "budget_ms"));
    enum txn_claim claim;
    const char *key;
    struct txn *x;

    pthread_mutex_lock(&a->mu);
    x = agent_txn_stable(a, id);
    if (!x) {
        pthread_mutex_unlock(&a->mu);
        FAIL("UNKNOWN_TXN", "txn %s was never prepared here (or the agent "
             "restarted)", id);
    }
    switch (x->state) {
    case TXN_COMMITTED:
        *replay = json_deep_copy(x->commit_result);
        pthread_mutex_unlock(&a->mu);
        return 1;
    case TXN_FAILED:
        *code = code_static(x->err_code);
        snprintf(msg, msglen, "%s", x->err_msg);
        *err_result = json_deep_copy(x->commit_result);
        pthread_mutex_unlock(&a->mu);
        return 1;
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
    /* A member resumed since prepare (a `resume` inside the txn) would
     * make the cut inconsistent: abort instead of committing. */
    for (int i = 0; i < x->nvms; i++) {
        struct vm *v = agent_find_vm(a, x->vms[i]);

        if (x->state == TXN_PREPARED && v &&
            v->paused_at != x->t_stop0[i]) {
            pthread_mutex_unlock(&a->mu);
            commit_abort(a, id, x->vms[i]);
            FAIL("ABORTED", "txn %s aborted: vm %s was resumed after "
                 "prepare, a cut now would not be consistent", id,
                 x->vms[i]);
        }
    }
    /* Validate disks before claiming, so a bad request changes nothing. */
    *n = x->nvms;
    for (int i = 0; i < *n; i++) {
        jobs[i] = (struct txn_vm_commit){.a = a, .x = x, .vmidx = i,
                                         .t_arrive = t_arrive,
                                         .deadline = t_arrive +
                                                     (double)budget};
        jobs[i].vm = agent_find_vm(a, x->vms[i]);
    }
    json_object_foreach(snaps, key, nv) {
        struct vm *v;
        int d, k;
        if (agent_find_disk(a, key, &v, &d) < 0) {
            pthread_mutex_unlock(&a->mu);
            FAIL("UNKNOWN_DISK", "unknown disk %s", key);
        }
        for (k = 0; k < *n; k++)
            if (jobs[k].vm == v)
                break;
        if (k == *n) {
            pthread_mutex_unlock(&a->mu);
            FAIL("UNKNOWN_DISK", "disk %s is not on a VM of txn %s", key, id);
        }
        jobs[k].disks[jobs[k].ndisks] = d;
        jobs[k].names[jobs[k].ndisks++] = json_string_value(nv);
    }
    claim = txn_claim_commit(&a->txns, x);
    pthread_mutex_unlock(&a->mu);
    if (claim == TXN_CLAIM_EXPIRE) {
        reaper_expire(a, x);
        FAIL("EXPIRED", "txn %s: lease expired before commit; its VMs were "
             "resumed", id);
    }
    if (claim != TXN_CLAIM_COMMIT)
        FAIL("INTERNAL", "txn %s in unexpected state", id);
    *xp = x;
    return 0;
cleanup:
    return -1;
}

/* Records in x what this commit made, for abort: by name, and for rbd by
 * snap id (a snapshot of the same name made by someone else is never
 * recorded: its create failed). */
static void
record_created(struct agent *a, struct txn *x, struct txn_vm_commit *jobs,
               int n)
{
    pthread_mutex_lock(&a->mu);
    if (!x->created_ids)
        x->created_ids = json_object();
    for (int i = 0; i < n; i++)
        for (int k = 0; k < jobs[i].ndisks; k++) {
            char did[400];

            if (!jobs[i].created[k] && !jobs[i].pending[k])
                continue;
            snprintf(did, sizeof(did), "%s/%s", jobs[i].vm->cfg->name,
                     jobs[i].vm->cfg->disks[jobs[i].disks[k]].node);
            json_object_set_new(x->created, did,
                                json_string(jobs[i].names[k]));
            /* id known: by id; still running: null, abort checks the
                 * owner key the late create sets (rbd) */
            if (jobs[i].has_id[k] && x->created_ids)
                json_object_set_new(x->created_ids, did, json_integer(
                    (json_int_t)jobs[i].snap_id[k]));
            else if (jobs[i].pending[k] && x->created_ids)
                json_object_set_new(x->created_ids, did, json_null());
        }
    pthread_mutex_unlock(&a->mu);
}

json_t *
cmd_commit(struct agent *a, json_t *args, const char **code, char *msg,
           size_t msglen, json_t **err_result)
{
    const char *id = json_string_value(json_object_get(args, "txn"));
    json_int_t budget = json_integer_value(json_object_get(args, "budget_ms"));
    struct txn_vm_commit jobs[CFG_MAX_VMS];
    double t_arrive = mono_ms();
    const char *ecode = NULL;
    char emsg[512] = "";
    json_t *vmarr, *result = NULL;
    struct txn *x = NULL;
    int n = 0;

    if (commit_begin(a, args, t_arrive, jobs, &n, &x, &result, code, msg,
                     msglen, err_result) != 0)
        return result;

    par_run(txn_vm_commit, jobs, sizeof(*jobs), n);
    /* The redirected VMs' merges run on in the background: the reply waits
     * for them (so that the next prepare finds every agent's overlays
     * ready) until the budget plus RD_REPLY_WAIT_MS, inside the
     * coordinator's wait for it (budget + 2 s). */
    for (int i = 0; i < n; i++)
        txn_vm_commit_merged(&jobs[i], t_arrive + (double)budget +
                             RD_REPLY_WAIT_MS);
    record_created(a, x, jobs, n);
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
             n, json_object_size(json_object_get(args, "snapshots")),
             mono_ms() - t_arrive);
    return result;
}

/* ---- abort ----------------------------------------------------------- */

/* One member snapshot that an abort deletes, and how that went. */
struct abort_del {
    struct vm *v;
    int d, ours, rc;
    const char *key, *name;
    json_t *jid;
    char err[512];
};

/* One VM's member snapshots, deleted one after another in its thread. */
struct abort_vm_job {
    struct agent *a;
    const char *txn;
    struct abort_del *items;
    int n;
    struct vm *v;
};

static void *
abort_vm_delete(void *arg)
{
    struct abort_vm_job *j = arg;

    for (int i = 0; i < j->n; i++) {
        struct abort_del *e = &j->items[i];

        if (e->v != j->v)
            continue;
        e->rc = cmd_snap_delete_owned(j->a, e->v, e->d, e->name, j->txn,
                                      e->ours, e->jid, e->err,
                                      sizeof(e->err));
    }
    return NULL;
}

/*
 * Deletes the member snapshots in todo (disk key -> name), one thread per
 * VM.  One after another, an abort of 75 (25 VMs, bench scale at 100 VMs
 * on a loaded host) ended 20 s after the commit it undid, and every
 * prepare of those VMs meanwhile was BUSY: the VMs stay in the aborting
 * txn until the deletes are done.  Results go to deleted / not_deleted
 * in todo's order (unknown disks first).
 */
static void
abort_delete(struct agent *a, const char *txn, json_t *todo, json_t *mine,
             json_t *ids, json_t *deleted, json_t *not_deleted)
{
    size_t n = json_object_size(todo), k = 0;
    struct abort_del *items = calloc(n ? n : 1, sizeof(*items));
    struct abort_vm_job jobs[CFG_MAX_VMS];
    const char *key;
    json_t *nv;
    int nj = 0;

    json_object_foreach(todo, key, nv) {
        struct abort_del *e = items ? &items[k++] : NULL;
        struct vm *v;
        int d, seen = 0;

        if (agent_find_disk(a, key, &v, &d) < 0 || !e) {
            json_array_append_new(not_deleted, json_pack(
                "{s:s,s:s,s:s}", "disk", key, "name", json_string_value(nv),
                "error", e ? "UNKNOWN_DISK" : "out of memory"));
            if (e)
                e->v = NULL;
            continue;
        }
        /* This commit made it, or started it and gave up at the budget
         * (id null).  A late create of a backend that tags its owner is
         * judged by that tag; one that tags nothing (qmp-transaction) is
         * known by name alone, or it would be left behind untagged. */
        *e = (struct abort_del){.v = v, .d = d, .key = key,
                                .name = json_string_value(nv),
                                .jid = json_object_get(ids, key)};
        e->ours = json_equal(json_object_get(mine, key), nv) &&
                  (!json_is_null(e->jid) || !v->snap->tags_owner);
        for (int i = 0; i < nj; i++)
            seen |= jobs[i].v == v;
        if (!seen && nj < CFG_MAX_VMS)
            jobs[nj++] = (struct abort_vm_job){.a = a, .txn = txn,
                                               .items = items, .v = v};
    }
    for (int i = 0; i < nj; i++)
        jobs[i].n = (int)k;
    par_run(abort_vm_delete, jobs, sizeof(jobs[0]), nj);
    for (size_t i = 0; i < k; i++) {
        struct abort_del *e = &items[i];

        if (!e->v)
            continue;
        if (e->rc == 1)
            json_array_append_new(deleted, json_pack(
                "{s:s,s:s}", "disk", e->key, "name", e->name));
        else if (e->rc < 0)
            json_array_append_new(not_deleted, json_pack(
                "{s:s,s:s,s:s}", "disk", e->key, "name", e->name,
                "error", e->err));
    }
    free(items);
}

json_t *
cmd_abort(struct agent *a, json_t *args, const char **code, char *msg,
          size_t msglen, json_t **err_result)
{
    const char *id = json_string_value(json_object_get(args, "txn"));
    json_t *extra = json_object_get(args, "snapshots"), *todo;
    json_t *resumed = json_array(), *deleted = json_array();
    json_t *not_deleted = json_array(), *timings = json_array(), *ids, *mine;
    struct vm *vms[CFG_MAX_VMS];
    struct resume_job rj[CFG_MAX_VMS];
    struct txn *x;
    int was_prepared = 0, n = 0;

    (void)code, (void)msg, (void)msglen, (void)err_result;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        x = agent_txn_stable(a, id);
        if ((x = txn_begin_abort(&a->txns, id, &was_prepared)))
            break;
        agent_wait(a, 10);
    }
    todo = json_deep_copy(x->created);
    mine = json_deep_copy(x->created);
    ids = x->created_ids ? json_deep_copy(x->created_ids) : json_object();
    if (was_prepared)
        for (int i = 0; i < x->nvms; i++)
            if ((vms[n] = agent_find_vm(a, x->vms[i])))
                n++;
    pthread_mutex_unlock(&a->mu);
    if (extra)
        json_object_update_missing(todo, extra);

    resume_vms(a, vms, n, id, "abort", rj);
    /* A VM resumed on its overlays writes there: merge them back. */
    redirect_merge_txn(a, x, "abort");
    for (int i = 0; i < n; i++)
        if (rj[i].rc == 0) {
            json_t *o = json_pack("{s:s,s:f,s:f}", "vm", vms[i]->cfg->name,
                                  "cont_ms", rj[i].cont_ms, "paused_ms",
                                  rj[i].paused_ms);
            /* The thaw ran in resume_one (after cont, before this reply):
             * an aborted fs-freeze txn can leave a guest frozen too. */
            quiesce_report_thaw(a, o, vms[i]);
            json_array_append_new(resumed, json_string(vms[i]->cfg->name));
            json_array_append_new(timings, o);
        }
    abort_delete(a, id, todo, mine, ids, deleted, not_deleted);
    json_decref(todo);
    json_decref(ids);
    json_decref(mine);
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

/* ---- resume ---------------------------------------------------------- */

json_t *
cmd_resume(struct agent *a, json_t *args, const char **code, char *msg,
           size_t msglen, json_t **err_result)
{
    json_t *jvms = json_object_get(args, "vms"), *v, *arr;
    struct vm *vms[CFG_MAX_VMS];
    struct resume_job rj[CFG_MAX_VMS];
    size_t i;
    int n = (int)json_array_size(jvms);

    (void)err_result;
    if (n > CFG_MAX_VMS)
        FAIL("BAD_REQUEST", "too many VMs");
    json_array_foreach(jvms, i, v)
        if (!(vms[i] = agent_find_vm(a, json_string_value(v))))
            FAIL("UNKNOWN_VM", "unknown vm %s", json_string_value(v));
    resume_vms(a, vms, n, NULL, "resume", rj);
    for (int k = 0; k < n; k++)
        if (rj[k].rc < 0)
            FAIL(vm_err_code(&rj[k].err), "vm %s: %s", vms[k]->cfg->name,
                 rj[k].err.msg);
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
