/*
 * lvdef: what a libvirt VM is, from the agent's config and from the
 * connection.  Part of the libvirt driver (vm_libvirt.c):
 *
 *   lvdef_config_check  a [vm] section of driver libvirt (vm_ops
 *                       config_check): the domain name, no qmp-driver
 *                       keys, no qmp-transaction without raw QMP, an
 *                       `xml =` file that parses and names the domain
 *   lvdef_discover      the domains the connection knows that no [vm]
 *                       names, as VMs (discover = yes), disks from their
 *                       XML
 *   lvdef_fill          the disks of a [vm] that names none: from its
 *                       domain's XML, or its `xml =` file
 *   lvdef_read          the `xml =` file, checked
 */
#ifndef CP_LVDEF_H
#define CP_LVDEF_H

#include <stddef.h>

#include "config.h"
#include "domxml.h"

int lvdef_config_check(const struct agent_config *cfg, struct cfg_vm *m,
                       const char *path, char *err, size_t errlen);
int lvdef_discover(void *conn, const struct agent_config *cfg,
                   struct cfg_vm *out, int max);
int lvdef_fill(void *conn, const struct agent_config *cfg, struct cfg_vm *m);
/* The definition file of m (at most 1 MiB) as a new string, checked: it
 * parses (into *dx) and names m's domain.  NULL with err otherwise. */
char *lvdef_read(const struct cfg_vm *m, struct domxml *dx, char *err,
                 size_t errlen);

#endif
