/*
 * resume.h - continue a run after a failover: find this writer's records
 * on its disks and say where the run goes on.
 *
 * A VM that fails over boots at DR from a crash-consistent copy of its
 * disks: they hold records 1..p of the run, each once.  `--resume` makes
 * the writer at DR (and after a failback, at the primary again) continue
 * that run instead of starting a new one over it: same run id, the next
 * sequence numbers, each disk's next free slot.  The checker then sees one
 * run whose records are 1..p' for a larger p' (docs/writer.md, "Resuming").
 *
 * The writer resumes only from what the checker would pass.  Its own
 * records, read in the order it wrote them (its k-th record on disk
 * k mod n, slot k div n), must be k = 0..m-1 with nothing after them,
 * every one valid, of one run, labelled with this VM, the disk and the
 * slot, and with rising sequence numbers.  A single writer's records must
 * be exactly 1..m; a ring's writers check together that their records add
 * up to 1..p (ring census, ring.h).  Anything else (a torn or foreign
 * record, a hole, a record of another run) is refused with the slot named:
 * writing on would overwrite the evidence of an inconsistent copy.
 *
 * Disks with no record at all resume nothing: the run starts afresh.
 */
#ifndef CP_WRITER_RESUME_H
#define CP_WRITER_RESUME_H

#include <stddef.h>
#include <stdint.h>

#include "disks.h"

struct resume_state {
    uint64_t run;       /* the run found; 0: no record at all */
    uint64_t records;   /* this writer's records: its k = 0..records-1 */
    uint64_t last_seq;  /* the highest of their sequence numbers */
};

/*
 * Read d's disks (d->slots slots of each, by path) and fill *st.  vm is the
 * writer's VM index.  Returns 0, or -1 with err naming the disk, the slot
 * and what is wrong.
 */
int resume_scan(const struct disks *d, uint32_t vm, struct resume_state *st,
                char *err, size_t errlen);

/* Single-VM mode: the records must be exactly 1..records.  0 / -1. */
int resume_check_single(const struct resume_state *st,
                        char *err, size_t errlen);

#endif
