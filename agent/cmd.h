/*
 * cmd: the command handlers, by family, one file each; the command table
 * (commands.def) maps each command to one of them.
 *
 *   cmd_info.c  hello, inventory, stats
 *   cmd_txn.c   prepare, commit, abort, resume (agent-protocol §4.3-4.6)
 *   cmd_snap.c  snapshot.list, snapshot.delete
 *   cmd_vm.c    vm.start, vm.stop
 *   cmd_vmdef.c vm.definition, vm.start of a signed definition
 *   cmd_guest.c vm.guest_ping, vm.guest_exec (through the guest agent)
 *
 * Every handler gets the request's args, already validated against the
 * table's argument fields (proto.c).  It returns the result object (new
 * reference), or NULL with *code (a static string, agent-protocol §3.3)
 * and msg set; *err_result may get partial facts for the error reply
 * (§3.4; new reference).
 */
#ifndef CP_CMD_H
#define CP_CMD_H

#include <stdio.h>
#include <jansson.h>

#include "agent.h"

typedef json_t *cmd_handler(struct agent *a, json_t *args, const char **code,
                            char *msg, size_t msglen, json_t **err_result);

/* Fails the handler with code and a formatted message (one cleanup:). */
#define FAIL(c, ...) do { *code = (c); snprintf(msg, msglen, __VA_ARGS__); \
                          goto cleanup; } while (0)

cmd_handler cmd_hello, cmd_inventory, cmd_stats;
cmd_handler cmd_prepare, cmd_commit, cmd_abort, cmd_resume;
cmd_handler cmd_snap_list, cmd_snap_delete;
cmd_handler cmd_vm_start, cmd_vm_stop, cmd_vm_definition;
cmd_handler cmd_vm_guest_ping, cmd_vm_guest_exec;

/* vm.start of spec {vm, xml, sig}: only a definition the control plane
 * signed for that VM (cmd_vmdef.c); FORBIDDEN otherwise. */
json_t *cmd_vm_start_signed(struct agent *a, json_t *spec, const char **code,
                            char *msg, size_t msglen);

/* Deletes one member snapshot of disk d of v (abort and snapshot.delete).
 * 1 deleted, 0 absent, -1 error (err). */
int cmd_snap_delete_one(struct agent *a, struct vm *v, int d,
                        const char *name, char *err, size_t errlen);
/*
 * abort's delete of snapshot name of disk d for txn: only what txn made.
 * ours: txn's commit made it (recorded), jid: its rbd snap id if known.
 * With an id it is deleted by id; made by us without one (qmp-transaction)
 * by name.  Not recorded (named by abort's caller): on an open rbd image
 * it is deleted only if its owner key names txn -- a snapshot that was
 * there before is left alone (-1, err says so); elsewhere by name.
 * 1 deleted, 0 absent, -1 error or not txn's.
 */
int cmd_snap_delete_owned(struct agent *a, struct vm *v, int d,
                          const char *name, const char *txn, int ours,
                          json_t *jid, char *err, size_t errlen);

#endif
