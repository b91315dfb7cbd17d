/*
 * cmd_snap: the member-snapshot commands (agent-protocol §4.7, §4.8):
 * snapshot.list and snapshot.delete of one disk, through the backend that
 * holds the disk (snap_disk_backend), and the single delete that abort
 * uses too.
 */
#include "cmd.h"

#include <stdio.h>
#include <string.h>

#include "log.h"

/* The reply code of a backend error (agent-protocol §3.3). */
static const char *
snap_err_code(const struct snap_err *e)
{
    return e->kind == SNAP_E_STORAGE ? "SNAPSHOT_FAILED" :
        e->kind == SNAP_E_TIMEOUT ? "QMP_TIMEOUT" : "QMP_ERROR";
}

int
cmd_snap_delete_one(struct agent *a, struct vm *v, int d, const char *name,
                    char *err, size_t errlen)
{
    struct snap_disk sd;
    struct snap_err se = {0};
    int rc;

    vm_snap_disk(v, d, &sd);
    rc = snap_disk_backend(&sd)->remove(&sd, name, a->cfg.qmp_timeout_ms,
                                        &se);
    if (rc == SNAP_ENOENT)
        return 0;
    if (rc == 0)
        return 1;
    snprintf(err, errlen, "%s", se.msg);
    return -1;
}

int
cmd_snap_delete_owned(struct agent *a, struct vm *v, int d, const char *name,
                      const char *txn, int ours, json_t *jid, char *err,
                      size_t errlen)
{
    struct rbdsnap_image *img = v->img[d];
    char owner[160] = "";
    uint64_t id;
    int rc;

    if (!img || (ours && !json_is_integer(jid)))
        return cmd_snap_delete_one(a, v, d, name, err, errlen);
    if (json_is_integer(jid)) {
        id = (uint64_t)json_integer_value(jid);
    } else {
        rc = rbdsnap_snap_id(img, name, &id, err, errlen);
        if (rc == RBDSNAP_ENOENT)
            return 0;
        if (rc < 0)
            return -1;
        rc = rbdsnap_owner(img, id, owner, sizeof(owner), err, errlen);
        if (rc == -1)
            return -1;
        if (rc == RBDSNAP_ENOENT || strcmp(owner, txn) != 0) {
            snprintf(err, errlen, "not deleted: snapshot %s (id %llu) was "
                     "not created by txn %s (owner: %s)", name,
                     (unsigned long long)id, txn,
                     rc == RBDSNAP_ENOENT ? "none recorded" : owner);
            log_warnx("event=abort_spared disk=%s/%s name=%s snap_id=%llu "
                      "owner=%s", v->cfg->name, v->cfg->disks[d].node, name,
                      (unsigned long long)id, owner[0] ? owner : "-");
            return -1;
        }
    }
    rc = rbdsnap_remove_id(img, id, err, errlen);
    if (rc == RBDSNAP_ENOENT)
        return 0;
    return rc < 0 ? -1 : 1;
}

json_t *
cmd_snap_list(struct agent *a, json_t *args, const char **code, char *msg,
              size_t msglen, json_t **err_result)
{
    const char *disk = json_string_value(json_object_get(args, "disk"));
    json_t *list = NULL;
    struct snap_disk sd;
    struct snap_err se = {0};
    struct vm *v;
    int d;

    (void)err_result;
    if (agent_find_disk(a, disk, &v, &d) < 0)
        FAIL("UNKNOWN_DISK", "unknown disk %s", disk);
    vm_snap_disk(v, d, &sd);
    if (snap_disk_backend(&sd)->list(&sd, a->cfg.qmp_timeout_ms, &list,
                                     &se) < 0)
        FAIL(snap_err_code(&se), "%s", se.msg);
    return json_pack("{s:s,s:o}", "disk", disk, "snapshots", list);
cleanup:
    return NULL;
}

/*
 * Deletes snap id of an RBD disk only while it is still snapshot name and,
 * with owner, its owner key names owner: what the sweeper of orphans saw
 * in snapshot.list is what goes, never a snapshot made since under the
 * same name.  1 deleted, 0 absent, -1 refused or failed (err says which).
 */
static int
snap_delete_id(struct vm *v, int d, const char *name, uint64_t id,
               const char *owner, int *refused, char *err, size_t errlen)
{
    struct rbdsnap_image *img = v->img[d];
    char have[160] = "";
    uint64_t now;
    int rc;

    *refused = 1;
    if (!img) {
        snprintf(err, errlen, "id: disk %s/%s is not an rbd image",
                 v->cfg->name, v->cfg->disks[d].node);
        return -1;
    }
    *refused = 0;
    rc = rbdsnap_snap_id(img, name, &now, err, errlen);
    if (rc == RBDSNAP_ENOENT)
        return 0;
    if (rc < 0)
        return -1;
    *refused = 1;
    if (now != id) {
        snprintf(err, errlen, "not deleted: snapshot %s is id %llu now, not "
                 "%llu", name, (unsigned long long)now,
                 (unsigned long long)id);
        return -1;
    }
    if (owner) {
        rc = rbdsnap_owner(img, id, have, sizeof(have), err, errlen);
        if (rc == -1) {
            *refused = 0;
            return -1;
        }
        if (rc == RBDSNAP_ENOENT || strcmp(have, owner) != 0) {
            snprintf(err, errlen, "not deleted: snapshot %s (id %llu) is not "
                     "owned by txn %s (owner: %s)", name,
                     (unsigned long long)id, owner,
                     rc == RBDSNAP_ENOENT ? "none recorded" : have);
            return -1;
        }
    }
    *refused = 0;
    rc = rbdsnap_remove_id(img, id, err, errlen);
    if (rc == RBDSNAP_ENOENT)
        return 0;
    return rc < 0 ? -1 : 1;
}

json_t *
cmd_snap_delete(struct agent *a, json_t *args, const char **code, char *msg,
                size_t msglen, json_t **err_result)
{
    const char *disk = json_string_value(json_object_get(args, "disk"));
    const char *name = json_string_value(json_object_get(args, "name"));
    const char *owner = json_string_value(json_object_get(args, "owner"));
    json_t *jid = json_object_get(args, "id");
    struct vm *v;
    int d, rc, refused = 0;
    char err[512];

    (void)err_result;
    if (agent_find_disk(a, disk, &v, &d) < 0)
        FAIL("UNKNOWN_DISK", "unknown disk %s", disk);
    if (owner && !json_is_integer(jid))
        FAIL("BAD_REQUEST", "args.owner needs args.id");
    if (json_is_integer(jid))
        rc = snap_delete_id(v, d, name, (uint64_t)json_integer_value(jid),
                            owner, &refused, err, sizeof(err));
    else
        rc = cmd_snap_delete_one(a, v, d, name, err, sizeof(err));
    if (rc < 0 && refused) {
        log_warnx("event=snapshot_delete_refused disk=%s name=%s msg=\"%s\"",
                  disk, name, err);
        FAIL("NOT_OWNED", "%s", err);
    }
    if (rc < 0)
        FAIL("SNAPSHOT_FAILED", "%s", err);
    log_info("event=snapshot_delete disk=%s name=%s id=%lld owner=%s "
             "deleted=%d", disk, name, json_is_integer(jid) ?
             (long long)json_integer_value(jid) : -1LL, owner ? owner : "-",
             rc);
    return json_pack("{s:s,s:s,s:b}", "disk", disk, "name", name, "deleted",
                     rc == 1);
cleanup:
    return NULL;
}
