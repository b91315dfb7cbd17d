/*
 * txn_vm: one VM's part of a transaction, run in that VM's own thread
 * (par_run) so that a slow VM never lengthens another's pause window.
 *
 *   prepare:  txn_vm_overlay (redirect cut) ─► txn_vm_freeze (fs-freeze
 *             only, all VMs first) ─► txn_vm_pause (stop, then the switch
 *             onto the overlays of a redirected VM)
 *   commit:   txn_vm_commit = snapshot (the VM's backend, by the budget
 *             deadline) ─► resume at once ─► confirm ─► report; a
 *             redirected VM resumes first, its bases are snapshotted after
 *             `cont`, and its overlays are merged back in the background
 *             (txn_vm_commit_merged: the reply waits for it, bounded)
 */
#ifndef CP_TXN_VM_H
#define CP_TXN_VM_H

#include <jansson.h>

#include "agent.h"

struct txn_vm_prep {
    struct agent *a;
    struct vm *vm;
    const char *txn;
    int freeze_timeout_ms;      /* min(config, prepare's freeze_timeout_ms) */
    int stop_timeout_ms;        /* min(qmp_timeout_ms, the lease) */
    double t0, t1;              /* the stop call, start and end */
    int rc;
    int journaled;
    /* the redirect cut (redirect.h): RD_READY to try (overlays made by
     * txn_vm_overlay, switched in the pause: RD_SWITCHED), RD_NONE when
     * the VM is cut in the pause; rd_why says why it fell back */
    int redirect;
    int skip;                   /* not stopped: rc, code and msg say why */
    double tsw0, tsw1;          /* the switch, start and end */
    /* the live cut (hold.h): 1 to try (no stop; the network held from th0
     * until the resume), 0 after a fall back to the stop */
    int live;
    double th0;
    char rd_why[512];
    enum qmp_errkind qmp_kind;
    const char *code;           /* when rc < 0 */
    char msg[512];
};

/* Makes the job's VM's overlays when j->redirect asks for them, or sets
 * it to RD_NONE with rd_why (arg: struct txn_vm_prep). */
void *txn_vm_overlay(void *arg);
/* quiesce_freeze of the job's VM (arg: struct txn_vm_prep). */
void *txn_vm_freeze(void *arg);
/* Stops (pauses) the job's VM and records when, then switches it onto its
 * overlays when j->redirect is RD_READY (arg: struct txn_vm_prep). */
void *txn_vm_pause(void *arg);

struct txn_vm_commit {
    struct agent *a;
    struct vm *vm;
    struct txn *x;
    int vmidx;                      /* index in x->vms */
    int disks[CFG_MAX_DISKS];       /* disk indexes to snapshot */
    const char *names[CFG_MAX_DISKS];
    int ndisks;
    double t_arrive, deadline;
    json_t *out;                    /* per-VM result */
    const char *code;               /* NULL when ok */
    char msg[512];
    /* filled by the steps of txn_vm_commit */
    struct snap_member *m;          /* ndisks, on txn_vm_commit's stack */
    int budget_hit;
    double ts0, ts1, tc0, tc1;      /* snapshot and cont, start and end */
    int resumed;
    /* per disk, after confirm: this commit made the snapshot (it exists
     * and was not there before), and its rbd snap id when has_id */
    int created[CFG_MAX_DISKS], has_id[CFG_MAX_DISKS];
    int pending[CFG_MAX_DISKS];     /* may still complete (no id yet) */
    uint64_t snap_id[CFG_MAX_DISKS];
    const char *resume_code;
    char resume_msg[512];
    int rd;                         /* the VM's redirect at commit start */
    double merge_ms;
    char merge_err[512];            /* "" unless the merge failed */
    int merge_bg;                   /* merged in the background */
};

/* The job's VM's commit (arg: struct txn_vm_commit); fills out, and code
 * and msg on failure. */
void *txn_vm_commit(void *arg);
/* After txn_vm_commit: waits up to deadline (mono_ms) for the VM's merge
 * in the background, and reports it in j->out: merge_ms (and merge_error),
 * or "merge": "background" when it still runs. */
void txn_vm_commit_merged(struct txn_vm_commit *j, double deadline);

#endif
