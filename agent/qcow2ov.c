/* qcow2ov: see qcow2ov.h. */
#include "qcow2ov.h"

#include <stdio.h>
#include <string.h>

#define QCOW2_MAGIC 0x514649fbu
#define QCOW2_HEADER_LEN 104
/* QEMU's own bound on an L1 table (block/qcow2.h QCOW_MAX_L1_SIZE). */
#define QCOW2_MAX_L1_BYTES (32u << 20)
#define L1E_OFFSET_MASK 0x00fffffffffffe00ull
/* The L1 table is read this many bytes at a time. */
#define CHUNK 4096

static uint32_t
be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
           (uint32_t)p[2] << 8 | p[3];
}

static uint64_t
be64(const unsigned char *p)
{
    return (uint64_t)be32(p) << 32 | be32(p + 4);
}

int
qcow2ov_written(qcow2ov_read_fn rd, void *ctx, uint64_t image_size,
                int *written, char *err, size_t errlen)
{
    unsigned char h[QCOW2_HEADER_LEN], buf[CHUNK];
    uint32_t version, cluster_bits, l1_size;
    uint64_t l1_off, l1_bytes;

    *written = 0;
    if (image_size < QCOW2_HEADER_LEN) {
        /* too short to have been formatted: holds nothing */
        return 0;
    }
    if (rd(ctx, 0, sizeof(h), h, err, errlen) < 0)
        return -1;
    if (be32(h) != QCOW2_MAGIC) {
        for (size_t i = 0; i < sizeof(h); i++)
            if (h[i]) {
                snprintf(err, errlen, "not a qcow2 image (magic %08x)",
                         be32(h));
                return -1;
            }
        return 0;       /* never formatted */
    }
    version = be32(h + 4);
    cluster_bits = be32(h + 20);
    l1_size = be32(h + 36);
    l1_off = be64(h + 40);
    if (version < 2 || version > 3 || cluster_bits < 9 ||
        cluster_bits > 21 || be32(h + 32) != 0) {
        snprintf(err, errlen, "qcow2 header not one QEMU made for an "
                 "overlay (version %u, cluster_bits %u, crypt %u)", version,
                 cluster_bits, be32(h + 32));
        return -1;
    }
    l1_bytes = (uint64_t)l1_size * 8;
    if (l1_bytes > QCOW2_MAX_L1_BYTES ||
        (l1_size && (l1_off & ((1ull << cluster_bits) - 1))) ||
        (l1_size && (l1_off > image_size || l1_bytes > image_size - l1_off))) {
        snprintf(err, errlen, "qcow2 L1 table (%u entries at %llu) is not "
                 "inside the image (%llu bytes)", l1_size,
                 (unsigned long long)l1_off, (unsigned long long)image_size);
        return -1;
    }
    for (uint64_t at = 0; at < l1_bytes; at += CHUNK) {
        size_t n = l1_bytes - at < CHUNK ? (size_t)(l1_bytes - at) : CHUNK;

        if (rd(ctx, l1_off + at, n, buf, err, errlen) < 0)
            return -1;
        for (size_t i = 0; i + 8 <= n; i += 8)
            if (be64(buf + i) & L1E_OFFSET_MASK) {
                *written = 1;
                return 0;
            }
    }
    return 0;
}
