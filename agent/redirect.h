/*
 * redirect: the redirect cut (design §3.1, agent-protocol §5.1): a VM's
 * pause holds only a switch of its disks onto overlays, and its RBD
 * snapshots are taken after `cont`, of bases that nobody writes any more.
 *
 *   prepare (before stop)  per disk: an RBD image <image>.cutpoint-ov.<txn>
 *                          next to the disk ─► blockdev-add rbd (cpovf<d>)
 *                          ─► blockdev-create qcow2 on it ─► blockdev-add
 *                          qcow2 cpov<d>, backing null
 *   in the pause           `stop` and one QMP `transaction` of
 *                          blockdev-snapshot (every disk onto its overlay),
 *                          sent together
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

/* redirect_merge and the functions of overlays no QEMU holds: an
 * overlay holds guest writes (or content that cannot be read) and no QEMU
 * holds it, so it is kept, never deleted, and reported
 * (event=redirect_overlay_kept; a prepare of the VM is BUSY with why). */
#define RD_KEPT (-2)

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

/* In the pause, the switch of every disk of v onto its overlay, atomic:
 * the arguments of its QMP `transaction` (a new object).  txn_vm.c sends
 * it together with the stop (vm_stop_then): QEMU switches right after the
 * stop, with no round trip to the agent between. */
json_t *redirect_switch_args(const struct vm *v);
/* <image>.cutpoint-ov.<id> of v's disk d into buf. */
void redirect_overlay_image(char *buf, size_t len, const struct vm *v, int d,
                            const char *id);

/* ---- redirect_bg.c: overlays made ahead, merges in the background ---- */

/* The overlays of v's cut in txn: those made ahead if ready (no journal
 * write: theirs is there), else made now, named by txn (redirect_make). */
int redirect_prepare(struct agent *a, struct vm *v, const char *txn,
                     int *hung, char *err, size_t errlen);
/* 1 when v's overlays for its next cut are ready (made ahead). */
int redirect_ahead_ready(struct agent *a, const struct vm *v);

/* ---- redirect_merge.c: the overlays merged back and removed ---- */

/* Merges v's overlays of txn back and removes them, whatever step was
 * reached; logs it (why: commit, abort, recovery...).  With v's QEMU gone,
 * or overlays that its QEMU does not hold, each goes only when it holds
 * no guest write (redirect_drop_detached).  On success the journal entry
 * goes; on -1 (or RD_KEPT: an overlay kept) it stays and err says why. */
int redirect_merge(struct agent *a, struct vm *v, const char *txn,
                   const char *why, char *err, size_t errlen);

/* ---- redirect_bg.c (continued) ---- */

/* Starts the merge of v's overlays of txn in a thread of its own, unless
 * one runs for v already; 1 when one runs. */
int redirect_kick(struct agent *a, struct vm *v, const char *txn,
                  const char *why);

/* How long after its budget a commit's reply may wait for its merges in
 * the background: the coordinator waits budget + 2 s for the reply. */
#define RD_REPLY_WAIT_MS 1000.0

/* After a commit: the merge of v's overlays of its current cut, then its
 * next cut's overlays (as redirect_finish), in a thread of their own, so
 * that the reply need not wait for them (an agent of 36 disks took longer
 * than the coordinator's wait for COMMITTED).  1 when started; 0 when a
 * merge of v runs already (the caller merges itself). */
int redirect_finish_bg(struct agent *a, struct vm *v);
/* Waits until the deadline (mono_ms) for redirect_finish_bg's merge of v:
 * 0 merged (and its next overlays made, unless the deadline or 500 ms
 * after the merge came first, as for a synchronous commit's reply),
 * *ms its time; -1 failed (err; it is retried in the background); 1 still
 * running. */
int redirect_finish_wait(struct agent *a, const struct vm *v, double deadline,
                         double *ms, char *err, size_t errlen);

/* Before a new cut of v: 0 when no overlays of an earlier txn remain.
 * Else -1 with err, and their merge is started in the background if it
 * is not running (a merge that failed, or recovery's): v must not be cut
 * until it is done, as its bases miss the writes since.  A commit's merge
 * on its first try is waited for until deadline (mono_ms) instead: it
 * ends soon.  Overlays being made ahead are waited for until ahead_by;
 * still being made then, 1 with err: v is on its bases, and is cut in the
 * pause this time (path in_pause; the overlays stay for its next cut). */
/* How long a prepare waits for a commit's merge: at most this, and a
 * quarter of its lease, so that its BUSY reaches the coordinator inside
 * its wait for PREPARED (half the lease by default). */
#define RD_SETTLE_WAIT_MS 10000.0
/* How long a prepare waits for overlays being made ahead, for all its VMs
 * together: as long as a cut in the pause would cost the VM, that is its
 * RBD snapshots (redirect_ahead_wait_ms), and at least this.  Making them
 * takes tens of ms on an idle host; under load it took 2.2-2.7 s per VM
 * (bench scale, 50 VMs), while other agents' VMs, paused already, waited
 * for this agent's PREPARED.  With 100 ms alone, 3 of 200 cuts fell back
 * at 10 VMs and paid +500 ms of backend latency (bench pause). */
#define RD_AHEAD_WAIT_MS 100.0
int redirect_settle(struct agent *a, struct vm *v, double deadline,
                    double ahead_by, char *err, size_t errlen);
