/*
 * prepare: the steps of a prepare request (agent-protocol §4.3), which
 * cmd_prepare (cmd_txn.c) runs in this order:
 *
 *   parse ─► begin ─┬─ known txn: replay its result or its error
 *                   └─ PREPARING ─► bound ─► journal ─► pause ─► sort ─┬─► done
 *                                                       (overlays,
 *                                                        freeze, stop,
 *                                                        switch)
 *                                     │        │                      │  PREPARED,
 *                                     │        │ write failed:        │  lease
 *                                     ▼        ▼ nothing paused       │  armed
 *                     unbounded: nothing paused (forgotten)           └─► undo
 *                                                                 resume what
 *                                                                 paused, thaw,
 *                                                                 forgotten
 *
 * A prepare is all or nothing: every VM paused, or none left paused.
 * Steps that can fail fill *code and msg (agent-protocol §3.3).
 */
#ifndef CP_PREPARE_H
#define CP_PREPARE_H

#include <stddef.h>
#include <jansson.h>

#include "agent.h"
#include "txn_vm.h"

struct prepare {
    struct agent *a;
    const char *id;
    json_t *jvms;
    json_int_t lease;
    int n;
    int freeze;                 /* quiesce: fs-freeze */
    int freeze_ms;
    const char *names[CFG_MAX_VMS];
    struct vm *vms[CFG_MAX_VMS];
    struct txn *x;
    struct txn_vm_prep jobs[CFG_MAX_VMS];
    int failed;                 /* index of the first VM that failed, -1 */
    struct vm *undo[CFG_MAX_VMS];   /* paused: resumed if the prepare fails */
    int nundo;
    int rd[CFG_MAX_VMS];        /* 1: the VM is to take the redirect cut */
    /* why a VM that could take it is cut in the pause this time */
    char rd_why[CFG_MAX_VMS][256];
    /* when the request arrived, the journal write began and ended, the
     * stops began (mono_ms): the reply's steps_ms, for the pause bench */
    double t_in, t_journal0, t_journal1, t_pause0;
};

/* The arguments, and the VMs they name.  0 or -1. */
int prepare_parse(struct prepare *p, json_t *args, const char **code,
                  char *msg, size_t msglen);
/* Enters PREPARING: 0 with p->x set, 1 when the txn is known (*replay:
 * its stored result, or NULL with the error set), -1 with the error set
 * (BUSY, ...). */
int prepare_begin(struct prepare *p, json_t **replay, const char **code,
                  char *msg, size_t msglen);
/* Refuses a VM whose snapshot method could hold it paused past the
 * commit's budget without limit (vm_pause_bound).  0, or -1 with the txn
 * forgotten. */
int prepare_bound(struct prepare *p, const char **code, char *msg,
                  size_t msglen);
/* Refuses, before any pause, when a read of one of the VMs' RBD disks is
 * not answered by the probe deadline (a `stop` would wait on that
 * storage with the VM paused).  0, or -1 with the txn forgotten. */
int prepare_probe(struct prepare *p, const char **code, char *msg,
                  size_t msglen);
/* Journals every VM as paused (and frozen) in one durable write, before
 * any pause.  0, or -1 with the txn forgotten. */
int prepare_journal(struct prepare *p, const char **code, char *msg,
                    size_t msglen);
/* Freezes (fs-freeze) then stops every VM, one thread per VM. */
void prepare_pause(struct prepare *p);
/* Sorts the stops' outcomes; p->failed >= 0 when one failed. */
void prepare_sort(struct prepare *p);
/* A stop failed: undoes the rest and fails with the partial facts. */
void prepare_undo(struct prepare *p, const char **code, char *msg,
                  size_t msglen, json_t **err_result);
/* Every VM is paused: PREPARED; returns the result. */
json_t *prepare_done(struct prepare *p);

#endif
