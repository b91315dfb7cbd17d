/* redirect: see redirect.h (making the overlays, and the switch; the
 * merge back is redirect_merge.c). */
#include "redirect.h"

#include <stdio.h>
#include <string.h>

#include "log.h"
#include "mono.h"
#include "redirect_node.h"
#include "txn.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

/* Making an overlay (blockdev-create) is a QEMU job; it is polled until
 * done, by this deadline. */
#define RD_CREATE_MS 30000.0

const char *
redirect_path_name(int s)
{
    return s == RD_NONE ? "in_pause" : "redirect";
}

int
redirect_usable(const struct agent *a, const struct vm *v, char *why,
                size_t len)
{
    if (a->cfg.pause_in_pause) {
        snprintf(why, len, "pause_path = in_pause");
        return 0;
    }
    if (strcmp(v->ops->name, "qmp") != 0) {
        snprintf(why, len, "driver %s", v->ops->name);
        return 0;
    }
    if (v->snap != &snap_rbd_ops) {
        snprintf(why, len, "method %s", v->snap->name);
        return 0;
    }
    if (v->cfg->ndisks == 0) {
        snprintf(why, len, "no disks");
        return 0;
    }
    for (int d = 0; d < v->cfg->ndisks; d++)
        if (v->cfg->disks[d].backend != CFG_BACKEND_RBD || !v->img[d]) {
            snprintf(why, len, "disk %s is not an open RBD image",
                     v->cfg->disks[d].node);
            return 0;
        }
    return 1;
}

/* <image>.cutpoint-ov.<txn>, the txn's bytes outside [A-Za-z0-9._-] as
 * '_' (an RBD name holds no '/' or '@'). */
void
redirect_overlay_image(char *buf, size_t len, const struct vm *v, int d,
                       const char *txn)
{
    size_t n;

    snprintf(buf, len, "%s.cutpoint-ov.%s", v->cfg->disks[d].image, txn);
    n = strlen(v->cfg->disks[d].image) + strlen(".cutpoint-ov.");
    for (char *p = buf + (n < len ? n : 0); *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
              (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' ||
              *p == '-'))
            *p = '_';
}

/* The options an overlay's rbd node needs to reach Ceph as the disk's own
 * node does (conf, user), read from the disk node's json: filename. */
static json_t *
rbd_location(json_t *base, char *err, size_t errlen)
{
    const char *file = json_string_value(json_object_get(base, "file"));
    json_t *o, *loc;

    if (!file || strncmp(file, "json:", 5) != 0) {
        snprintf(err, errlen, "its rbd node's options are not readable "
                 "(filename %s)", file ? file : "none");
        return NULL;
    }
    if (!(o = json_loads(file + 5, 0, NULL))) {
        snprintf(err, errlen, "its rbd node's filename is not JSON");
        return NULL;
    }
    loc = json_object();
    if (json_is_string(json_object_get(o, "conf")))
        json_object_set(loc, "conf", json_object_get(o, "conf"));
    if (json_is_string(json_object_get(o, "user")))
        json_object_set(loc, "user", json_object_get(o, "user"));
    json_decref(o);
    return loc;
}

/* Overlay nodes left in QEMU by an agent whose journal was lost (their id,
 * hence their image, unknown): removed when unused; a switched one (its
 * device's root) stops the cut, as its base misses the writes since. */
