/*
 * reaper: the agent's background thread for the two things that must
 * happen without a request (invariant 2, agent-protocol §5, §8):
 *
 *   every <= 100 ms, under a.mu:
 *     lease_claim_due ──▶ expire thread: resume the txn's VMs, EXPIRED
 *     needs_resume VM, no retry running, last one >= 500 ms ago
 *                     ──▶ retry thread: resume it again
 *     pending thaw due (quiesce_thaw_due)
 *                     ──▶ thaw thread: quiesce_thaw_retry
 *     txn_gc
 *     WATCHDOG=1 to systemd, every half of WatchdogSec (sdnotify.h)
 *
 * The reaper never calls a VM itself (a hung QEMU would delay every other
 * lease); it claims due work under a.mu and hands it to detached threads.
 */
#ifndef CP_REAPER_H
#define CP_REAPER_H

#include <stddef.h>

#include "agent.h"

/* Starts the thread; -1 with err when it cannot. */
int reaper_start(struct agent *a, char *err, size_t errlen);
/* Waits for the thread to end (after a.stopping was set). */
void reaper_join(struct agent *a);
/* 1 while a resume retry runs (a.mu held). */
int reaper_busy(struct agent *a);

/* The lease of x fired (x is EXPIRING): resumes its VMs, then marks it
 * EXPIRED.  Also run by a commit that finds the lease already passed. */
void reaper_expire(struct agent *a, struct txn *x);

#endif
