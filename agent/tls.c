/* tls: see tls.h. */
#include "tls.h"

#include <stdio.h>
#include <openssl/err.h>

#include "revoke.h"

void
tls_err(char *err, size_t errlen, const char *what)
{
    unsigned long e = ERR_get_error();
    char buf[256];

    ERR_error_string_n(e, buf, sizeof(buf));
    snprintf(err, errlen, "%s: %s", what, e ? buf : "failed");
    ERR_clear_error();
}

SSL_CTX *
tls_ctx_new(const struct agent_config *cfg, char *err, size_t errlen)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());

    if (!ctx) {
        tls_err(err, errlen, "SSL_CTX_new");
        return NULL;
    }
    /* TLS 1.3 only (agent-protocol §1.1). */
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION);
    SSL_CTX_set_num_tickets(ctx, 0);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE |
                     SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (SSL_CTX_use_certificate_chain_file(ctx, cfg->cert) != 1) {
        tls_err(err, errlen, cfg->cert);
        goto fail;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, cfg->key, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
        tls_err(err, errlen, cfg->key);
        goto fail;
    }
    if (SSL_CTX_load_verify_locations(ctx, cfg->ca, NULL) != 1) {
        tls_err(err, errlen, cfg->ca);
        goto fail;
    }
    /* Mutual auth: no client certificate, or one not chaining to our CA,
     * fails the handshake (agent-protocol §1.2). */
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                       NULL);
    return ctx;
fail:
    SSL_CTX_free(ctx);
    return NULL;
}

int
tls_check(const struct agent_config *cfg, char *err, size_t errlen)
{
    SSL_CTX *ctx = tls_ctx_new(cfg, err, errlen);
    struct revoke_list l = {0};

    if (!ctx)
        return -1;
    SSL_CTX_free(ctx);
    /* A deny-list that does not load would keep the agent from starting:
     * say so at -n, not at the restart. */
    if (revoke_load(cfg->revoked, &l, err, errlen) < 0)
        return -1;
    revoke_clear(&l);
    return 0;
}
