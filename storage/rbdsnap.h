/*
 * rbdsnap: RBD member snapshots through librbd, on images opened once at
 * agent start so that the pause window holds no cluster connect or image
 * open (design "Coordinator latency").
 *
 * QEMU owns the image's exclusive lock while the VM runs.  librbd then
 * forwards snapshot create/remove to the lock owner over the image's
 * watch/notify channel; the owner (QEMU's librbd, whose threads keep running
 * while the vCPUs are stopped) performs it.  We never break the lock.
 *
 * Functions return 0 on success, -1 on error with a message in err.
 * Handles are thread-safe: one VM's disks are snapshotted from parallel
 * threads.
 */
#ifndef CP_RBDSNAP_H
#define CP_RBDSNAP_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#define RBDSNAP_ENOENT (-2)   /* rbdsnap_remove: no such snapshot */
#define RBDSNAP_EEXIST (-3)   /* rbdsnap_create: the name exists already */

/*
 * Ownership of member snapshots: the image metadata key
 * "cutpoint.snap.<snap id>" holds the id of the transaction that created
 * snapshot <snap id> (decimal).  The agent sets it when its commit made
 * the snapshot, aborts delete by snap id only what their transaction's key
 * names, and the control plane's sweeper of orphans reads it.  A snapshot
 * without the key is not cutpoint's to delete.
 */
#define RBDSNAP_OWNER_PREFIX "cutpoint.snap."

struct rbdsnap_cluster;
struct rbdsnap_image;

int rbdsnap_connect(const char *conf, const char *id, const char *keyring,
                    struct rbdsnap_cluster **out, char *err, size_t errlen);
void rbdsnap_cluster_free(struct rbdsnap_cluster *c);

/* This client's address as the OSDs see it ("ip:port/nonce"). */
int rbdsnap_client_addr(struct rbdsnap_cluster *c, char *buf, size_t len,
                        char *err, size_t errlen);
/*
 * Blocklists a previous incarnation of this agent.  A killed agent's
 * watches on the image headers linger until the OSD watch timeout (30 s),
 * and every snapshot's header notify waits for them (up to the 5 s notify
 * timeout); fencing the dead client drops them at once.
 */
int rbdsnap_blocklist(struct rbdsnap_cluster *c, const char *addr,
                      unsigned expire_s, char *err, size_t errlen);

/*
 * The request timeouts, in seconds, that a Ceph client named client.<id>
 * (NULL: admin) gets from conf (NULL: librados's default search, whose
 * failure is ignored, as QEMU's rbd driver does without conf=), with the
 * key/value pairs kv[0], kv[1], ... kv[2*nkv-1] set on top (QEMU's legacy
 * "rbd:pool/image:key=value" names).  0 means none: such a request waits
 * for as long as Ceph does not answer.  Nothing is connected.
 */
int rbdsnap_client_timeouts(const char *conf, const char *id,
                            const char *const *kv, int nkv, int *osd_s,
                            int *mon_s, char *err, size_t errlen);

/* The image keeps a reference to the cluster; free images first. */
int rbdsnap_open(struct rbdsnap_cluster *c, const char *pool,
                 const char *image, struct rbdsnap_image **out,
                 char *err, size_t errlen);
void rbdsnap_image_free(struct rbdsnap_image *img);
/* The image's size in bytes when it was opened (0: unknown, or img NULL);
 * no call to Ceph, so an inventory never waits on the cluster. */
uint64_t rbdsnap_size(const struct rbdsnap_image *img);

/*
 * A probe of the storage behind img: a read of its first 512 bytes (the
 * OSD holding its first object), started here and awaited by a deadline.
 * QMP `stop` drains a VM's I/O before it returns, with the VM's vCPUs
 * already stopped and QEMU's main loop (which serves `cont`) waiting: a
 * read this client cannot get answered says that a drain there may wait
 * as long.  It covers one object's OSD, not every OSD the VM writes to.
 *
 * wait returns 0 (answered, success or error from Ceph: it answers), 1 (no
 * answer by deadline, a mono_ms time) or -1 (err set: could not start).
 * wait always consumes p; a read still in flight is freed by its own
 * completion later.
 */
