/* dispatch: see dispatch.h.  The handler and roles columns of the table. */
#include "dispatch.h"

#include <stdio.h>

#include "cmd.h"

static const struct {
    cmd_handler *handler;
    unsigned roles;
} table[PROTO_CMD_COUNT] = {
/* The roles column's names (commands.def). */
#define COORDINATOR PEER_ROLE_COORDINATOR
#define COORDINATOR_OPERATOR (PEER_ROLE_COORDINATOR | PEER_ROLE_OPERATOR)
#define CMD(id, name, handler, roles, ...) [PROTO_CMD_##id] = {handler, roles},
#include "commands.def"
#undef CMD
#undef COORDINATOR
#undef COORDINATOR_OPERATOR
};

unsigned
dispatch_roles(enum proto_cmd cmd)
{
    return (unsigned)cmd < PROTO_CMD_COUNT ? table[cmd].roles : 0;
}

int
dispatch_allows(enum proto_cmd cmd, unsigned role, const char **code,
                char *msg, size_t msglen)
{
    unsigned allowed = dispatch_roles(cmd);
    char need[64];

    /* PEER_ROLE_NONE is no bit: a certificate without a role runs nothing. */
    if (allowed & role)
        return 0;
    peer_roles_text(allowed, need, sizeof(need));
    *code = "FORBIDDEN";
    snprintf(msg, msglen, "%s needs the role %s; this certificate's role is "
             "%s", (unsigned)cmd < PROTO_CMD_COUNT ? proto_cmd_name(cmd) :
             "this command", need, peer_role_name(role));
    return -1;
}

json_t *
dispatch_names(void)
{
    json_t *names = json_array();

    for (int i = 0; i < PROTO_CMD_COUNT; i++)
        json_array_append_new(names, json_string(proto_cmd_name(i)));
    return names;
}

json_t *
dispatch_run(struct agent *a, const struct proto_request *req,
             const char **code, char *msg, size_t msglen,
             json_t **err_result)
{
    json_t *r = NULL;

    *err_result = NULL;
    if ((unsigned)req->cmd >= PROTO_CMD_COUNT || !table[req->cmd].handler) {
        *code = "UNKNOWN_COMMAND";
        snprintf(msg, msglen, "unknown command");
        return NULL;
    }
    r = table[req->cmd].handler(a, req->args, code, msg, msglen, err_result);
    if (!r && !*code) {
        *code = "INTERNAL";
        snprintf(msg, msglen, "handler returned nothing");
    }
    return r;
}
