/*
 * sync_digest: SHA-256 digests for per-extent checksums and full-image
 * hashes (OpenSSL EVP).  SHA-256 rather than a CRC because the full-image
 * hash is compared across sites as the proof that a DR snapshot is
 * byte-identical, and with SHA-NI it costs ~1.7 GB/s on one core here.
 */
#ifndef CUTPOINT_SYNC_DIGEST_H
#define CUTPOINT_SYNC_DIGEST_H

#include <stddef.h>
#include <stdint.h>

#define SYNC_DIGEST_LEN 32
#define SYNC_DIGEST_HEX (2 * SYNC_DIGEST_LEN + 1)

struct sync_hash;

/* One-shot digest of buf; 0 on success, -1 on an OpenSSL failure. */
int sync_digest_buf(const void *buf, size_t len,
                    unsigned char out[SYNC_DIGEST_LEN]);

/* Streaming hash; sync_hash_free(NULL) is a no-op. */
struct sync_hash *sync_hash_new(void);
int sync_hash_update(struct sync_hash *h, const void *buf, size_t len);
int sync_hash_final(struct sync_hash *h, unsigned char out[SYNC_DIGEST_LEN]);
void sync_hash_free(struct sync_hash *h);

/* Lower-case hex of a digest, NUL-terminated. */
void sync_digest_hex(const unsigned char d[SYNC_DIGEST_LEN],
                     char out[SYNC_DIGEST_HEX]);

/*
 * CRC-32C (Castagnoli) update in Ceph's convention: no pre- or
 * post-inversion, the caller passes the seed (Ceph uses 0xffffffff).
 * This is what an OSD computes for LIBRADOS_CHECKSUM_TYPE_CRC32C, so a
 * DR extent can be verified by asking its OSD for the CRC instead of
 * reading the data back.  Uses SSE4.2 when the CPU has it.
 */
uint32_t sync_crc32c(uint32_t crc, const void *buf, size_t len);

/* The table-driven fallback, always available (tested against the above). */
uint32_t sync_crc32c_portable(uint32_t crc, const void *buf, size_t len);

/* 1 if the len bytes at buf are all zero, else 0. */
int sync_buf_is_zero(const void *buf, size_t len);

#endif
