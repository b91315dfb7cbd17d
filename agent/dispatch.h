/*
 * dispatch: runs one validated request through the command table
 * (commands.def): finds the command's handler and calls it.  The server
 * calls dispatch_run from the request's own thread.
 *
 * Roles: each row of the table says which roles of peer (peer.h: the
 * SAN URI spiffe://cutpoint/<role> of its certificate) may run the
 * command.  The server asks dispatch_allows before it queues a request; a
 * peer whose role is not in the row gets FORBIDDEN and the handler never
 * runs.
 */
#ifndef CP_DISPATCH_H
#define CP_DISPATCH_H

#include <stddef.h>
#include <jansson.h>

#include "agent.h"
#include "peer.h"
#include "proto.h"


/*
 * Runs one validated request.  Returns the result object (new reference)
 * or NULL with *code/msg set (UNKNOWN_COMMAND for a command the table does
 * not have); *err_result may receive partial facts for an error reply
 * (new reference or NULL).
 */
json_t *dispatch_run(struct agent *a, const struct proto_request *req,
                     const char **code, char *msg, size_t msglen,
                     json_t **err_result);

/* The roles allowed to run cmd (PEER_ROLE_* bits); 0 for a command the
 * table does not have. */
unsigned dispatch_roles(enum proto_cmd cmd);

/* 0 if a peer of role may run cmd; otherwise -1 with *code FORBIDDEN and
 * msg naming the role and the roles the command needs. */
int dispatch_allows(enum proto_cmd cmd, unsigned role, const char **code,
                    char *msg, size_t msglen);

/* The names of the table's commands, in order (new array; hello's
 * capabilities). */
json_t *dispatch_names(void);

#endif
