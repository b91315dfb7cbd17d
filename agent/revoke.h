/*
 * revoke: the deny-list of certificate serials ([tls] revoked, agent-protocol
 * §1.6).  One serial per line in hex (as `openssl x509 -serial` prints it,
 * with or without "serial="), optionally followed by blanks and a note (the
 * host's name, the date); '#' starts a comment line.  The server loads it at
 * start and again on SIGHUP, and refuses a listed certificate at the
 * handshake and at every request (a connection opened before the reload
 * is cut off at its next request).
 */
#ifndef CP_REVOKE_H
#define CP_REVOKE_H

#include <stddef.h>

/* Serials are at most 20 bytes (RFC 5280 §4.1.2.2): 40 hex digits. */
#define REVOKE_SERIAL_MAX 41

struct revoke_list {
    char (*serials)[REVOKE_SERIAL_MAX];
    size_t n;
};

/* Loads path into *out (empty list for path ""); 0, or -1 with err naming
 * the file and line (then *out is untouched). */
int revoke_load(const char *path, struct revoke_list *out, char *err,
                size_t errlen);
/* 1 if serial (peer_serial's form) is listed. */
int revoke_has(const struct revoke_list *l, const char *serial);
void revoke_clear(struct revoke_list *l);

#endif
