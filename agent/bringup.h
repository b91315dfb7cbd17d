/*
 * bringup: the agent's start after recovery, in the background.  Recovery
 * (recover.c) needs only the journal and each VM's own monitor socket; the
 * rest of the start needs the network and other daemons, any of which may
 * be down or hung when the agent restarts after a crash.  So the rest runs
 * in a thread of its own while the agent already serves, and each step is
 * retried with backoff until it succeeds or the agent stops:
 *
 *   hypervisor ──▶ ceph ──▶ images ──▶ done
 *   (libvirt:     (connect,  (open every rbd
 *    connect,      fence the  disk, except
 *    discover,     previous   standbys')
 *    attach VMs)   client)
 *
 *   a step fails: log event=bringup_retry step=... retry_ms=N, wait N
 *   (500 ms doubling up to 30 s), run it again.
 *
 * Until `images` is done, a VM with rbd disks is `storage_pending`:
 * prepare refuses it with BUSY, so that no cut uses a half-open disk.
 * A step that hangs (rados_connect to a stopped mon) holds only this
 * thread; agent_stop does not wait for it.
 */
#ifndef CP_BRINGUP_H
#define CP_BRINGUP_H

#include <stddef.h>

#include "agent.h"

/* Starts the thread; -1 with err when it cannot. */
int bringup_start(struct agent *a, char *err, size_t errlen);
/* 1 once every step is done (a.mu held). */
int bringup_done(const struct agent *a);

#endif
