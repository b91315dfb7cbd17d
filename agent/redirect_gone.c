/* redirect_gone: see redirect.h (overlays that no QEMU holds). */
#include "redirect.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "mono.h"
#include "par.h"
#include "qcow2ov.h"
#include "txn.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

/* How long vm.stop waits for overlays being made, or merged, before it
 * removes them: they take tens of ms unless Ceph is slow. */
#define RD_STOP_WAIT_MS 5000.0
/* The inventory's look at a VM whose overlays may be orphaned. */
#define RD_WATCH_TIMEOUT_MS 500

static int
rbd_read_cb(void *ctx, uint64_t off, size_t len, void *buf, char *err,
            size_t errlen)
{
    return rbdsnap_read(ctx, off, len, buf, err, errlen);
}

int
redirect_drop_detached(struct agent *a, struct vm *v, int d, const char *id,
                       char *err, size_t errlen)
{
    const struct cfg_disk *cd = &v->cfg->disks[d];
    struct rbdsnap_image *ov = NULL;
    char img[512], rerr[512];
    int r, written = 0;

    redirect_overlay_image(img, sizeof(img), v, d, id);
    if (cd->backend != CFG_BACKEND_RBD)
        return 0;           /* never redirected (see drop_overlay) */
    if (!a->ceph) {
        snprintf(err, errlen, "disk %s: Ceph is not connected yet (the "
                 "overlay image %s stays until it is)", cd->node, img);
        return -1;
    }
    r = rbdsnap_open_ro(a->ceph, cd->pool, img, &ov, rerr, sizeof(rerr));
    if (r == RBDSNAP_ENOENT)
        return 0;
    if (r < 0) {
        snprintf(err, errlen, "disk %s: %s", cd->node, rerr);
        return -1;
    }
    r = qcow2ov_written(rbd_read_cb, ov, rbdsnap_size(ov), &written, rerr,
                        sizeof(rerr));
    rbdsnap_image_free(ov);
    if (r < 0 || written) {
        /* Guest writes since the cut that no QEMU merged back, or content
         * we cannot read: never deleted.  Nor merged here: after a crash
         * nobody can tell whether QEMU had pivoted the disk back onto its
         * base before it died (then these blocks are older than the
         * base's and a merge would overwrite newer writes), nor whether
         * the VM has run on its base since (operations.md, "An overlay
         * kept"). */
        snprintf(err, errlen, "overlay image %s/%s of disk %s %s; kept: "
                 "no QEMU holds it (see operations.md, \"An overlay "
                 "kept\")", cd->pool, img, cd->node, r < 0 ? rerr :
                 "holds guest writes since the cut");
        log_warnx("event=redirect_overlay_kept vm=%s disk=%s image=%s/%s "
                  "id=%s written=%s msg=\"%s\"", v->cfg->name, cd->node,
                  cd->pool, img, id, r < 0 ? "unknown" : "yes",
                  r < 0 ? rerr : "guest writes since the cut");
        return RD_KEPT;
    }
    r = rbdsnap_image_remove(a->ceph, cd->pool, img, rerr, sizeof(rerr));
    if (r == -1) {
        snprintf(err, errlen, "disk %s: %s", cd->node, rerr);
        return -1;
    }
    log_info("event=redirect_overlay_removed vm=%s disk=%s image=%s/%s "
             "id=%s why=\"no QEMU holds it; it held no guest write\"",
             v->cfg->name, cd->node, cd->pool, img, id);
    return 0;
}

int
redirect_offline(struct agent *a, struct vm *v, const char *id, char *err,
                 size_t errlen)
{
    int rc = 0;

    for (int d = 0; d < v->cfg->ndisks; d++) {
        char derr[512];
        int r = redirect_drop_detached(a, v, d, id, derr, sizeof(derr));

        /* one to retry (-1) outweighs one kept: the retry goes on */
        if (r == -1 || (r == RD_KEPT && rc == 0)) {
            snprintf(err, errlen, "%s", derr);
            rc = r;
        }
    }
    return rc;
}

/* The id of v's `redirect` journal entry into id; 0 when it has none. */
static int
entry_id(struct agent *a, const struct vm *v, char *id, size_t len)
{
    struct journal_entry *e = NULL;
    int n = 0, found = 0;

    if (!a->journal || journal_entries(a->journal, &e, &n) < 0)
        return 0;
    for (int i = 0; i < n; i++)
        if (e[i].kind == JOURNAL_REDIRECT &&
            strcmp(e[i].vm, v->cfg->name) == 0) {
            snprintf(id, len, "%s", e[i].txn);
            found = 1;
        }
    free(e);
    return found;
}

void
redirect_vm_stopping(struct agent *a, struct vm *v, const char *why)
{
    char id[129], err[512];

    /* Overlays being made ahead, or a merge in the background, end first:
     * else they would be left half made, or made for a VM that is gone. */
    if (redirect_bg_wait(a, v, RD_STOP_WAIT_MS) < 0)
        log_warnx("event=redirect_stop_wait vm=%s msg=\"overlays still being "
                  "made or merged after %.0f ms; the inventory removes them "
                  "once QEMU is gone\"", v->cfg->name, RD_STOP_WAIT_MS);
    if (!entry_id(a, v, id, sizeof(id)))
        return;
    /* While QEMU still runs: a merge, when they were switched, or their
     * removal.  Failed, the inventory finds QEMU gone after the stop and
     * removes what holds no guest write (redirect_watch). */
    if (redirect_merge(a, v, id, why, err, sizeof(err)) < 0)
        log_warnx("event=redirect_stop_merge_failed vm=%s id=%s why=%s "
                  "msg=\"%s\"", v->cfg->name, id, why, err);
}

struct stop_job {
    struct agent *a;
    struct vm *v;
};

static void *
stop_one(void *arg)
{
    struct stop_job *j = arg;

    redirect_vm_stopping(j->a, j->v, "agent_stop");
    return NULL;
}

void
redirect_agent_stop(struct agent *a)
{
    struct stop_job *jobs;
    int n = a->nvms;

    if (n == 0 || !(jobs = calloc((size_t)n, sizeof(*jobs))))
        return;
    for (int i = 0; i < n; i++)
        jobs[i] = (struct stop_job){.a = a, .v = &a->vms[i]};
    par_run(stop_one, jobs, sizeof(*jobs), n);
    free(jobs);
}

void
redirect_watch(struct agent *a)
{
    struct journal_entry *e = NULL;
    int n = 0;

    if (!a->journal || journal_entries(a->journal, &e, &n) < 0)
        return;
    for (int i = 0; i < n; i++) {
        struct vm *v;
        int busy;

        if (e[i].kind != JOURNAL_REDIRECT ||
            !(v = agent_find_vm(a, e[i].vm)))
            continue;
        /* Not inside a txn's pause (the look takes the VM's lock), nor
         * while it starts, nor when a merge runs or its overlay is kept. */
        pthread_mutex_lock(&a->mu);
        busy = v->paused_at != 0 || v->starting || v->storage_pending;
        pthread_mutex_unlock(&a->mu);
        if (busy || redirect_bg_busy(a, v))
            continue;
        if (strcmp(vm_state(v, RD_WATCH_TIMEOUT_MS), "shutoff") != 0)
            continue;
        log_info("event=redirect_vm_gone vm=%s id=%s msg=\"its QEMU is "
                 "gone: its overlays are removed unless they hold guest "
                 "writes\"", v->cfg->name, e[i].txn);
        redirect_kick(a, v, e[i].txn, "vm_gone");
    }
    free(e);
}
