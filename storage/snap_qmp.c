/*
 * snap_qmp: the "qmp-transaction" member-snapshot backend (snap.h):
 * QEMU internal snapshots, driven through the VM's monitor.
 *
 *   create  one QMP `transaction` of blockdev-snapshot-internal-sync
 *           actions, so it is atomic across the VM's disks; works for
 *           qcow2 and rbd nodes
 *   remove  blockdev-snapshot-delete-internal-sync
 *   list    the node's image snapshots from query-block
 *   bound   how long a create can hold the VM paused: QEMU runs it in its
 *           main loop, which also serves `cont`.  On an rbd node that
 *           is as long as QEMU's own Ceph client waits for an answer:
 *           its rados_osd_op_timeout and rados_mon_op_timeout, read from
 *           the ceph.conf QEMU opened the node with (0: for ever)
 */
#include "snap.h"

#include <stdio.h>
#include <string.h>

#include "mono.h"
#include "rbdsnap.h"

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
    *timed_out = rc < 0 && err->kind == SNAP_E_TIMEOUT;
    for (int k = 0; k < n; k++) {
        m[k].ok = rc == 0;
        m[k].ms = mono_ms() - t0;
        if (rc < 0)
            /* Timed out: QEMU has not even read `cont` yet, say why. */
            snprintf(m[k].err, sizeof(m[k].err), "%s%s", err->msg,
                     *timed_out ? ": QEMU's main loop is still running the "
                     "snapshot, waiting on its storage (rbd: up to QEMU's "
                     "rados op timeouts); the VM resumes when QEMU answers"
                     : "");
    }
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

/* The Ceph client QEMU opened an rbd node with, from its file name. */
struct rbd_client {
    char conf[1024];        /* "" when QEMU searched the default places */
    char user[128];         /* "" for admin */
    char kv[8][2][128];     /* legacy "rbd:pool/image:key=value" options */
    int nkv;
};

/* A "json:{...}" name: the first object of the file chain with driver rbd
 * (a format node over an rbd protocol node nests it under "file"). */
static int
rbd_from_json(const char *fn, struct rbd_client *c)
{
    json_t *j = json_loads(fn, 0, NULL), *f;
    int found = 0;

    for (f = j; f && !found; f = json_object_get(f, "file")) {
        const char *drv = json_string_value(json_object_get(f, "driver"));

        if (!drv || strcmp(drv, "rbd"))
            continue;
        const char *conf = json_string_value(json_object_get(f, "conf"));
        const char *user = json_string_value(json_object_get(f, "user"));

        found = 1;
        snprintf(c->conf, sizeof(c->conf), "%s", conf ? conf : "");
        snprintf(c->user, sizeof(c->user), "%s", user ? user : "");
    }
    json_decref(j);
    return found;
}

/* A legacy "rbd:pool/image[@snap][:key=value]..." name; "\:" escapes. */
static void
rbd_from_legacy(const char *fn, struct rbd_client *c)
{
    char buf[2048], *opts[16];
    int n = 0;
    size_t w = 0;

    opts[n++] = buf;
    for (const char *p = fn; *p && w + 1 < sizeof(buf); p++) {
        if (*p == '\\' && p[1]) {
            buf[w++] = *++p;
        } else if (*p == ':' && n < 16) {
            buf[w++] = '\0';
            opts[n++] = buf + w;
        } else {
            buf[w++] = *p;
        }
    }
    buf[w] = '\0';
    /* opts[0] "rbd", opts[1] pool/image[@snap], then key=value */
    for (int i = 2; i < n; i++) {
        char *eq = strchr(opts[i], '=');

        if (!eq)
            continue;
        *eq = '\0';
        if (strcmp(opts[i], "conf") == 0)
            snprintf(c->conf, sizeof(c->conf), "%s", eq + 1);
        else if (strcmp(opts[i], "id") == 0)
            snprintf(c->user, sizeof(c->user), "%s", eq + 1);
        else if (c->nkv < 8) {
            snprintf(c->kv[c->nkv][0], sizeof(c->kv[0][0]), "%s", opts[i]);
            snprintf(c->kv[c->nkv][1], sizeof(c->kv[0][1]), "%s", eq + 1);
            c->nkv++;
        }
    }
}

static int
qmp_pause_bound(const struct snap_disk *d, int timeout_ms,
                struct snap_bound *b, struct snap_err *err)
{
    json_t *nodes = NULL, *n, *node = NULL;
    struct rbd_client c = {0};
    const char *kv[16], *fn, *drv;
    char cerr[256];
    int osd_s, mon_s, rc = -1;
    size_t i;

    memset(b, 0, sizeof(*b));
    if (d->mon->call(d->mon->opaque, "query-named-block-nodes",
                     json_pack("{s:b}", "flat", 1), timeout_ms, &nodes,
                     err) < 0)
        return -1;
    json_array_foreach(nodes, i, n) {
        const char *name = json_string_value(json_object_get(n, "node-name"));

        if (name && strcmp(name, d->node) == 0)
            node = n;
    }
    if (!node) {
        err->kind = SNAP_E_REFUSED;
        snprintf(err->msg, sizeof(err->msg), "query-named-block-nodes: QEMU "
                 "has no block node %s", d->node);
        goto cleanup;
    }
    fn = json_string_value(json_object_get(node, "file"));
    drv = json_string_value(json_object_get(node, "drv"));
    if (!fn)
        fn = "";
    if (strncmp(fn, "json:", 5) == 0)
        b->storage = rbd_from_json(fn + 5, &c);
    else if (strncmp(fn, "rbd:", 4) == 0)
        rbd_from_legacy(fn, &c), b->storage = 1;
    else
        b->storage = drv && strcmp(drv, "rbd") == 0;
    if (!b->storage) {
        snprintf(b->why, sizeof(b->why), "node %s: no Ceph (%s)", d->node,
                 drv ? drv : "?");
        rc = 0;
        goto cleanup;
    }
    for (int k = 0; k < c.nkv; k++) {
        kv[2 * k] = c.kv[k][0];
        kv[2 * k + 1] = c.kv[k][1];
    }
    if (rbdsnap_client_timeouts(c.conf[0] ? c.conf : NULL,
                                c.user[0] ? c.user : NULL, kv, c.nkv, &osd_s,
                                &mon_s, cerr, sizeof(cerr)) < 0) {
        err->kind = SNAP_E_STORAGE;
        snprintf(err->msg, sizeof(err->msg), "node %s: QEMU's Ceph config: "
                 "%s", d->node, cerr);
        goto cleanup;
    }
    /* One request to a hung OSD or mon fails the create after its
     * timeout; a create that met both waits for both. */
    b->bound_ms = osd_s > 0 && mon_s > 0 ? (osd_s + mon_s) * 1000 : -1;
    snprintf(b->why, sizeof(b->why), "node %s: QEMU's Ceph client "
             "client.%s (conf %s) has rados_osd_op_timeout=%d "
             "rados_mon_op_timeout=%d", d->node, c.user[0] ? c.user : "admin",
             c.conf[0] ? c.conf : "default", osd_s, mon_s);
    rc = 0;
cleanup:
    json_decref(nodes);
    return rc;
}

const struct snap_ops snap_qmp_ops = {
    .name = "qmp-transaction",
    .tags_owner = 0,
    .create = qmp_create,
    .confirm = NULL,
    .remove = qmp_remove,
    .list = qmp_list,
    .pause_bound = qmp_pause_bound,
};
