/*
 * hold: the live cut's network hold (design §3.1 (c), agent-protocol
 * §5.1, `[agent] pause_path = live`).
 *
 * On the live cut a VM is never stopped: its disks switch onto their
 * overlays in one QMP `transaction` while its vCPUs run.  What keeps the
 * group's cut consistent is that nothing a VM sends after its own cut can
 * reach a VM not cut yet: from before its switch until its resume (COMMIT,
 * abort, an expired lease, recovery) the packets the guest sends are held
 * in QEMU, by one `filter-buffer` per NIC backend:
 *
 *   hold_ready   once per VM and QEMU: its NICs' netdevs (qom-list of
 *                /machine/peripheral{,-anon}, qom-get netdev), then per
 *                netdev `object-add filter-buffer id=cutpoint-hold-<netdev>
 *                queue=rx status=off` (rx: what the netdev receives from
 *                the guest).  Not usable, with why: a device that talks
 *                outside QEMU's network layer (vfio, ivshmem, vhost-user),
 *                or a netdev QEMU cannot filter (vhost-net: object-add
 *                fails).  Such a VM is stopped as before.
 *   hold_on      `qom-set status on` per filter, before the switch.  A
 *                refusal turns back off what it turned on.
 *   hold_off     `qom-set status off` per filter: QEMU sends what it held,
 *                in order (filter-buffer flushes when disabled).  After a
 *                restart of the agent (recovery marks every VM of a
 *                `paused` entry held) the filters are found by name under
 *                /objects.  A filter gone with its QEMU counts as off.
 *
 * The filter's release timer (`interval`) is set to its largest value, so
 * that only hold_off releases; the agent's lease bounds the hold as it
 * bounds a stop.  Only the qmp driver: the others answer "not usable".
 */
#ifndef CP_HOLD_H
#define CP_HOLD_H

#include <stddef.h>

#include "vm.h"

/* The prefix of the filters' QOM ids (under /objects). */
#define HOLD_ID_PREFIX "cutpoint-hold-"

/* 1 when v's network can be held (its filters exist, off); 0 with why.
 * A VM found unusable is looked at again after VM_HOLD_TTL_MS. */
#define VM_HOLD_TTL_MS 60000.0
int hold_ready(struct vm *v, int timeout_ms, char *why, size_t len);

/* Turns v's filters on.  On -1 err says why; err->kind QMP_E_ERROR: QEMU
 * refused and none is left on; otherwise (no answer) some may be on. */
int hold_on(struct vm *v, int timeout_ms, struct qmp_err *err);

/* Turns v's filters off: those hold_ready made, or, when this run has
 * not made them (after a restart of the agent), those found by name under
 * /objects.  0 when none is left on. */
int hold_off(struct vm *v, int timeout_ms, struct qmp_err *err);

#endif
