/* guest_qga: see guest_qga.h. */
#include "guest_qga.h"

#include <stdio.h>
#include <stdlib.h>

#include "mono.h"
#include "qga.h"

/* quiesce: fs-freeze deadlines (dr-tests/checkers/quiesce.py) */
#define QGA_SYNC_MS 1000
#define QGA_THAW_MS 5000

/* The channel is the guest agent client itself. */
#define QGA(g) ((struct qga_conn *)(void *)(g))

int
guest_qga_configured(const struct vm *v)
{
    return v->cfg->qga[0] != '\0';
}

int
guest_qga_open(const struct vm *v, struct vm_guest **out, char *err,
               size_t errlen)
{
    struct qga_conn *q = NULL;

    if (!v->cfg->qga[0]) {
        snprintf(err, errlen, "no qga socket configured for vm %s",
                 v->cfg->name);
        return -1;
    }
    if (qga_open(v->cfg->qga, &q, err, errlen) < 0)
        return -1;
    *out = (struct vm_guest *)(void *)q;
    return 0;
}

static int
guest_sync(struct vm_guest *g, char *err, size_t errlen)
{
    return qga_sync(QGA(g), (long)(random() & 0x7fffffff), QGA_SYNC_MS, err,
                    errlen);
}

int
guest_qga_freeze(struct vm_guest *g, int timeout_ms, int *nfs, char *err,
                 size_t errlen)
{
    if (guest_sync(g, err, errlen) < 0)
        return VM_GUEST_UNSENT;
    return qga_freeze(QGA(g), timeout_ms, nfs, err, errlen);
}

int
guest_qga_thaw(struct vm_guest *g, int *nfs, char *err, size_t errlen)
{
    if (guest_sync(g, err, errlen) < 0)
        return -1;
    return qga_thaw(QGA(g), QGA_THAW_MS, nfs, err, errlen);
}

void
guest_qga_close(struct vm_guest *g)
{
    qga_free(QGA(g));
}

int
guest_qga_command(struct vm *v, const char *cmd, json_t *args,
                  int timeout_ms, json_t **ret, struct qmp_err *err)
{
    double deadline = mono_ms() + timeout_ms;
    struct qga_conn *q = NULL;
    int left, rc = -1;

    *ret = NULL;
    err->kind = QMP_E_ERROR;
    err->cls[0] = '\0';
    if (!v->cfg->qga[0]) {
        snprintf(err->msg, sizeof(err->msg), "%s: no guest agent socket "
                 "configured (qga =)", cmd);
        goto cleanup;
    }
    if (qga_open(v->cfg->qga, &q, err->msg, sizeof(err->msg)) < 0)
        goto cleanup;
    left = (int)(deadline - mono_ms());
    if (qga_sync(q, (long)(random() & 0x7fffffff),
                 left < QGA_SYNC_MS ? (left > 1 ? left : 1) : QGA_SYNC_MS,
                 err->msg, sizeof(err->msg)) < 0) {
        if (qga_last_error(q) == QGA_E_TIMEOUT)
            err->kind = QMP_E_TIMEOUT;
        goto cleanup;
    }
    left = (int)(deadline - mono_ms());
    if (qga_call(q, cmd, args, left > 1 ? left : 1, ret, err->msg,
                 sizeof(err->msg)) < 0) {
        args = NULL;        /* stolen by qga_call */
        if (qga_last_error(q) == QGA_E_TIMEOUT)
            err->kind = QMP_E_TIMEOUT;
        goto cleanup;
    }
    args = NULL;
    rc = 0;
cleanup:
    json_decref(args);
    qga_free(q);
    return rc;
}
