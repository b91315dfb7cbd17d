/*
 * redirect: the redirect cut (design §3.1, agent-protocol §5.1): a VM's
 * pause holds only a switch of its disks onto overlays, and its RBD
 * snapshots are taken after `cont`, of bases that nobody writes any more.
 *
 *   prepare (before stop)  per disk: an RBD image <image>.cutpoint-ov.<txn>
 *                          next to the disk ─► blockdev-add rbd (cpovf<d>)
 *                          ─► blockdev-create qcow2 on it ─► blockdev-add
 *                          qcow2 cpov<d>, backing null
 *   in the pause           one QMP `transaction` of blockdev-snapshot
 *                          (every disk onto its overlay)
 *   commit (after cont)    the bases' RBD snapshots (txn_vm.c), then
 *   merge                  active block-commit of each overlay back
 *                          (ready ─► job-complete ─► concluded) ─►
 *                          blockdev-del ─► the overlay image removed
 *
 * After a merge the next cut's overlays are made at once, in the
 * background (redirect_bg.c): a prepare that finds them ready only writes
 * its journal, stops and switches, so no agent's stops wait for overlays
 * (their journal entry names them by an id "ahead-..." instead of a txn).
 *
 * The merge must always run once overlays were made: after commit, abort,
 * a failed prepare, an expired lease, and a crash of the agent (the
 * `redirect` journal entry, written before the overlays are made and
 * removed after the merge; recover.c).  It reads the VM's block graph, so
 * it does whatever is left, whatever the step the previous run reached.
 *
 * Used for qmp-driver VMs with method rbd whose every disk is an open RBD
 * image, unless [agent] pause_path = in_pause; every other VM, and any VM
 * whose overlays could not be made or switched, is cut in the pause as
 * before (path "in_pause").
 */
#ifndef CP_REDIRECT_H
#define CP_REDIRECT_H

#include <stddef.h>

#include "agent.h"

/* A VM's redirect in a txn (struct txn's rd[]). */
enum rd_state {
    RD_NONE = 0,        /* in_pause: not redirected */
    RD_READY,           /* overlays made, not switched */
    RD_SWITCHED,        /* the VM writes to its overlays */
    RD_MERGED,          /* merged back and removed (or nothing to do) */
};

/* The path name a reply reports for state s. */
const char *redirect_path_name(int s);

/* 1 when v may take the redirect cut; 0 with why. */
int redirect_usable(const struct agent *a, const struct vm *v, char *why,
                    size_t len);

/* Makes v's overlays named by id (a txn, or an id of overlays made ahead)
 * while the VM runs; its journal entry is written already.  On -1 err
 * says why, and what was made is removed again (the journal entry too when
 * that worked); *hung = 1 when QEMU did not answer in time (the removal
 * then runs in the background, and v cannot be stopped either). */
int redirect_make(struct agent *a, struct vm *v, const char *id, int *hung,
                  char *err, size_t errlen);

/* ---- redirect_bg.c: overlays made ahead, merges in the background ---- */

/* The overlays of v's cut in txn: those made ahead if ready (no journal
 * write: theirs is there), else made now, named by txn (redirect_make). */
int redirect_prepare(struct agent *a, struct vm *v, const char *txn,
                     int *hung, char *err, size_t errlen);
/* 1 when v's overlays for its next cut are ready (made ahead). */
int redirect_ahead_ready(struct agent *a, const struct vm *v);

/* In the pause: switches every disk of v onto its overlay, atomically. */
int redirect_switch(struct vm *v, int timeout_ms, struct qmp_err *err);

/* Merges v's overlays of txn back and removes them, whatever step was
 * reached; logs it (why: commit, abort, recovery...).  On success the
 * journal entry goes; on -1 it stays and err says why. */
int redirect_merge(struct agent *a, struct vm *v, const char *txn,
                   const char *why, char *err, size_t errlen);

/* Starts the merge of v's overlays of txn in a thread of its own, unless
 * one runs for v already; 1 when one runs. */
int redirect_kick(struct agent *a, struct vm *v, const char *txn,
                  const char *why);

/* Before a new cut of v: 0 when no overlays of an earlier txn remain.
 * Else -1 with err, and their merge is started in the background if it
 * is not running (a merge that failed, or recovery's): v must not be cut
 * until it is done, as its bases miss the writes since. */
int redirect_settle(struct agent *a, struct vm *v, char *err,
                    size_t errlen);

/* Merges back the overlays of v's current txn (redirect_merge); on
 * success starts making the next cut's overlays ahead, in the background. */
int redirect_finish(struct agent *a, struct vm *v, const char *why,
                    char *err, size_t errlen);

/* Merges every VM of x whose rd[] state asks for it (RD_READY or
 * RD_SWITCHED) and marks it RD_MERGED; the caller owns x. */
void redirect_merge_txn(struct agent *a, struct txn *x, const char *why);

#endif