/* The wait for overlays being made: the recent time of one VM's RBD
 * snapshots on this agent (a moving average), at least RD_AHEAD_WAIT_MS. */
double redirect_ahead_wait_ms(void);
/* A commit took ms to create one VM's RBD snapshots (txn_vm.c). */
void redirect_note_snapshot_ms(double ms);

/* ---- redirect_turn.c: a step of making and a stop take turns ---- */

/* QEMU 7.2 aborts (block-backend.c blk_unref: Assertion `blk->refcnt ==
 * 1') when `stop` arrives while a blockdev-create job runs: seen in the
 * lab (bench scale) and reproduced with QEMU 7.2.22 and one RBD node.  And
 * under load (bench scale, 50 and 100 VMs) the create jobs of every VM of
 * an agent whose overlays were being made beside cuts in the pause ran
 * for 30 s (QEMU's rados op timeout in the lab), which no run had shown
 * before.  So the steps of redirect_make (each overlay's image and node;
 * the create jobs; the qcow2 nodes) run only while the agent holds v
 * neither stopped nor being stopped, as before overlays could be made
 * beside a cut in the pause:
 *   redirect_step_begin  waits until deadline (mono_ms) for v's cont, then
 *                        marks a step running (-1: v still paused);
 *   redirect_step_end    the step is done, or a merge of v succeeded (it
 *                        removes the nodes, which no running job allows);
 *   redirect_stop_begin  before a stop: waits until deadline for the step
 *                        in flight, then marks v held (-1: it still runs);
 *   redirect_resumed     v runs again (its cont, or a stop QEMU refused).
 */
int redirect_step_begin(struct agent *a, const struct vm *v, double deadline);
void redirect_step_end(struct agent *a, const struct vm *v);
int redirect_stop_begin(struct agent *a, const struct vm *v, double deadline);
void redirect_resumed(struct agent *a, const struct vm *v);

/* ---- state of the background half (redirect_bg.c) ---- */

/* Waits up to max_ms until no overlays of v are being made ahead and no
 * merge of v runs in the background; -1 when they still do. */
int redirect_bg_wait(struct agent *a, const struct vm *v, double max_ms);
/* 1 when overlays of v are being made or merged in the background, or
 * one of v's is kept (RD_KEPT): nothing to start for v now. */
int redirect_bg_busy(struct agent *a, const struct vm *v);
/* This run of the agent removed (or is removing) the overlay nodes of id
 * from v's QEMU itself: their images hold nothing QEMU has not merged
 * back, and go without a look at their content. */
void redirect_note_dropped(struct agent *a, const struct vm *v,
                           const char *id);
int redirect_was_dropped(struct agent *a, const struct vm *v, const char *id);
/* The overlays of id are gone with their journal entry: forget them (as
 * made ahead, dropped, kept). */
void redirect_forget(struct agent *a, const struct vm *v, const char *id);

/* ---- redirect_gone.c: overlays that no QEMU holds ---- */

/* Disk d's overlay image of id, which no QEMU holds (its QEMU is gone, or
 * a QEMU started since does not have it): removed when it holds no guest
 * write (qcow2ov.h), else kept: RD_KEPT with err; -1 when Ceph failed
 * (it stays; a removal that a killed QEMU's watch blocks is busy for up to
 * 30 s). */
int redirect_drop_detached(struct agent *a, struct vm *v, int d,
                           const char *id, char *err, size_t errlen);
/* redirect_drop_detached for every disk of v (its QEMU is gone). */
int redirect_offline(struct agent *a, struct vm *v, const char *id,
                     char *err, size_t errlen);
/* vm.stop, before QEMU is told to quit (why "vm_stop"), and the agent's
 * stop: the overlays being made or merged end, then those of v's journal
 * entry are merged back or removed while QEMU still runs. */
void redirect_vm_stopping(struct agent *a, struct vm *v, const char *why);
/* The agent's stop, after its resumes: redirect_vm_stopping of every VM,
 * in parallel.  Overlays made ahead belong to a running agent: one that
 * stops for good (a host taken out, a drill's agent) leaves none behind,
 * and one restarted makes them again after its first merge. */
void redirect_agent_stop(struct agent *a);
/* The inventory's tick: a VM with a `redirect` entry whose QEMU is gone
 * (killed, or stopped outside the agent) gets its merge started in the
 * background, which then removes what holds no guest write. */
void redirect_watch(struct agent *a);

/* Merges back the overlays of v's current txn (redirect_merge); on
 * success starts making the next cut's overlays ahead, in the background. */
int redirect_finish(struct agent *a, struct vm *v, const char *why,
                    char *err, size_t errlen);

/* Merges every VM of x whose rd[] state asks for it (RD_READY or
 * RD_SWITCHED), one thread per VM, and marks it RD_MERGED; for a VM cut
 * in the pause (RD_NONE), redirect_ahead_after_cut.  The caller owns x. */
void redirect_merge_txn(struct agent *a, struct txn *x, const char *why);

/* After a txn that cut v in the pause: starts making its next cut's
 * overlays in the background, unless v cannot take the redirect cut, or
 * its journal lists overlays of v already (made or being made ahead, or
 * an earlier cut's still to merge back).  Steps of making wait for the
 * agent's cont of v (redirect_stop_begin). */
void redirect_ahead_after_cut(struct agent *a, struct vm *v);

#endif
