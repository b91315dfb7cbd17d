/* record.c - encode and decode the writer's 512-byte records. */
#include "record.h"

#include <string.h>
#include <zlib.h>

static void put_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_le32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

uint32_t record_crc32(const unsigned char *buf, unsigned int len)
{
    return (uint32_t)crc32(crc32(0L, Z_NULL, 0), buf, len);
}

void record_encode(const struct record *rec, unsigned char *buf)
{
    memset(buf, 0, RECORD_SIZE);
    memcpy(buf, RECORD_MAGIC, 4);
    put_le32(buf + 4, rec->epoch);
    put_le64(buf + 8, rec->seq);
    put_le32(buf + 16, rec->vm);
    put_le32(buf + 20, rec->disk);
    put_le64(buf + 24, rec->run);
    put_le32(buf + RECORD_CRC_OFFSET, record_crc32(buf, RECORD_CRC_OFFSET));
}

int record_decode(const unsigned char *buf, struct record *rec)
{
    if (memcmp(buf, RECORD_MAGIC, 4) != 0)
        return -1;
    if (get_le32(buf + RECORD_CRC_OFFSET) !=
        record_crc32(buf, RECORD_CRC_OFFSET))
        return -1;
    rec->epoch = get_le32(buf + 4);
    rec->seq = get_le64(buf + 8);
    rec->vm = get_le32(buf + 16);
    rec->disk = get_le32(buf + 20);
    rec->run = get_le64(buf + 24);
    return 0;
}
