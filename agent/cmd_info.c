/*
 * cmd_info: the informational commands (agent-protocol §4.1, §4.2, §4.10):
 * hello (version, drivers, commands, snapshot methods), inventory (each
 * VM's driver, state, method and disks, with a generation: inventory.c)
 * and stats (counters).
 */
#include "cmd.h"

#include "dispatch.h"
#include "inventory.h"
#include "mono.h"

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
    /* signed_definitions: vm.start takes a definition the control plane
     * signed (a failover's preflight asks before it stops anything). */
    return json_pack("{s:s,s:i,s:s,s:o,s:o,s:o,s:b}",
                     "version", CUTPOINT_VERSION, "protocol", 1,
                     "host", a->cfg.host, "drivers", drivers,
                     "capabilities", dispatch_names(),
                     "snapshot_methods", methods, "signed_definitions",
                     a->cfg.definition_key[0] && a->cfg.libvirt_uri[0]);
}

json_t *
cmd_inventory(struct agent *a, json_t *args, const char **code, char *msg,
              size_t msglen, json_t **err_result)
{
    (void)args, (void)code, (void)msg, (void)msglen, (void)err_result;
    return inventory_json(a);
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
