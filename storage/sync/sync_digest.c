#include "sync_digest.h"

#include <openssl/evp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct sync_hash {
    EVP_MD_CTX *ctx;
};

int
sync_digest_buf(const void *buf, size_t len,
                unsigned char out[SYNC_DIGEST_LEN])
{
    unsigned int n = 0;

    if (EVP_Digest(buf, len, out, &n, EVP_sha256(), NULL) != 1 ||
        n != SYNC_DIGEST_LEN)
        return -1;
    return 0;
}

struct sync_hash *
sync_hash_new(void)
{
    struct sync_hash *h = calloc(1, sizeof(*h));

    if (h == NULL)
        return NULL;
    h->ctx = EVP_MD_CTX_new();
    if (h->ctx == NULL || EVP_DigestInit_ex(h->ctx, EVP_sha256(), NULL) != 1) {
        sync_hash_free(h);
        return NULL;
    }
    return h;
}

int
sync_hash_update(struct sync_hash *h, const void *buf, size_t len)
{
    return EVP_DigestUpdate(h->ctx, buf, len) == 1 ? 0 : -1;
}

int
sync_hash_final(struct sync_hash *h, unsigned char out[SYNC_DIGEST_LEN])
{
    unsigned int n = 0;

    if (EVP_DigestFinal_ex(h->ctx, out, &n) != 1 || n != SYNC_DIGEST_LEN)
        return -1;
    return 0;
}

void
sync_hash_free(struct sync_hash *h)
{
    if (h == NULL)
        return;
    EVP_MD_CTX_free(h->ctx);
    free(h);
}

void
sync_digest_hex(const unsigned char d[SYNC_DIGEST_LEN],
                char out[SYNC_DIGEST_HEX])
{
    static const char hex[] = "0123456789abcdef";
    size_t i;

    for (i = 0; i < SYNC_DIGEST_LEN; i++) {
        out[2 * i] = hex[d[i] >> 4];
        out[2 * i + 1] = hex[d[i] & 0xf];
    }
    out[2 * SYNC_DIGEST_LEN] = '\0';
}

int
sync_buf_is_zero(const void *buf, size_t len)
{
    const unsigned char *p = buf;

    /* Check the first byte, then compare the buffer with itself shifted
     * by one: equal iff every byte equals its neighbour, i.e. all zero. */
    if (len == 0)
        return 1;
    if (p[0] != 0)
        return 0;
    return memcmp(p, p + 1, len - 1) == 0;
}

/* Reflected Castagnoli polynomial. */
#define CRC32C_POLY 0x82f63b78u

uint32_t
sync_crc32c_portable(uint32_t crc, const void *buf, size_t len)
{
    const unsigned char *p = buf;
    static uint32_t table[256];
    static int ready;
    size_t i;
    int k;

    /* Benign race: every thread computes the same table. */
    if (!ready) {
        for (i = 0; i < 256; i++) {
            uint32_t c = (uint32_t)i;

            for (k = 0; k < 8; k++)
                c = (c >> 1) ^ (CRC32C_POLY & (0u - (c & 1u)));
            table[i] = c;
        }
        ready = 1;
    }
    for (i = 0; i < len; i++)
        crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2")))
static uint32_t
crc32c_hw(uint32_t crc, const unsigned char *p, size_t len)
{
    uint64_t c = crc, w;

    while (len >= 8) {
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
        p += 8;
        len -= 8;
    }
    crc = (uint32_t)c;
    while (len > 0) {
        crc = __builtin_ia32_crc32qi(crc, *p++);
        len--;
    }
    return crc;
}
#endif

uint32_t
sync_crc32c(uint32_t crc, const void *buf, size_t len)
{
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2"))
        return crc32c_hw(crc, buf, len);
#endif
    return sync_crc32c_portable(crc, buf, len);
}
