/* redirect_merge: see redirect.h (the merge of a cut's overlays back
 * into their bases, and their removal). */
#include "redirect.h"

#include <stdio.h>
#include <string.h>

#include "log.h"
#include "mono.h"
#include "redirect_node.h"
#include "txn.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

/* A merge (block-commit of what the guest wrote since the cut) is a QEMU
 * job; it is polled until done, by this deadline. */
#define RD_MERGE_MS 120000.0

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

    rd_node_name(onode, sizeof(onode), "cpov", d);
    rd_node_name(fnode, sizeof(fnode), "cpovf", d);
    if (rd_find_node(nodes, onode) &&
        vm_qmp(v, "blockdev-del", json_pack("{s:s}", "node-name", onode),
               to, NULL, &qe) < 0)
        return rd_qmp_err(err, errlen, &qe);
    if (rd_find_node(nodes, fnode) &&
        vm_qmp(v, "blockdev-del", json_pack("{s:s}", "node-name", fnode),
               to, NULL, &qe) < 0)
        return rd_qmp_err(err, errlen, &qe);
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
        rd_nap();
        rd_nap();
        rd_nap();
        rd_nap();
        rd_nap();
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

    rd_node_name(onode, sizeof(onode), "cpov", d);
    rd_node_name(job, sizeof(job), "cpcm", d);
    if (vm_qmp(v, "block-commit", json_pack(
                   "{s:s,s:s,s:b}", "job-id", job, "device", onode,
                   "auto-dismiss", 0), to, NULL, &qe) < 0 &&
        !strstr(qe.msg, "in use") && !strstr(qe.msg, "already") &&
        !strstr(qe.msg, "busy")) {
        *started = 0;
        return rd_qmp_err(err, errlen, &qe);
    }
    *started = 1;
    return 0;
}

/* 1 when disk d's overlay nodes are in nodes: this QEMU holds them. */
static int
attached(json_t *nodes, int d)
{
    char onode[32], fnode[32];

    rd_node_name(onode, sizeof(onode), "cpov", d);
    rd_node_name(fnode, sizeof(fnode), "cpovf", d);
    return rd_find_node(nodes, onode) || rd_find_node(nodes, fnode);
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
            rc = rd_qmp_err(err, errlen, &qe);
            goto out;
        }
        if ((rc = redirect_offline(a, v, txn, err, errlen)) < 0)
            goto out;
        goto done;
    }
    if (!(nodes = rd_block_nodes(v, to, err, errlen))) {
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

        rd_node_name(onode, sizeof(onode), "cpov", d);
        if (rd_is_root(blocks, onode) &&
            merge_start(v, d, to, &started[d], err, errlen) < 0)
            rc = -1;
    }
    for (int d = 0; d < n; d++) {
        char job[32];

        rd_node_name(job, sizeof(job), "cpcm", d);
        if (started[d] && rd_job_finish(v, job, 1, deadline, to, NULL, err,
                                     errlen) < 0)
            rc = -1;
        merged += started[d];
    }
    if (rc < 0)     /* a disk may still write to its overlay: keep it */
        goto out;
    if (!(nodes = rd_block_nodes(v, to, err, errlen))) {
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
