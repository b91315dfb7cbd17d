/*
 * guest_libvirt: guest filesystem freeze and thaw through libvirt's own
 * guest agent channel (org.qemu.guest_agent.0 in the domain XML): the
 * libvirt driver's guest ops (struct vm_ops).  Part of the libvirt driver
 * (vm_libvirt.c).
 *
 *   open    the connection is up and the domain has the channel
 *   freeze  virDomainFSFreeze of [vm] mountpoints (all when none), within
 *           the caller's deadline
 *   thaw    virDomainFSThaw, within 6 s
 *
 * libvirt syncs with the guest agent before each command itself.  A
 * freeze libvirt refused before sending (no channel, guest agent not
 * connected, domain not running, not connected to libvirt) is
 * VM_GUEST_UNSENT; any other failure may have frozen the guest, so the
 * caller thaws.  The calls run in the VM's guest slot (lvdomain.h).
 */
#ifndef CP_GUEST_LIBVIRT_H
#define CP_GUEST_LIBVIRT_H

#include <stddef.h>

#include "vm.h"

int guest_libvirt_configured(const struct vm *v);
int guest_libvirt_open(const struct vm *v, struct vm_guest **out, char *err,
                       size_t errlen);
int guest_libvirt_freeze(struct vm_guest *g, int timeout_ms, int *nfs,
                         char *err, size_t errlen);
int guest_libvirt_thaw(struct vm_guest *g, int *nfs, char *err,
                       size_t errlen);
void guest_libvirt_close(struct vm_guest *g);
/* vm_ops guest_command: virDomainQemuAgentCommand in the VM's guest slot
 * (libvirt then marks the domain tainted, custom-ga-command: meant for
 * drill copies and checks, agent-protocol §4.12). */
int guest_libvirt_command(struct vm *v, const char *cmd, json_t *args,
                          int timeout_ms, json_t **ret, struct qmp_err *err);

#endif
