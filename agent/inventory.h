/*
 * inventory: the agent's live inventory (agent-protocol §4.2): what the
 * `inventory` command replies, with a generation number, and the thread
 * that keeps the agent's VMs in step with what its hypervisor connections
 * report.
 *
 *   driver connection changed (conn_watch; libvirt: a lifecycle event,
 *   a reconnect) ─► kick ─► inventory thread, after bringup:
 *       adopt   every VM the connection's discovery reports that the
 *               agent does not have yet becomes one (published under a.mu,
 *               up to CFG_MAX_VMS; a slot is never freed, so a handler's
 *               struct vm stays valid)
 *       disks   open the rbd images of adopted VMs, and of standbys that
 *               came up without vm.start (retried every 2 s, logged at
 *               most every 30 s while they fail)
 *
 * The reply's `generation` changes whenever the reply's content does (a
 * VM, its state, disks or staleness, a connection up or down, a libvirt
 * event), and `instance` changes with every start of the agent: a poller
 * that sees both unchanged needs to sync nothing.
 */
#ifndef CP_INVENTORY_H
#define CP_INVENTORY_H

#include <stddef.h>
#include <jansson.h>

#include "agent.h"

/* Starts the thread (it works once bringup is done); -1 with err. */
int inventory_start(struct agent *a, char *err, size_t errlen);
/* Has every open hypervisor connection kick the thread on a change. */
void inventory_watch(struct agent *a);
/* Ends the thread (after a.stopping was set and a.cond broadcast). */
void inventory_join(struct agent *a);
/* Wakes the thread (bringup done, a connection changed). */
void inventory_kick(struct agent *a);

/* Adds the VMs the connections discover now (bringup and the thread);
 * returns how many were added. */
int inventory_adopt(struct agent *a);

/* The `inventory` reply (new reference). */
json_t *inventory_json(struct agent *a);

#endif
