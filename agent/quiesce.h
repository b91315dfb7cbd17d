/*
 * quiesce: application consistency through the guest agent
 * (`quiesce: fs-freeze`, agent-protocol §4.3), per VM of a transaction:
 *
 *   prepare:  quiesce_reset ─► quiesce_freeze (all VMs, before any stop)
 *                                  │ ok: level fs-freeze
 *                                  │ failed: level crash, reason kept,
 *                                  │         thaw still queued
 *                                  │ timed out: thawed at once (a
 *                                  │         late answer froze it)
 *   resume (commit, abort, lease, prepare failure) ─► quiesce_thaw
 *                                  │ failed: thaw_pending
 *                                  ▼
 *   reaper, VM neither paused nor awaiting a resume, at thaw_next
 *        ─► quiesce_thaw_retry ──ok──► entry removed, done
 *              │ failed: attempt+1, next in 500 ms doubling to 30 s
 *              │ guest gone (VM shut off or its socket gone): entry
 *              ▼         dropped, logged
 *
 * The guest channel a freeze opened stays in v->guest (under a.mu) until
 * the thaw takes it, so exactly one thaw runs per freeze.  The journal's
 * `frozen` entry (written by prepare before the freeze) is what a restart
 * thaws when the agent died in between (recover.c).
 */
#ifndef CP_QUIESCE_H
#define CP_QUIESCE_H

#include <jansson.h>

#include "agent.h"

/* Clears v's quiesce facts before a prepare: level crash, no times. */
void quiesce_reset(struct agent *a, struct vm *v);

/*
 * Freezes v's guest filesystems (deadline timeout_ms), before any VM of
 * the txn is stopped, so that the freeze wait is never inside a pause
 * window.  Any failure falls back to crash consistency with the reason
 * recorded; the txn carries on.
 */
void quiesce_freeze(struct agent *a, struct vm *v, const char *txn,
                    int timeout_ms);

/*
 * Thaws the guest filesystems if this VM's prepare opened its guest agent
 * (after a freeze, and also after a failed one: a slow agent may freeze
 * after we gave up).  Runs after cont: a paused guest cannot answer.  On
 * commit it runs in resume_one, i.e. after this VM's cont and before the
 * commit reply is built, so the reply carries thaw_ms and thaw_error; the
 * thaw never lengthens the pause, only the reply.
 *
 * A thaw the guest agent answered removes the VM's `frozen` journal entry
 * of txn (any txn when NULL); a failed one keeps it and makes the thaw
 * pending (quiesce_thaw_later), and a restart of the agent thaws it too
 * (agent-protocol §7).  Returns 0 (thawed), -1 (failed, reason in
 * v->thaw_error, retry pending) or 1 (no guest agent open: nothing to
 * thaw).
 */
int quiesce_thaw(struct agent *a, struct vm *v, const char *txn);

/* Makes a thaw of v (the `frozen` entry of txn) pending: the reaper
 * retries it.  Idempotent; keeps the attempt count of a pending one. */
void quiesce_thaw_later(struct agent *a, struct vm *v, const char *txn);

/* 1 when a pending thaw of v is due now (a.mu held): never while the VM
 * is paused by us or awaiting a resume, since a paused guest cannot
 * answer. */
int quiesce_thaw_due(const struct vm *v, double now);

/* One retry of v's pending thaw (claimed by the reaper: thaw_running). */
void quiesce_thaw_retry(struct agent *a, struct vm *v, int qmp_timeout_ms);

/* The quiesce facts of v for a reply entry o: consistency, freeze_ms,
 * (with_thaw: thaw_ms, thaw_error,) freeze_error. */
void quiesce_report(struct agent *a, json_t *o, struct vm *v, int with_thaw);
/* Only thaw_ms and thaw_error (abort's timings). */
void quiesce_report_thaw(struct agent *a, json_t *o, struct vm *v);

#endif
