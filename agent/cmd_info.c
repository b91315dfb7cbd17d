/*
 * cmd_info: the informational commands (agent-protocol §4.1, §4.2, §4.10):
 * hello (version, drivers, commands, snapshot methods), inventory (each
 * VM's driver, state, method and disks) and stats (counters).
 */
#include "cmd.h"

#include "dispatch.h"
#include "mono.h"
#include "par.h"

#define INVENTORY_TIMEOUT_MS 500

json_t *
cmd_hello(struct agent *a, json_t *args, const char **code, char *msg,
          size_t msglen, json_t **err_result)
{
    json_t *methods = json_pack("[s]", snap_qmp_ops.name);
    json_t *drivers = json_array();
    const struct vm_ops *d;

    (void)args, (void)code, (void)msg, (void)msglen, (void)err_result;
    /* librbd snapshots need the [ceph] connection */
    if (a->ceph)
        json_array_insert_new(methods, 0, json_string(snap_rbd_ops.name));
    for (int i = 0; (d = vm_driver_at(i)); i++)
        json_array_append_new(drivers, json_string(d->name));
    return json_pack("{s:s,s:i,s:s,s:o,s:o,s:o}",
                     "version", CUTPOINT_VERSION, "protocol", 1,
                     "host", a->cfg.host, "drivers", drivers,
                     "capabilities", dispatch_names(),
                     "snapshot_methods", methods);
}

static json_t *
disk_json(const struct vm *v, int d)
{
    const struct cfg_disk *dk = &v->cfg->disks[d];
    json_t *o = json_pack("{s:s++,s:s,s:s}", "id", v->cfg->name, "/",
                          dk->node, "node", dk->node, "backend",
                          dk->backend == CFG_BACKEND_RBD ? "rbd" : "qcow2");

    if (dk->backend == CFG_BACKEND_RBD) {
        json_object_set_new(o, "pool", json_string(dk->pool));
        json_object_set_new(o, "image", json_string(dk->image));
    } else {
        json_object_set_new(o, "file", json_string(dk->file));
    }
    return o;
}

struct inv_job {
    struct vm *vm;
    const char *state;
};

static void *
inv_one(void *arg)
{
    struct inv_job *j = arg;

    j->state = vm_state(j->vm, INVENTORY_TIMEOUT_MS);
    return NULL;
}

json_t *
cmd_inventory(struct agent *a, json_t *args, const char **code, char *msg,
              size_t msglen, json_t **err_result)
{
    struct inv_job jobs[CFG_MAX_VMS];
    json_t *vms = json_array();

    (void)args, (void)code, (void)msg, (void)msglen, (void)err_result;
    for (int i = 0; i < a->nvms; i++)
        jobs[i] = (struct inv_job){.vm = &a->vms[i]};
    if (a->nvms)
        par_run(inv_one, jobs, sizeof(*jobs), a->nvms);
    for (int i = 0; i < a->nvms; i++) {
        struct vm *v = &a->vms[i];
        json_t *disks = json_array();
        for (int d = 0; d < v->cfg->ndisks; d++)
            json_array_append_new(disks, disk_json(v, d));
        json_array_append_new(vms, json_pack(
            "{s:s,s:s,s:s,s:s,s:o}", "name", v->cfg->name, "driver",
            v->ops->name, "state", jobs[i].state, "method", v->snap->name,
            "disks", disks));
    }
    return json_pack("{s:o}", "vms", vms);
}

json_t *
cmd_stats(struct agent *a, json_t *args, const char **code, char *msg,
          size_t msglen, json_t **err_result)
{
    (void)args, (void)code, (void)msg, (void)msglen, (void)err_result;
    return json_pack("{s:f,s:I,s:I,s:I,s:{s:I,s:I,s:I,s:I},s:I,s:I,s:I}",
                     "uptime_ms", mono_ms() - a->started_ms,
                     "connections", (json_int_t)atomic_load(&a->connections),
                     "requests", (json_int_t)atomic_load(&a->requests),
                     "errors", (json_int_t)atomic_load(&a->errors),
                     "txns",
                     "prepared", (json_int_t)atomic_load(&a->n_prepared),
                     "committed", (json_int_t)atomic_load(&a->n_committed),
                     "aborted", (json_int_t)atomic_load(&a->n_aborted),
                     "expired", (json_int_t)atomic_load(&a->n_expired),
                     "resumed_by_lease",
                     (json_int_t)atomic_load(&a->resumed_by_lease),
                     "resumed_by_journal",
                     (json_int_t)atomic_load(&a->resumed_by_journal),
                     "thaw_failed",
                     (json_int_t)atomic_load(&a->n_thaw_failed));
}
