/*
 * peer: who is at the other end of a TLS connection, read from its verified
 * certificate after the handshake (agent-protocol §1.5):
 *
 *   - its role, a SAN URI spiffe://cutpoint/<role> with <role> one of
 *     coordinator, agent, operator.  A certificate with none of them, or
 *     with more than one, has no role and may run nothing.
 *   - its serial, as upper-case hex without leading zeros, the form the
 *     deny-list (revoke.h) holds.
 */
#ifndef CP_PEER_H
#define CP_PEER_H

#include <stddef.h>
#include <openssl/x509.h>

/* The roles, as bits so that a command's allowed roles are a set. */
#define PEER_ROLE_NONE 0u
#define PEER_ROLE_COORDINATOR 0x1u
#define PEER_ROLE_AGENT 0x2u
#define PEER_ROLE_OPERATOR 0x4u

/* The URI prefix of a role in a certificate's subjectAltName. */
#define PEER_ROLE_URI_PREFIX "spiffe://cutpoint/"

/* The role of cert (one PEER_ROLE_* bit), or PEER_ROLE_NONE. */
unsigned peer_role(X509 *cert);
/* "coordinator", "agent", "operator", or "none" for anything else. */
const char *peer_role_name(unsigned role);
/* The roles of a set, comma-separated ("coordinator,operator"), into buf. */
void peer_roles_text(unsigned roles, char *buf, size_t len);
/* cert's serial into buf (normalized hex); 0, or -1 if it does not fit. */
int peer_serial(X509 *cert, char *buf, size_t len);

#endif
