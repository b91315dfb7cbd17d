/* authz: see authz.h. */
#include "authz.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "dispatch.h"
#include "log.h"
#include "peer.h"

static volatile sig_atomic_t reload_flag;

static void
on_sighup(int sig)
{
    (void)sig;
    reload_flag = 1;
}

int
authz_start(struct authz *z, const char *path, char *err, size_t errlen)
{
    struct sigaction hup;

    memset(z, 0, sizeof(*z));
    z->path = path;
    if (revoke_load(path, &z->revoked, err, errlen) < 0)
        return -1;
    memset(&hup, 0, sizeof(hup));
    hup.sa_handler = on_sighup;
    sigemptyset(&hup.sa_mask);
    sigaction(SIGHUP, &hup, NULL);
    return 0;
}

void
authz_poll(struct authz *z)
{
    char err[512];
    size_t before = z->revoked.n;

    if (!reload_flag)
        return;
    reload_flag = 0;
    if (revoke_load(z->path, &z->revoked, err, sizeof(err)) < 0) {
        log_warnx("event=revoked_reload result=failed kept=%zu msg=\"%s\"",
                  before, err);
        return;
    }
    log_info("event=revoked_reload result=ok revoked=%zu", z->revoked.n);
}

void
authz_stop(struct authz *z)
{
    revoke_clear(&z->revoked);
}

int
authz_identify(struct authz *z, SSL *ssl, struct authz_peer *p,
               uint64_t conn, const char *addr)
{
    X509 *cert = SSL_get1_peer_certificate(ssl);

    memset(p, 0, sizeof(*p));
    snprintf(p->cn, sizeof(p->cn), "?");
    if (cert) {
        X509_NAME_get_text_by_NID(X509_get_subject_name(cert),
                                  NID_commonName, p->cn, sizeof(p->cn));
        p->role = peer_role(cert);
        if (peer_serial(cert, p->serial, sizeof(p->serial)) < 0)
            p->serial[0] = '\0';
        X509_free(cert);
    }
    if (p->serial[0] && !revoke_has(&z->revoked, p->serial))
        return 0;
    log_warnx("event=tls_refused conn=%llu peer=%s cn=%s role=%s serial=%s "
              "why=revoked", (unsigned long long)conn, addr, p->cn,
              peer_role_name(p->role), p->serial);
    return -1;
}

int
authz_request(const struct authz *z, const struct authz_peer *p,
              enum proto_cmd cmd, uint64_t conn, const char *addr,
              const char **code, char *msg, size_t msglen)
{
    if (revoke_has(&z->revoked, p->serial)) {
        log_warnx("event=forbidden conn=%llu peer=%s cn=%s role=%s cmd=%s "
                  "why=revoked serial=%s", (unsigned long long)conn, addr,
                  p->cn, peer_role_name(p->role), proto_cmd_name(cmd),
                  p->serial);
        *code = "FORBIDDEN";
        snprintf(msg, msglen, "this certificate (serial %s) is revoked",
                 p->serial);
        return -1;
    }
    if (dispatch_allows(cmd, p->role, code, msg, msglen) < 0) {
        log_warnx("event=forbidden conn=%llu peer=%s cn=%s role=%s cmd=%s "
                  "why=role", (unsigned long long)conn, addr, p->cn,
                  peer_role_name(p->role), proto_cmd_name(cmd));
        return -1;
    }
    return 0;
}
