/*
 * guest_qga: guest filesystem freeze and thaw through the QEMU guest agent
 * on the VM's configured `qga =` socket (qga.c).  Both VM drivers use
 * these as their guest ops (struct vm_ops) today.
 *
 *   open    connect to the socket
 *   freeze  sync (1 s), then guest-fsfreeze-freeze (the caller's deadline)
 *   thaw    sync (1 s), then guest-fsfreeze-thaw (5 s)
 *
 * The sync before each command discards stale replies of earlier calls
 * that timed out (qga.h).  Functions return 0 or -1 with a message in err.
 */
#ifndef CP_GUEST_QGA_H
#define CP_GUEST_QGA_H

#include <stddef.h>

#include "vm.h"

int guest_qga_configured(const struct vm *v);
int guest_qga_open(const struct vm *v, struct vm_guest **out, char *err,
                   size_t errlen);
int guest_qga_freeze(struct vm_guest *g, int timeout_ms, int *nfs, char *err,
                     size_t errlen);
int guest_qga_thaw(struct vm_guest *g, int *nfs, char *err, size_t errlen);
void guest_qga_close(struct vm_guest *g);
/* vm_ops guest_command: connect to the `qga =` socket, sync, the
 * command, close (one connection per command: QEMU's chardev serves one
 * client at a time, and a freeze may want it next). */
int guest_qga_command(struct vm *v, const char *cmd, json_t *args,
                      int timeout_ms, json_t **ret, struct qmp_err *err);

#endif