static int
drop_stale(struct vm *v, json_t *nodes, int to, char *err, size_t errlen)
{
    json_t *blocks = NULL;
    struct qmp_err qe;
    int rc = 0;

    for (int d = 0; d < v->cfg->ndisks && rc == 0; d++) {
        char onode[32], fnode[32];
        const char *kind[2] = {onode, fnode};

        rd_node_name(onode, sizeof(onode), "cpov", d);
        rd_node_name(fnode, sizeof(fnode), "cpovf", d);
        if (!rd_find_node(nodes, onode) && !rd_find_node(nodes, fnode))
            continue;
        if (!blocks && vm_qmp(v, "query-block", NULL, to, &blocks, &qe) < 0)
            return rd_qmp_err(err, errlen, &qe);
        if (rd_is_root(blocks, onode)) {
            snprintf(err, errlen, "disk %s is still on overlay %s of an "
                     "earlier cut", v->cfg->disks[d].node, onode);
            rc = -1;
            break;
        }
        log_warnx("event=redirect_stale_nodes vm=%s disk=%s msg=\"overlay "
                  "nodes of an unknown cut removed\"", v->cfg->name,
                  v->cfg->disks[d].node);
        for (int i = 0; i < 2; i++)
            if (rd_find_node(nodes, kind[i]) &&
                vm_qmp(v, "blockdev-del", json_pack("{s:s}", "node-name",
                                                    kind[i]), to, NULL,
                       &qe) < 0) {
                rc = rd_qmp_err(err, errlen, &qe);
                break;
            }
    }
    json_decref(blocks);
    return rc;
}

/* The next step of making v's overlays (redirect.h): ends the one in
 * *window, if any, and begins the next once the agent does not hold v
 * stopped; -1 with err when v stayed paused until deadline. */
static int
next_step(struct agent *a, struct vm *v, double deadline, int *window,
          char *err, size_t errlen)
{
    if (*window)
        redirect_step_end(a, v);
    *window = 0;
    if (redirect_step_begin(a, v, deadline) < 0) {
        snprintf(err, errlen, "its VM stayed paused by a txn");
        return -1;
    }
    *window = 1;
    return 0;
}

