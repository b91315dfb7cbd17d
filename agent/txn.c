/* txn: see txn.h. */
#include "txn.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void
txn_table_init(struct txn_table *t, txn_clock_fn now, void *opaque)
{
    t->head = NULL;
    t->now = now;
    t->clock_opaque = opaque;
}

static void
txn_free(struct txn *x)
{
    if (!x)
        return;
    for (int i = 0; i < x->nvms; i++)
        free(x->vms[i]);
    free(x->vms);
    json_decref(x->prepare_result);
    json_decref(x->commit_result);
    json_decref(x->created);
    json_decref(x->created_ids);
    free(x->t_stop0);
    free(x->t_stop1);
    free(x->rd);
    free(x->cut_live);
    free(x->t_hold0);
    free(x);
}

void
txn_table_clear(struct txn_table *t)
{
    while (t->head) {
        struct txn *x = t->head;
        t->head = x->next;
        txn_free(x);
    }
}

static double
now(struct txn_table *t)
{
    return t->now(t->clock_opaque);
}

struct txn *
txn_find(struct txn_table *t, const char *id)
{
    for (struct txn *x = t->head; x; x = x->next)
        if (strcmp(x->id, id) == 0)
            return x;
    return NULL;
}

const char *
txn_state_name(enum txn_state s)
{
    static const char *n[] = {"preparing", "prepared", "committing",
                              "committed", "failed", "expiring", "expired",
                              "aborting", "aborted"};
    return n[s];
}

int
txn_is_live(const struct txn *x)
{
    return x->state == TXN_PREPARING || x->state == TXN_PREPARED ||
           x->state == TXN_COMMITTING || x->state == TXN_EXPIRING ||
           x->state == TXN_ABORTING;
}

static void
unlink_txn(struct txn_table *t, struct txn *x)
{
    for (struct txn **p = &t->head; *p; p = &(*p)->next)
        if (*p == x) {
            *p = x->next;
            return;
        }
}

struct txn *
txn_begin_prepare(struct txn_table *t, const char *id,
                  const char *const *vms, int nvms, const char **code,
                  char *msg, size_t msglen)
{
    struct txn *x;

    for (x = t->head; x; x = x->next) {
        if (!txn_is_live(x))
            continue;
        for (int i = 0; i < x->nvms; i++)
            for (int j = 0; j < nvms; j++)
                if (strcmp(x->vms[i], vms[j]) == 0) {
                    *code = "BUSY";
                    snprintf(msg, msglen, "vm %s is in live txn %s (%s)",
                             vms[j], x->id, txn_state_name(x->state));
                    return NULL;
                }
    }
    x = calloc(1, sizeof(*x));
    if (!x)
        goto oom;
    snprintf(x->id, sizeof(x->id), "%s", id);
    x->vms = calloc(nvms ? (size_t)nvms : 1, sizeof(char *));
    if (!x->vms)
        goto oom;
    for (x->nvms = 0; x->nvms < nvms; x->nvms++)
        if (!(x->vms[x->nvms] = strdup(vms[x->nvms])))
            goto oom;
    x->created = json_object();
    x->t_stop0 = calloc(nvms ? (size_t)nvms : 1, sizeof(double));
    x->t_stop1 = calloc(nvms ? (size_t)nvms : 1, sizeof(double));
    x->rd = calloc(nvms ? (size_t)nvms : 1, 1);
    x->cut_live = calloc(nvms ? (size_t)nvms : 1, 1);
    x->t_hold0 = calloc(nvms ? (size_t)nvms : 1, sizeof(double));
    if (!x->created || !x->t_stop0 || !x->t_stop1 || !x->rd ||
        !x->cut_live || !x->t_hold0)
        goto oom;
    x->state = TXN_PREPARING;
    x->next = t->head;
    t->head = x;
    return x;
oom:
    txn_free(x);
    *code = "INTERNAL";
    snprintf(msg, msglen, "out of memory");
    return NULL;
}

void
txn_prepared(struct txn_table *t, struct txn *x, double lease_ms,
             json_t *result)
{
    assert(x->state == TXN_PREPARING);
    x->state = TXN_PREPARED;
    x->lease_deadline = now(t) + lease_ms;
    json_decref(x->prepare_result);
    x->prepare_result = result;
}

void
txn_fail_prepare(struct txn_table *t, struct txn *x)
{
    assert(x->state == TXN_PREPARING);
    unlink_txn(t, x);
    txn_free(x);
}

enum txn_claim
txn_claim_commit(struct txn_table *t, struct txn *x)
{
    if (x->state != TXN_PREPARED)
        return TXN_CLAIM_NONE;
    if (now(t) >= x->lease_deadline) {
        x->state = TXN_EXPIRING;
        return TXN_CLAIM_EXPIRE;
    }
    x->state = TXN_COMMITTING;
    return TXN_CLAIM_COMMIT;
}

void
txn_finish_commit(struct txn_table *t, struct txn *x, json_t *result,
                  const char *code, const char *msg)
{
    assert(x->state == TXN_COMMITTING);
    x->state = code ? TXN_FAILED : TXN_COMMITTED;
    x->finished_at = now(t);
    json_decref(x->commit_result);
    x->commit_result = result;
    snprintf(x->err_code, sizeof(x->err_code), "%s", code ? code : "");
    snprintf(x->err_msg, sizeof(x->err_msg), "%s", msg ? msg : "");
}

struct txn *
lease_claim_due(struct txn_table *t)
{
    double n = now(t);

    for (struct txn *x = t->head; x; x = x->next)
        if (x->state == TXN_PREPARED && n >= x->lease_deadline) {
            x->state = TXN_EXPIRING;
            return x;
        }
    return NULL;
}

void
txn_finish_expire(struct txn_table *t, struct txn *x)
{
    assert(x->state == TXN_EXPIRING);
    x->state = TXN_EXPIRED;
    x->finished_at = now(t);
}

double
lease_next_in(struct txn_table *t)
{
    double best = -1, n = now(t);

    for (struct txn *x = t->head; x; x = x->next)
        if (x->state == TXN_PREPARED) {
            double d = x->lease_deadline - n;
            if (d < 0)
                d = 0;
            if (best < 0 || d < best)
                best = d;
        }
    return best;
}

struct txn *
txn_begin_abort(struct txn_table *t, const char *id, int *was_prepared)
{
    struct txn *x = txn_find(t, id);
    const char *code;
    char msg[64];

    *was_prepared = 0;
    if (!x) {
        x = txn_begin_prepare(t, id, NULL, 0, &code, msg, sizeof(msg));
        if (!x)
            return NULL;
    } else if (x->state == TXN_PREPARING || x->state == TXN_COMMITTING ||
               x->state == TXN_EXPIRING || x->state == TXN_ABORTING) {
        return NULL;
    }
    *was_prepared = x->state == TXN_PREPARED;
    x->state = TXN_ABORTING;
    return x;
}

void
txn_finish_abort(struct txn_table *t, struct txn *x)
{
    assert(x->state == TXN_ABORTING);
    x->state = TXN_ABORTED;
    x->finished_at = now(t);
}

int
txn_gc(struct txn_table *t)
{
    double n = now(t);
    int dropped = 0;
    struct txn **p = &t->head;

    while (*p) {
        struct txn *x = *p;
        if (!txn_is_live(x) && n - x->finished_at > TXN_KEEP_MS) {
            *p = x->next;
            txn_free(x);
            dropped++;
        } else {
            p = &x->next;
        }
    }
    return dropped;
}
