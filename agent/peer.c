/* peer: see peer.h. */
#include "peer.h"

#include <stdio.h>
#include <string.h>
#include <openssl/bn.h>
#include <openssl/x509v3.h>

static const struct {
    const char *name;
    unsigned bit;
} roles[] = {
    {"coordinator", PEER_ROLE_COORDINATOR},
    {"agent", PEER_ROLE_AGENT},
    {"operator", PEER_ROLE_OPERATOR},
};

#define NROLES (sizeof(roles) / sizeof(roles[0]))

unsigned
peer_role(X509 *cert)
{
    GENERAL_NAMES *sans;
    unsigned found = PEER_ROLE_NONE;
    int n, many = 0;

    if (!cert)
        return PEER_ROLE_NONE;
    sans = X509_get_ext_d2i(cert, NID_subject_alt_name, NULL, NULL);
    if (!sans)
        return PEER_ROLE_NONE;
    n = sk_GENERAL_NAME_num(sans);
    for (int i = 0; i < n; i++) {
        const GENERAL_NAME *g = sk_GENERAL_NAME_value(sans, i);
        const unsigned char *uri;
        size_t plen = strlen(PEER_ROLE_URI_PREFIX);
        int len;

        if (g->type != GEN_URI)
            continue;
        uri = ASN1_STRING_get0_data(g->d.uniformResourceIdentifier);
        len = ASN1_STRING_length(g->d.uniformResourceIdentifier);
        if (len <= (int)plen || memcmp(uri, PEER_ROLE_URI_PREFIX, plen))
            continue;
        for (size_t r = 0; r < NROLES; r++)
            if ((size_t)len - plen == strlen(roles[r].name) &&
                memcmp(uri + plen, roles[r].name, (size_t)len - plen) == 0) {
                if (found && found != roles[r].bit)
                    many = 1;
                found = roles[r].bit;
            }
    }
    GENERAL_NAMES_free(sans);
    /* Two roles in one certificate is an issuing mistake: trust neither. */
    return many ? PEER_ROLE_NONE : found;
}

const char *
peer_role_name(unsigned role)
{
    for (size_t r = 0; r < NROLES; r++)
        if (roles[r].bit == role)
            return roles[r].name;
    return "none";
}

void
peer_roles_text(unsigned set, char *buf, size_t len)
{
    size_t off = 0;

    if (len)
        buf[0] = '\0';
    for (size_t r = 0; r < NROLES; r++)
        if (set & roles[r].bit) {
            int n = snprintf(buf + off, len - off, "%s%s", off ? "," : "",
                             roles[r].name);
            if (n < 0 || (size_t)n >= len - off)
                return;
            off += (size_t)n;
        }
    if (!off)
        snprintf(buf, len, "none");
}

int
peer_serial(X509 *cert, char *buf, size_t len)
{
    BIGNUM *bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(cert), NULL);
    char *hex = bn ? BN_bn2hex(bn) : NULL;
    const char *h = hex;
    int ret = -1;

    if (h) {
        while (h[0] == '0' && h[1])
            h++;
        if (strlen(h) < len) {
            snprintf(buf, len, "%s", h);
            ret = 0;
        }
    }
    OPENSSL_free(hex);
    BN_free(bn);
    return ret;
}
