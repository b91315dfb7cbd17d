/*
 * disks.h - the writer's disks: raw block devices in a guest, regular files
 * on the host.  Every write is O_DIRECT|O_DSYNC and returns only when the
 * record is on stable storage, so the next write (or the token that lets
 * another VM write) depends on this one (GCVM §4.3, dependent writes).
 */
#ifndef CP_WRITER_DISKS_H
#define CP_WRITER_DISKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "record.h"

struct disks {
    int fd[CONFIG_MAX_DISKS];
    bool direct[CONFIG_MAX_DISKS];
    char path[CONFIG_MAX_DISKS][CONFIG_PATH_MAX];
    int n;
    uint64_t slots;         /* records that fit on the smallest disk */
    unsigned char *buf;     /* RECORD_SIZE bytes, 4096-aligned for O_DIRECT */
};

/* Open cfg's disks.  Returns 0, or -1 with err set (nothing left open). */
int disks_open(struct disks *d, const struct config *cfg,
               char *err, size_t errlen);

/* Write rec to slot of disk i; returns when it is durable.  0 / -1. */
int disks_write(struct disks *d, int i, uint64_t slot,
                const struct record *rec, char *err, size_t errlen);

/* Overwrite every slot of every disk with zeros.  0 / -1. */
int disks_zero(struct disks *d, char *err, size_t errlen);

/* Close everything; safe on a zeroed or already closed struct. */
void disks_close(struct disks *d);

#endif
