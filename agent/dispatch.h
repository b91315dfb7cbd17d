/*
 * dispatch: runs one validated request through the command table
 * (commands.def): finds the command's handler and calls it.  The server
 * calls dispatch_run from the request's own thread.
 *
 * Roles: each row of the table says which roles of peer may run the
 * command.  Every row allows every role today: the agent does not yet
 * derive a role from the peer's certificate, so any certificate the CA
 * signed may run any command.  The column is here so that restricting a
 * command is a change of its row, and dispatch_run is where the check
 * goes.
 */
#ifndef CP_DISPATCH_H
#define CP_DISPATCH_H

#include <stddef.h>
#include <jansson.h>

#include "agent.h"
#include "proto.h"

/* The roles of the agent's peers, as a bit set. */
#define DISPATCH_ROLE_COORDINATOR 0x1u
#define DISPATCH_ROLE_AGENT 0x2u
#define DISPATCH_ROLE_OPERATOR 0x4u
#define DISPATCH_ROLES_ANY (DISPATCH_ROLE_COORDINATOR | DISPATCH_ROLE_AGENT | \
                            DISPATCH_ROLE_OPERATOR)

/*
 * Runs one validated request.  Returns the result object (new reference)
 * or NULL with *code/msg set (UNKNOWN_COMMAND for a command the table does
 * not have); *err_result may receive partial facts for an error reply
 * (new reference or NULL).
 */
json_t *dispatch_run(struct agent *a, const struct proto_request *req,
                     const char **code, char *msg, size_t msglen,
                     json_t **err_result);

/* The roles allowed to run cmd; 0 for a command the table does not have. */
unsigned dispatch_roles(enum proto_cmd cmd);

/* The names of the table's commands, in order (new array; hello's
 * capabilities). */
json_t *dispatch_names(void);

#endif
