/*
 * authz: what the peer of a connection may do (agent-protocol §1.5, §1.6).
 * After the handshake, authz_identify reads the peer's role, CN and serial
 * from its verified certificate (peer.h) and refuses a revoked one; before
 * each request runs, authz_request refuses a certificate revoked since
 * then, or a role the command's row of commands.def does not allow
 * (dispatch_allows).  Both log the refusal with the role and the command.
 * The deny-list (revoke.h) is loaded by authz_start and reloaded by
 * authz_poll after a SIGHUP.  The server's loop thread owns all of it.
 */
#ifndef CP_AUTHZ_H
#define CP_AUTHZ_H

#include <stddef.h>
#include <stdint.h>
#include <openssl/ssl.h>

#include "proto.h"
#include "revoke.h"

struct authz {
    const char *path;           /* [tls] revoked, "" none */
    struct revoke_list revoked;
};

/* Who is at the other end, from its certificate. */
struct authz_peer {
    unsigned role;              /* PEER_ROLE_* */
    char cn[128];
    char serial[REVOKE_SERIAL_MAX];
};

/* Loads the deny-list at path and installs the SIGHUP handler; 0, or -1
 * with err. */
int authz_start(struct authz *z, const char *path, char *err, size_t errlen);
/* Reloads the deny-list if a SIGHUP came since the last call; a list that
 * does not load leaves the previous one in force (logged). */
void authz_poll(struct authz *z);
void authz_stop(struct authz *z);

/* Fills *p from ssl's peer certificate; 0, or -1 when the certificate is
 * revoked (or its serial unreadable): the caller closes the connection. */
int authz_identify(struct authz *z, SSL *ssl, struct authz_peer *p,
                   uint64_t conn, const char *addr);
/* 0 if p may run cmd now; otherwise -1 with *code FORBIDDEN and msg. */
int authz_request(const struct authz *z, const struct authz_peer *p,
                  enum proto_cmd cmd, uint64_t conn, const char *addr,
                  const char **code, char *msg, size_t msglen);

#endif