struct rbdsnap_probe;
int rbdsnap_probe_start(struct rbdsnap_image *img, struct rbdsnap_probe **out,
                        char *err, size_t errlen);
int rbdsnap_probe_wait(struct rbdsnap_probe *p, double deadline);

/* Creates snapshot name; RBDSNAP_EEXIST when one of that name exists
 * already (not made by this call: never claimed as a member). */
int rbdsnap_create(struct rbdsnap_image *img, const char *name,
                   char *err, size_t errlen);
/*
 * *exists = 1 when the image header lists snapshot name (after a header
 * refresh if a notify told this handle it changed).  commit checks every
 * create with it: in the lab librbd returned 0 from rbd_snap_create2 for a
 * snapshot the lock owner (QEMU) refused under `rbd snap limit`, so a zero
 * return alone does not prove the snapshot exists.
 */
int rbdsnap_exists(struct rbdsnap_image *img, const char *name, int *exists,
                   char *err, size_t errlen);
/* Returns 0 when removed, RBDSNAP_ENOENT when absent, -1 on error. */
int rbdsnap_remove(struct rbdsnap_image *img, const char *name,
                   char *err, size_t errlen);
/* *id: the snap id of snapshot name; RBDSNAP_ENOENT when absent. */
int rbdsnap_snap_id(struct rbdsnap_image *img, const char *name,
                    uint64_t *id, char *err, size_t errlen);
/* Records txn as the owner of snap id (RBDSNAP_OWNER_PREFIX key). */
int rbdsnap_set_owner(struct rbdsnap_image *img, uint64_t id,
                      const char *txn, char *err, size_t errlen);
/* The owner txn of snap id into txn; RBDSNAP_ENOENT when none recorded. */
int rbdsnap_owner(struct rbdsnap_image *img, uint64_t id, char *txn,
                  size_t txnlen, char *err, size_t errlen);
/* Removes snap id and its owner key: 0, RBDSNAP_ENOENT (absent), -1. */
int rbdsnap_remove_id(struct rbdsnap_image *img, uint64_t id, char *err,
                      size_t errlen);
/*
 * *out: new JSON array of {"name", "id", "size", "created"?, "owner"?,
 * "owner_error"?}: created is the snapshot's creation time (Unix seconds,
 * librbd's snap timestamp), owner the txn of its RBDSNAP_OWNER_PREFIX key
 * (absent: none recorded), owner_error why that key could not be read.
 */
int rbdsnap_list(struct rbdsnap_image *img, json_t **out,
                 char *err, size_t errlen);

/*
 * Images next to img, in its pool (the redirect cut's overlays, agent
 * redirect.c): create one of size bytes (RBDSNAP_EEXIST when the name is
 * taken), remove one (RBDSNAP_ENOENT when absent).
 */
int rbdsnap_sibling_create(struct rbdsnap_image *img, const char *name,
                           uint64_t size, char *err, size_t errlen);
int rbdsnap_sibling_remove(struct rbdsnap_image *img, const char *name,
                           char *err, size_t errlen);

/*
 * The redirect cut's overlays whose QEMU is gone (agent redirect_gone.c),
 * reached by pool and name, with no handle on the disk they sit next to
 * (a stopped VM's disks are closed):
 * - rbdsnap_open_ro opens pool/image read-only: no exclusive lock is asked
 *   for, so it works at once after the lock's owner was killed
 *   (RBDSNAP_ENOENT when absent);
 * - rbdsnap_read reads len bytes at off (0 or -1; past the end: -1);
 * - rbdsnap_image_remove removes pool/name (RBDSNAP_ENOENT when absent; -1
 *   with "busy" in err while a client still watches it: a killed one for
 *   up to osd_client_watch_timeout, 30 s).
 */
int rbdsnap_open_ro(struct rbdsnap_cluster *c, const char *pool,
                    const char *image, struct rbdsnap_image **out,
                    char *err, size_t errlen);
int rbdsnap_read(struct rbdsnap_image *img, uint64_t off, size_t len,
                 void *buf, char *err, size_t errlen);
int rbdsnap_image_remove(struct rbdsnap_cluster *c, const char *pool,
                         const char *name, char *err, size_t errlen);

#endif
