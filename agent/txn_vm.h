/*
 * txn_vm: one VM's part of a transaction, run in that VM's own thread
 * (par_run) so that a slow VM never lengthens another's pause window.
 *
 *   prepare:  txn_vm_freeze (fs-freeze only, all VMs first) ─► txn_vm_pause
 *   commit:   txn_vm_commit = snapshot (the VM's backend, by the budget
 *             deadline) ─► resume at once ─► confirm ─► report
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
    enum qmp_errkind qmp_kind;
    const char *code;           /* when rc < 0 */
    char msg[512];
};

/* quiesce_freeze of the job's VM (arg: struct txn_vm_prep). */
void *txn_vm_freeze(void *arg);
/* Stops (pauses) the job's VM and records when (arg: struct txn_vm_prep). */
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
};

/* The job's VM's commit (arg: struct txn_vm_commit); fills out, and code
 * and msg on failure. */
void *txn_vm_commit(void *arg);

#endif
