/*
 * snap_qmp: the "qmp-transaction" member-snapshot backend (snap.h):
 * QEMU internal snapshots, driven through the VM's monitor.
 *
 *   create  one QMP `transaction` of blockdev-snapshot-internal-sync
 *           actions, so it is atomic across the VM's disks; works for
 *           qcow2 and rbd nodes
 *   remove  blockdev-snapshot-delete-internal-sync
 *   list    the node's image snapshots from query-block
 */
#include "snap.h"

#include <stdio.h>
#include <string.h>

#include "mono.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

static int
qmp_create(struct snap_member *m, int n, double deadline, int *timed_out,
           struct snap_err *err)
{
    const struct snap_mon *mon = m[0].disk.mon;
    json_t *actions = json_array();
    double t0 = mono_ms(), left = deadline - t0;
    int rc;

    for (int k = 0; k < n; k++)
        json_array_append_new(actions, json_pack(
            "{s:s,s:{s:s,s:s}}", "type", "blockdev-snapshot-internal-sync",
            "data", "device", m[k].disk.node, "name", m[k].name));
    rc = mon->call(mon->opaque, "transaction",
                   json_pack("{s:o}", "actions", actions),
                   left < 1 ? 1 : (int)left, NULL, err);
    for (int k = 0; k < n; k++) {
        m[k].ok = rc == 0;
        m[k].ms = mono_ms() - t0;
        if (rc < 0)
            snprintf(m[k].err, sizeof(m[k].err), "%s", err->msg);
    }
    *timed_out = rc < 0 && err->kind == SNAP_E_TIMEOUT;
    for (int k = 0; k < n; k++)
        m[k].pending = *timed_out;  /* QEMU may still run the transaction */
    /* A refused transaction is a per-disk result, not a failure to start. */
    return 0;
}

static int
qmp_remove(const struct snap_disk *d, const char *name, int timeout_ms,
           struct snap_err *err)
{
    int rc = d->mon->call(d->mon->opaque,
                          "blockdev-snapshot-delete-internal-sync",
                          json_pack("{s:s,s:s}", "device", d->node, "name",
                                    name), timeout_ms, NULL, err);

    if (rc == 0)
        return 0;
    if (err->kind == SNAP_E_REFUSED && strstr(err->msg, "does not exist"))
        return SNAP_ENOENT;
    return -1;
}

static int
qmp_list(const struct snap_disk *d, int timeout_ms, json_t **out,
         struct snap_err *err)
{
    json_t *blocks = NULL, *b, *list;
    size_t i;

    if (d->mon->call(d->mon->opaque, "query-block", NULL, timeout_ms,
                     &blocks, err) < 0)
        return -1;
    list = json_array();
    json_array_foreach(blocks, i, b) {
        json_t *ins = json_object_get(b, "inserted"), *s;
        size_t k;
        const char *node = json_string_value(json_object_get(ins,
                                                             "node-name"));
        if (!node || strcmp(node, d->node))
            continue;
        json_array_foreach(json_object_get(json_object_get(ins, "image"),
                                           "snapshots"), k, s)
            json_array_append_new(list, json_pack(
                "{s:O,s:O}", "name", json_object_get(s, "name"), "id",
                json_object_get(s, "id")));
    }
    json_decref(blocks);
    *out = list;
    return 0;
}

const struct snap_ops snap_qmp_ops = {
    .name = "qmp-transaction",
    .create = qmp_create,
    .confirm = NULL,
    .remove = qmp_remove,
    .list = qmp_list,
};
