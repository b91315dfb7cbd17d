/*
 * domxml: what the agent reads from a libvirt domain XML (the live XML of
 * virDomainGetXMLDesc, or a definition file of the config's `xml =`):
 * the domain's name and UUID, its disks, and whether it has a guest agent
 * channel.  Part of the libvirt driver (vm_libvirt.c); pure parsing, no
 * libvirt call, fuzzable.
 *
 * A disk is named by its target device (`vda`), which the guest sees and
 * libvirt keeps across restarts and migrations, and described by its
 * source:
 *   <disk type='network' device='disk'>
 *     <source protocol='rbd' name='POOL/IMAGE' index='N'>   -> rbd
 *   <disk type='file' device='disk'>
 *     <driver name='qemu' type='qcow2'/>
 *     <source file='/abs/path' index='N'/>                  -> qcow2
 * Other disks of device 'disk' (block devices, raw files, storage-pool
 * volumes, other network protocols, RBD namespaces) cannot be snapshotted
 * by cutpoint; they are listed in `unsupported` with the reason, so that
 * nobody mistakes a partly covered VM for a covered one.  CD-ROMs, floppies
 * and LUNs are not disks of the VM's data and are ignored.
 *
 * A domain the operator hands to cutpoint carries, in its <metadata>, an
 * element `managed` of the namespace DOMXML_CUTPOINT_NS, whatever its
 * prefix ([libvirt] manage_metadata = yes discovers only those):
 *   <metadata>
 *     <cutpoint:managed xmlns:cutpoint="https://cutpoint.dev/xmlns/agent/1"/>
 *   </metadata>
 * (`virsh metadata DOMAIN https://cutpoint.dev/xmlns/agent/1 --key cutpoint
 *  --set '<managed/>'` adds it to a defined domain.)
 */
#ifndef CP_DOMXML_H
#define CP_DOMXML_H

#include <stddef.h>

#include "config.h"

#define DOMXML_MAX_UNSUPPORTED 8
#define DOMXML_CUTPOINT_NS "https://cutpoint.dev/xmlns/agent/1"

struct domxml_unsupported {
    char target[64];
    char why[96];
};

struct domxml {
    char name[256];
    char uuid[40];                      /* "" if the XML has none */
    struct cfg_disk disks[CFG_MAX_DISKS];   /* node = target dev */
    int index[CFG_MAX_DISKS];           /* <source index=N>, -1 if absent:
                                           libvirt's block node is
                                           libvirt-N-format */
    int ndisks;
    struct domxml_unsupported unsupported[DOMXML_MAX_UNSUPPORTED];
    int nunsupported;
    int guest_agent;                    /* has org.qemu.guest_agent.0 */
    int managed;                        /* <metadata> has cutpoint's
                                           <managed/> */
};

/*
 * Parses len bytes of xml into *out.  -1 with err set when it is not a
 * domain XML (no <domain>, no <name>), a name or path is too long, or the
 * domain has more than CFG_MAX_DISKS supported disks.
 */
int domxml_parse(const char *xml, size_t len, struct domxml *out, char *err,
                 size_t errlen);

/*
 * xml (a domain XML without <uuid>) with <uuid>uuid</uuid> added, as a new
 * string (free() it): a definition file that names no UUID redefines an
 * existing domain of its name only with that domain's UUID (libvirt
 * refuses another).  NULL with err when xml does not parse.
 */
char *domxml_with_uuid(const char *xml, const char *uuid, char *err,
                       size_t errlen);

#endif
