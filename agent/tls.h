/*
 * tls: the agent's TLS 1.3 mutual-auth context (agent-protocol §1), built
 * from [tls] ca, cert and key: the certificates this agent presents, and
 * the CA every peer's certificate must chain to.  server.c accepts with
 * it; `cutpointd -n` checks it.
 */
#ifndef CP_TLS_H
#define CP_TLS_H

#include <stddef.h>
#include <openssl/ssl.h>

#include "config.h"

/* A new server context, or NULL with err. */
SSL_CTX *tls_ctx_new(const struct agent_config *cfg, char *err,
                     size_t errlen);
/* Builds the context once and frees it, and loads [tls] revoked: 0, or -1
 * with err. */
int tls_check(const struct agent_config *cfg, char *err, size_t errlen);
/* err = "what: <OpenSSL's first queued error>"; clears the queue. */
void tls_err(char *err, size_t errlen, const char *what);

#endif
