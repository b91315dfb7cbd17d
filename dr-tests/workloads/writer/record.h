/*
 * record.h - the writer's 512-byte on-disk record (GCVM Listing 4.1 plus a
 * checksum).  See README.md and docs/writer.md for the layout.
 *
 * All integers are little-endian whatever the host byte order, so a record
 * written in a guest can be checked by the host-side checker byte for byte.
 *
 *   offset size field
 *        0    4 magic   "CPWR"
 *        4    4 epoch   round number: this record's slot on its disk
 *        8    8 seq     global sequence number, from 1
 *       16    4 vm      writer's VM index (CP_VM)
 *       20    4 disk    0-based disk index within that VM
 *       24    8 run     run id, the same for every record of one run
 *       32  476 padding zeros
 *      508    4 crc32   zlib CRC-32 of bytes 0..507
 */
#ifndef CP_WRITER_RECORD_H
#define CP_WRITER_RECORD_H

#include <stdint.h>

#define RECORD_SIZE 512
#define RECORD_MAGIC "CPWR"
#define RECORD_CRC_OFFSET 508

struct record {
    uint32_t epoch;
    uint64_t seq;
    uint32_t vm;
    uint32_t disk;
    uint64_t run;
};

/* Fill buf (RECORD_SIZE bytes, caller-owned) with the encoded record. */
void record_encode(const struct record *rec, unsigned char *buf);

/*
 * Decode buf into *rec.  Returns 0 for a valid record, -1 if the magic is
 * missing or the checksum does not match (then *rec is unspecified).
 */
int record_decode(const unsigned char *buf, struct record *rec);

/* zlib CRC-32 of len bytes. */
uint32_t record_crc32(const unsigned char *buf, unsigned int len);

#endif
