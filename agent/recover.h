/*
 * recover: at start, undo what a previous run of the agent left done
 * (agent-protocol §7, invariant 2): resume the VMs its journal says are
 * paused, thaw the guests it says may be frozen, and fence the previous
 * run's Ceph client so that its lingering watches do not slow snapshots.
 */
#ifndef CP_RECOVER_H
#define CP_RECOVER_H

#include "agent.h"

/*
 * Per VM named in the journal:
 *
 *   paused + frozen:  open the guest agent, cont, then thaw (resume_one;
 *                     a paused guest cannot answer the thaw).  If cont
 *                     fails, the reaper's retry thaws after its cont.
 *   paused only:      cont.
 *   frozen only:      thaw (killed after cont, or between freeze and
 *                     stop, or a thaw that failed before).
 *   not configured:   log unknown_vm and drop its entries; but when a
 *                     driver discovers VMs (libvirt, discover = yes) keep
 *                     them (result=deferred) for recover_adopted.
 *
 * A recovery thaw that fails keeps its `frozen` entry and is retried by
 * the reaper with backoff (quiesce.h) until the guest agent answers or the
 * guest is gone, every attempt logged.  A thaw of a guest that is not
 * frozen is harmless (guest-fsfreeze-thaw returns 0), so an entry left by
 * a freeze that never happened costs one round trip.
 */
void recover_journal(struct agent *a);

/* A VM discovery just added (inventory.c): what the journal still holds
 * for it is undone as for a configured VM, by the reaper (resume retry,
 * then thaw retry). */
void recover_adopted(struct agent *a, struct vm *v);

/*
 * Records this agent's RADOS client address next to the journal and
 * blocklists the one recorded by the previous run, if any (see
 * rbdsnap_blocklist for why).  Failures are logged, not fatal.
 */
void recover_fence(struct agent *a);

#endif