int
redirect_make(struct agent *a, struct vm *v, const char *txn, int *hung,
              char *err, size_t errlen)
{
    int to = a->cfg.qmp_timeout_ms, n = v->cfg->ndisks;
    double t0 = mono_ms(), deadline = t0 + RD_CREATE_MS;
    json_t *nodes;
    char why[512];
    struct qmp_err qe;
    /* window: in a step (redirect_step_begin); jobs: a create job may run.
     * Each step in QEMU or Ceph runs while the VM runs: a stop waits for
     * the step in flight, and the next step for the VM's cont. */
    int window = 0, jobs = 0;

    rd_qmp_hung = 0;
    if (!(nodes = rd_block_nodes(v, to, err, errlen)) ||
        drop_stale(v, nodes, to, err, errlen) < 0)
        goto fail;
    for (int d = 0; d < n; d++) {
        const struct cfg_disk *cd = &v->cfg->disks[d];
        json_t *base = rd_find_node(nodes, cd->node), *loc;
        json_int_t size;
        char img[512], fnode[32];

        if (!base) {
            snprintf(err, errlen, "disk %s: no such block node", cd->node);
            goto fail;
        }
        size = json_integer_value(json_object_get(
            json_object_get(base, "image"), "virtual-size"));
        if (size <= 0 || !(loc = rbd_location(base, err, errlen)))
            goto fail;
        redirect_overlay_image(img, sizeof(img), v, d, txn);
        rd_node_name(fnode, sizeof(fnode), "cpovf", d);
        if (next_step(a, v, deadline, &window, err, errlen) < 0) {
            json_decref(loc);
            goto fail;
        }
        /* Room for the qcow2 metadata: an RBD image is thin anyway. */
        if (rbdsnap_sibling_create(v->img[d], img, (uint64_t)size +
                                   (uint64_t)size / 8 + (64u << 20), err,
                                   errlen) != 0) {
            json_decref(loc);
            goto fail;
        }
        json_object_update_new(loc, json_pack("{s:s,s:s,s:s,s:s}", "driver",
                                              "rbd", "node-name", fnode,
                                              "pool", cd->pool, "image",
                                              img));
        if (vm_qmp(v, "blockdev-add", loc, to, NULL, &qe) < 0) {
            rd_qmp_err(err, errlen, &qe);
            goto fail;
        }
    }
    /* The jobs are one step, from the first blockdev-create until every
     * one is concluded: a stop during one aborts QEMU 7.2. */
    if (next_step(a, v, deadline, &window, err, errlen) < 0)
        goto fail;
    for (int d = 0; d < n; d++) {
        const struct cfg_disk *cd = &v->cfg->disks[d];
        json_int_t size = json_integer_value(json_object_get(json_object_get(
            rd_find_node(nodes, cd->node), "image"), "virtual-size"));
        char fnode[32], job[32];

        rd_node_name(fnode, sizeof(fnode), "cpovf", d);
        rd_node_name(job, sizeof(job), "cpmk", d);
        if (vm_qmp(v, "blockdev-create", json_pack(
                       "{s:s,s:{s:s,s:s,s:I}}", "job-id", job, "options",
                       "driver", "qcow2", "file", fnode, "size", size),
                   to, NULL, &qe) < 0) {
            /* refused: no job; timed out: rd_qmp_hung says so */
            rd_qmp_err(err, errlen, &qe);
            goto fail;
        }
        jobs = 1;
    }
    for (int d = 0; d < n; d++) {
        char job[32];
        int ended;

        rd_node_name(job, sizeof(job), "cpmk", d);
        if (rd_job_finish(v, job, 0, deadline, to, &ended, err, errlen) < 0) {
            /* one failed: wait for the others too, then fail as usual */
            for (int k = d + 1; ended && k < n; k++) {
                char ejob[32], eerr[256];

                rd_node_name(ejob, sizeof(ejob), "cpmk", k);
                if (rd_job_finish(v, ejob, 0, deadline, to, &ended, eerr,
                               sizeof(eerr)) < 0 && !ended)
                    break;
            }
            if (ended)
                jobs = 0;
            goto fail;
        }
    }
    jobs = 0;
    if (next_step(a, v, deadline, &window, err, errlen) < 0)
        goto fail;
    for (int d = 0; d < n; d++) {
        char fnode[32], onode[32];

        rd_node_name(fnode, sizeof(fnode), "cpovf", d);
        rd_node_name(onode, sizeof(onode), "cpov", d);
        if (vm_qmp(v, "blockdev-add", json_pack(
                       "{s:s,s:s,s:s,s:n}", "driver", "qcow2", "node-name",
                       onode, "file", fnode, "backing"), to, NULL, &qe) < 0) {
            rd_qmp_err(err, errlen, &qe);
            goto fail;
        }
    }
    redirect_step_end(a, v);
    window = 0;
    json_decref(nodes);
    log_info("event=redirect_prepared txn=%s vm=%s disks=%d ms=%.3f", txn,
             v->cfg->name, n, mono_ms() - t0);
    return 0;
fail:
    json_decref(nodes);
    /* A step that may still run in QEMU (a job not done in time, or QEMU
     * did not answer) keeps v's stops out until a merge removes its nodes:
     * the cleanup runs in the background, and the prepare stops no VM, as
     * for a QEMU that does not answer. */
    if (window && (jobs || rd_qmp_hung))
        rd_qmp_hung = 1;
    else if (window)
        redirect_step_end(a, v);
    *hung = rd_qmp_hung;
    if (*hung)      /* a cleanup now would wait as long: in the background */
        redirect_kick(a, v, txn, "prepare_failed");
    else if (redirect_merge(a, v, txn, "prepare_failed", why,
                            sizeof(why)) < 0)
        log_warnx("event=redirect_cleanup_failed txn=%s vm=%s msg=\"%s\"",
                  txn, v->cfg->name, why);
    return -1;
}

json_t *
redirect_switch_args(const struct vm *v)
{
    json_t *acts = json_array();

    for (int d = 0; d < v->cfg->ndisks; d++) {
        char onode[32];

        rd_node_name(onode, sizeof(onode), "cpov", d);
        json_array_append_new(acts, json_pack(
            "{s:s,s:{s:s,s:s}}", "type", "blockdev-snapshot", "data",
            "node", v->cfg->disks[d].node, "overlay", onode));
    }
    return json_pack("{s:o}", "actions", acts);
}
