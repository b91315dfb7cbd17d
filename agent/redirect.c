/* redirect: see redirect.h. */
#include "redirect.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "mono.h"
#include "txn.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

/* Making an overlay (blockdev-create) and a merge (block-commit of what
 * the guest wrote since the cut) are QEMU jobs; they are polled until
 * done, by these deadlines. */
#define RD_CREATE_MS 30000.0
#define RD_MERGE_MS 120000.0
#define RD_POLL_NS (2 * 1000000L)

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

static void
node_name(char *buf, size_t len, const char *kind, int d)
{
    snprintf(buf, len, "%s%d", kind, d);
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

static void
nap(void)
{
    struct timespec ts = {0, RD_POLL_NS};

    nanosleep(&ts, NULL);
}

/* Set by a QMP call of the current thread that timed out: its QEMU does
 * not answer (redirect_prepare's *hung). */
static __thread int qmp_hung;

static int
qmp_err_to(char *err, size_t errlen, const struct qmp_err *qe)
{
    snprintf(err, errlen, "%s", qe->msg);
    if (qe->kind == QMP_E_TIMEOUT)
        qmp_hung = 1;
    return -1;
}

/* The VM's block nodes (query-named-block-nodes, flat), a new array. */
static json_t *
block_nodes(struct vm *v, int timeout_ms, char *err, size_t errlen)
{
    struct qmp_err qe;
    json_t *ret = NULL;

    if (vm_qmp(v, "query-named-block-nodes", json_pack("{s:b}", "flat", 1),
               timeout_ms, &ret, &qe) < 0) {
        qmp_err_to(err, errlen, &qe);
        return NULL;
    }
    return ret;
}

static json_t *
find_node(json_t *nodes, const char *name)
{
    size_t i;
    json_t *n;

    json_array_foreach(nodes, i, n) {
        const char *nn = json_string_value(json_object_get(n, "node-name"));
        if (nn && strcmp(nn, name) == 0)
            return n;
    }
    return NULL;
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

/* Waits until job id concludes, then dismisses it; when ready is set, a
 * job that reports "ready" is completed (an active commit).  *ended (when
 * not NULL) is 1 when the job no longer runs, whatever the result. */
static int
job_finish(struct vm *v, const char *id, int ready, double deadline,
           int timeout_ms, int *ended, char *err, size_t errlen)
{
    struct qmp_err qe;
    char status[32];
    int dummy;

    if (!ended)
        ended = &dummy;
    *ended = 0;
    for (;;) {
        json_t *jobs = NULL, *j = NULL;
        const char *st = NULL;
        size_t i;

        if (vm_qmp(v, "query-jobs", NULL, timeout_ms, &jobs, &qe) < 0)
            return qmp_err_to(err, errlen, &qe);
        json_array_foreach(jobs, i, j)
            if (strcmp(json_string_value(json_object_get(j, "id")) ?: "",
                       id) == 0)
                break;
        if (i == json_array_size(jobs)) {
            json_decref(jobs);
            *ended = 1;
            snprintf(err, errlen, "job %s is gone", id);
            return -1;
        }
        snprintf(status, sizeof(status), "%s",
                 json_string_value(json_object_get(j, "status")) ?: "");
        st = status;
        if (strcmp(st, "concluded") == 0) {
            const char *e = json_string_value(json_object_get(j, "error"));

            *ended = 1;
            if (e)
                snprintf(err, errlen, "job %s: %s", id, e);
            json_decref(jobs);
            vm_qmp(v, "job-dismiss", json_pack("{s:s}", "id", id),
                   timeout_ms, NULL, &qe);
            return e ? -1 : 0;
        }
        /* ready: completed once (it may still say ready for a while) */
        if (ready == 1 && strcmp(st, "ready") == 0) {
            if (vm_qmp(v, "job-complete", json_pack("{s:s}", "id", id),
                       timeout_ms, NULL, &qe) < 0) {
                json_decref(jobs);
                return qmp_err_to(err, errlen, &qe);
            }
            ready = 2;
        }
        json_decref(jobs);
        if (mono_ms() > deadline) {
            snprintf(err, errlen, "job %s not done in time (status %s)", id,
                     st);
            return -1;
        }
        nap();
    }
}

/* 1 when node is the root of one of the VM's block devices (query-block):
 * a switched overlay.  (Its backing_file_depth says 0: the overlay's image
 * names no backing file, the graph does.) */
static int
is_root(json_t *blocks, const char *node)
{
    size_t i;
    json_t *b;

    json_array_foreach(blocks, i, b) {
        const char *nn = json_string_value(json_object_get(
            json_object_get(b, "inserted"), "node-name"));
        if (nn && strcmp(nn, node) == 0)
            return 1;
    }
    return 0;
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

        node_name(onode, sizeof(onode), "cpov", d);
        node_name(fnode, sizeof(fnode), "cpovf", d);
        if (!find_node(nodes, onode) && !find_node(nodes, fnode))
            continue;
        if (!blocks && vm_qmp(v, "query-block", NULL, to, &blocks, &qe) < 0)
            return qmp_err_to(err, errlen, &qe);
        if (is_root(blocks, onode)) {
            snprintf(err, errlen, "disk %s is still on overlay %s of an "
                     "earlier cut", v->cfg->disks[d].node, onode);
            rc = -1;
            break;
        }
        log_warnx("event=redirect_stale_nodes vm=%s disk=%s msg=\"overlay "
                  "nodes of an unknown cut removed\"", v->cfg->name,
                  v->cfg->disks[d].node);
        for (int i = 0; i < 2; i++)
            if (find_node(nodes, kind[i]) &&
                vm_qmp(v, "blockdev-del", json_pack("{s:s}", "node-name",
                                                    kind[i]), to, NULL,
                       &qe) < 0) {
                rc = qmp_err_to(err, errlen, &qe);
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

    qmp_hung = 0;
    if (!(nodes = block_nodes(v, to, err, errlen)) ||
        drop_stale(v, nodes, to, err, errlen) < 0)
        goto fail;
    for (int d = 0; d < n; d++) {
        const struct cfg_disk *cd = &v->cfg->disks[d];
        json_t *base = find_node(nodes, cd->node), *loc;
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
        node_name(fnode, sizeof(fnode), "cpovf", d);
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
            qmp_err_to(err, errlen, &qe);
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
            find_node(nodes, cd->node), "image"), "virtual-size"));
        char fnode[32], job[32];

        node_name(fnode, sizeof(fnode), "cpovf", d);
        node_name(job, sizeof(job), "cpmk", d);
        if (vm_qmp(v, "blockdev-create", json_pack(
                       "{s:s,s:{s:s,s:s,s:I}}", "job-id", job, "options",
                       "driver", "qcow2", "file", fnode, "size", size),
                   to, NULL, &qe) < 0) {
            /* refused: no job; timed out: qmp_hung says so */
            qmp_err_to(err, errlen, &qe);
            goto fail;
        }
        jobs = 1;
    }
    for (int d = 0; d < n; d++) {
        char job[32];
        int ended;

        node_name(job, sizeof(job), "cpmk", d);
        if (job_finish(v, job, 0, deadline, to, &ended, err, errlen) < 0) {
            /* one failed: wait for the others too, then fail as usual */
            for (int k = d + 1; ended && k < n; k++) {
                char ejob[32], eerr[256];

                node_name(ejob, sizeof(ejob), "cpmk", k);
                if (job_finish(v, ejob, 0, deadline, to, &ended, eerr,
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

        node_name(fnode, sizeof(fnode), "cpovf", d);
        node_name(onode, sizeof(onode), "cpov", d);
        if (vm_qmp(v, "blockdev-add", json_pack(
                       "{s:s,s:s,s:s,s:n}", "driver", "qcow2", "node-name",
                       onode, "file", fnode, "backing"), to, NULL, &qe) < 0) {
            qmp_err_to(err, errlen, &qe);
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
    if (window && (jobs || qmp_hung))
        qmp_hung = 1;
    else if (window)
        redirect_step_end(a, v);
    *hung = qmp_hung;
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

        node_name(onode, sizeof(onode), "cpov", d);
        json_array_append_new(acts, json_pack(
            "{s:s,s:{s:s,s:s}}", "type", "blockdev-snapshot", "data",
            "node", v->cfg->disks[d].node, "overlay", onode));
    }
    return json_pack("{s:o}", "actions", acts);
}



/* Removes disk d's overlay nodes (those in nodes) and then, only when both
 * are gone, its RBD image: librbd removed an image that QEMU still had
 * open in the lab, and the guest then got I/O errors. */
static int
drop_overlay(struct vm *v, int d, const char *txn, json_t *nodes, int to,
             char *err, size_t errlen)
{
    char onode[32], fnode[32], img[512];
    struct qmp_err qe;
    int r = 0;

    node_name(onode, sizeof(onode), "cpov", d);
    node_name(fnode, sizeof(fnode), "cpovf", d);
    if (find_node(nodes, onode) &&
        vm_qmp(v, "blockdev-del", json_pack("{s:s}", "node-name", onode),
               to, NULL, &qe) < 0)
        return qmp_err_to(err, errlen, &qe);
    if (find_node(nodes, fnode) &&
        vm_qmp(v, "blockdev-del", json_pack("{s:s}", "node-name", fnode),
               to, NULL, &qe) < 0)
        return qmp_err_to(err, errlen, &qe);
    redirect_overlay_image(img, sizeof(img), v, d, txn);
    if (v->cfg->disks[d].backend != CFG_BACKEND_RBD) {
        /* The VM's config changed since (its disk is no RBD image now):
         * nothing here can reach that image any more. */
        log_warnx("event=redirect_image_left vm=%s disk=%s image=%s "
                  "msg=\"the disk is not an RBD image any more; remove the "
                  "image by hand\"", v->cfg->name, v->cfg->disks[d].node, img);
        return 0;
    }
    if (!v->img[d]) {
        snprintf(err, errlen, "disk %s: its RBD image is not open yet (the "
                 "overlay image %s stays until it is)", v->cfg->disks[d].node,
                 img);
        return -1;
    }
    /* QEMU's close of the image may reach the OSDs a little later */
    for (int tries = 0; tries < 50; tries++) {
        r = rbdsnap_sibling_remove(v->img[d], img, err, errlen);
        if (r != -1 || !strstr(err, "busy"))
            break;
        nap();
        nap();
        nap();
        nap();
        nap();
    }
    return r == -1 ? -1 : 0;
}

/* Starts the active commit of disk d's overlay unless its job runs
 * already (a previous run's); *started = 1 when a job is to be waited. */
static int
merge_start(struct vm *v, int d, int to, int *started, char *err,
            size_t errlen)
{
    char onode[32], job[32];
    struct qmp_err qe;

    node_name(onode, sizeof(onode), "cpov", d);
    node_name(job, sizeof(job), "cpcm", d);
    if (vm_qmp(v, "block-commit", json_pack(
                   "{s:s,s:s,s:b}", "job-id", job, "device", onode,
                   "auto-dismiss", 0), to, NULL, &qe) < 0 &&
        !strstr(qe.msg, "in use") && !strstr(qe.msg, "already") &&
        !strstr(qe.msg, "busy")) {
        *started = 0;
        return qmp_err_to(err, errlen, &qe);
    }
    *started = 1;
    return 0;
}

/* 1 when disk d's overlay nodes are in nodes: this QEMU holds them. */
static int
attached(json_t *nodes, int d)
{
    char onode[32], fnode[32];

    node_name(onode, sizeof(onode), "cpov", d);
    node_name(fnode, sizeof(fnode), "cpovf", d);
    return find_node(nodes, onode) || find_node(nodes, fnode);
}

int
redirect_merge(struct agent *a, struct vm *v, const char *txn,
               const char *why, char *err, size_t errlen)
{
    int to = a->cfg.qmp_timeout_ms, n = v->cfg->ndisks, merged = 0, rc = 0;
    int started[CFG_MAX_DISKS] = {0}, held[CFG_MAX_DISKS] = {0}, gone = 0;
    int other = 0;
    double t0 = mono_ms(), deadline = t0 + RD_MERGE_MS;
    json_t *nodes = NULL, *blocks = NULL;
    struct qmp_err qe;
    char jerr[256];

    if (strcmp(v->ops->name, "qmp") != 0) {
        /* Only the qmp driver redirects (redirect_usable): an entry of a VM
         * that another driver runs now (an earlier run's, from before its
         * driver changed: a VM moved under libvirt, an upgrade) names
         * overlays whose nodes its QEMU never held, and its driver may not
         * reach QMP at all (libvirt without qmp_passthrough).  Retrying the
         * merge would fail forever and keep every prepare BUSY; they are
         * judged as a gone QEMU's are: removed when they hold no guest
         * write, else kept and reported. */
        other = 1;
        if ((rc = redirect_offline(a, v, txn, err, errlen)) < 0)
            goto out;
        goto done;
    }
    if (vm_qmp(v, "query-block", NULL, to, &blocks, &qe) < 0) {
        /* Its QEMU is gone (killed, stopped outside the agent): nothing
         * holds the overlays; those without a guest write go. */
        if (!(gone = qe.kind == QMP_E_IO &&
              strcmp(vm_state(v, to), "shutoff") == 0)) {
            rc = qmp_err_to(err, errlen, &qe);
            goto out;
        }
        if ((rc = redirect_offline(a, v, txn, err, errlen)) < 0)
            goto out;
        goto done;
    }
    if (!(nodes = block_nodes(v, to, err, errlen))) {
        rc = -1;
        goto out;
    }
    /* Overlays this QEMU does not hold (a QEMU started again since, or an
     * image whose nodes were never added) are judged by their content,
     * unless this run of the agent deleted their nodes itself. */
    for (int d = 0; d < n; d++)
        held[d] = attached(nodes, d) || redirect_was_dropped(a, v, txn);
    json_decref(nodes);
    nodes = NULL;
    /* A switched overlay is the root of its disk's device: merge it. */
    for (int d = 0; d < n; d++) {
        char onode[32];

        node_name(onode, sizeof(onode), "cpov", d);
        if (is_root(blocks, onode) &&
            merge_start(v, d, to, &started[d], err, errlen) < 0)
            rc = -1;
    }
    for (int d = 0; d < n; d++) {
        char job[32];

        node_name(job, sizeof(job), "cpcm", d);
        if (started[d] && job_finish(v, job, 1, deadline, to, NULL, err,
                                     errlen) < 0)
            rc = -1;
        merged += started[d];
    }
    if (rc < 0)     /* a disk may still write to its overlay: keep it */
        goto out;
    if (!(nodes = block_nodes(v, to, err, errlen))) {
        rc = -1;
        goto out;
    }
    for (int d = 0; d < n; d++) {
        int r;

        if (held[d]) {
            /* from here this run knows them merged or never switched */
            redirect_note_dropped(a, v, txn);
            r = drop_overlay(v, d, txn, nodes, to, err, errlen);
        } else {
            r = redirect_drop_detached(a, v, d, txn, err, errlen);
        }
        /* one to retry (-1) outweighs one kept: the retry goes on */
        if (r == -1 || (r == RD_KEPT && rc == 0))
            rc = r;
    }
    if (rc < 0)
        goto out;
done:
    if (journal_remove_kind(a->journal, JOURNAL_REDIRECT, v->cfg->name, txn,
                            jerr, sizeof(jerr)) < 0) {
        snprintf(err, errlen, "%s", jerr);
        rc = -1;
    } else {
        redirect_forget(a, v, txn);
    }
out:
    json_decref(nodes);
    json_decref(blocks);
    if (rc == 0)        /* no node of v's overlays left: no job either */
        redirect_step_end(a, v);
    if (rc == 0)
        log_info("event=redirect_merged txn=%s vm=%s why=%s disks=%d "
                 "merged=%d qemu=%s ms=%.3f", txn, v->cfg->name, why, n,
                 merged, other ? "other_driver" : gone ? "gone" : "up",
                 mono_ms() - t0);
    else
        log_warnx("event=redirect_merge_failed txn=%s vm=%s why=%s "
                  "qemu=%s entry=kept%s msg=\"%s\"", txn, v->cfg->name, why,
                  other ? "other_driver" : gone ? "gone" : "up",
                  rc == RD_KEPT ? " overlay=kept" : "", err);
    return rc;
}
