/* defsig: see defsig.h. */
#include "defsig.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#define SIG_BYTES 64
#define SIG_B64_CHARS 88        /* base64 of 64 bytes, "==" padded */

static EVP_PKEY *
load_key(const char *path, char *why, size_t whylen)
{
    FILE *f = fopen(path, "r");
    EVP_PKEY *k;

    if (!f) {
        snprintf(why, whylen, "definition_key %s: %s", path,
                 strerror(errno));
        return NULL;
    }
    k = PEM_read_PUBKEY(f, NULL, NULL, NULL);
    fclose(f);
    if (!k) {
        snprintf(why, whylen, "definition_key %s: not a PEM public key",
                 path);
        return NULL;
    }
    if (EVP_PKEY_id(k) != EVP_PKEY_ED25519) {
        snprintf(why, whylen, "definition_key %s: not an Ed25519 key", path);
        EVP_PKEY_free(k);
        return NULL;
    }
    return k;
}

/* The 64 signature bytes of sig_b64; -1 when it is anything else. */
static int
decode_sig(const char *sig_b64, unsigned char out[SIG_BYTES])
{
    unsigned char buf[SIG_B64_CHARS];

    if (!sig_b64 || strlen(sig_b64) != SIG_B64_CHARS ||
        strcmp(sig_b64 + SIG_B64_CHARS - 2, "==") != 0 ||
        strchr(sig_b64, '=') != sig_b64 + SIG_B64_CHARS - 2)
        return -1;
    /* EVP_DecodeBlock counts the padding as bytes: 66 for 64. */
    if (EVP_DecodeBlock(buf, (const unsigned char *)sig_b64,
                        SIG_B64_CHARS) != SIG_BYTES + 2)
        return -1;
    memcpy(out, buf, SIG_BYTES);
    return 0;
}

int
defsig_verify(const char *keypath, const char *vm, const char *xml,
              size_t len, const char *sig_b64, char *why, size_t whylen)
{
    size_t clen = sizeof(DEFSIG_CONTEXT), vlen = strlen(vm) + 1;
    unsigned char sig[SIG_BYTES], *msg = NULL;
    EVP_MD_CTX *ctx = NULL;
    EVP_PKEY *key = NULL;
    int rc = -1;

    if (!keypath || !keypath[0]) {
        snprintf(why, whylen, "no definition-signing key is configured "
                 "([libvirt] definition_key)");
        return -1;
    }
    if (decode_sig(sig_b64, sig) < 0) {
        snprintf(why, whylen, "the signature is not base64 of 64 bytes");
        return -1;
    }
    if (!(key = load_key(keypath, why, whylen)))
        return -1;
    if (!(msg = malloc(clen + vlen + len)) || !(ctx = EVP_MD_CTX_new())) {
        snprintf(why, whylen, "out of memory");
        goto cleanup;
    }
    /* sizeof counts the context's NUL, strlen + 1 the name's. */
    memcpy(msg, DEFSIG_CONTEXT, clen);
    memcpy(msg + clen, vm, vlen);
    memcpy(msg + clen + vlen, xml, len);
    if (EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, key) != 1 ||
        EVP_DigestVerify(ctx, sig, SIG_BYTES, msg, clen + vlen + len) != 1) {
        snprintf(why, whylen, "the signature does not verify with "
                 "definition_key %s for vm %s", keypath, vm);
        goto cleanup;
    }
    rc = 0;
cleanup:
    EVP_MD_CTX_free(ctx);
    EVP_PKEY_free(key);
    free(msg);
    return rc;
}
