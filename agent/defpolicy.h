/*
 * defpolicy: what a signed definition may contain before this agent
 * defines it (vm.start{spec: {vm, xml, sig}}, agent-protocol §4.9).
 *
 * The signature (defsig.h) proves that the control plane signed the XML,
 * not that the XML is safe: it came from the primary host's agent, and a
 * primary host that lies could name files of this host (a console log
 * that virtlogd, as root, truncates; a kernel or disk that libvirt chowns
 * and hands to a guest), host devices, or QEMU arguments.  The control
 * plane rewrites every definition onto an allow-list shape
 * (api/services/vmdef_policy.py); this is the same shape checked again
 * here, from this agent's own config, so that the DR host does not trust
 * the control plane's rewrite alone:
 *
 *   <domain>   only the children of a plain VM (name, uuid, memory, vcpu,
 *              cpu, clock, features, os, devices, metadata ...); no
 *              <seclabel> (a static label could run QEMU as root), no
 *              element of another namespace outside <metadata> (qemu:
 *              commandline passes arguments through), no DOCTYPE
 *   <os>       kernel initrd dtb loader under definition_paths
 *   devices    disk: RBD network disks only (a CD-ROM or floppy without
 *              source); interface: bridge or network, no script, no host
 *              backend, no target with managed='no'; chardevs: pty unix
 *              null vc spicevmc spiceport qemu-vdagent; emulator: a QEMU
 *              binary of /usr/bin /usr/libexec /usr/local/bin /usr/sbin;
 *              rng on /dev/urandom /dev/random /dev/hwrng; tpm emulator;
 *              input mouse keyboard tablet; controller graphics video
 *              sound audio memballoon watchdog panic iommu vsock hub
 *              memory.  Anything else (hostdev, filesystem, shmem,
 *              redirdev, smartcard, lease, a file or block disk, a LUN
 *              ...) is refused.
 *   paths      every host path anywhere outside <metadata> (an attribute
 *              file= path= dir= socket= template= evdev= tap= vhost=
 *              rendernode=, or any attribute or element text starting
 *              with "/", but <emulator>, the rng backend, <cmdline>,
 *              <title> and <description>) is absolute, normal (no "."
 *              or ".." component, no "//") and under one of
 *              `[libvirt] definition_paths`.
 *
 * Pure parsing with libxml2, no libvirt call, fuzzable (fuzz_domxml.c).
 */
#ifndef CP_DEFPOLICY_H
#define CP_DEFPOLICY_H

#include <stddef.h>

/*
 * 0 when the domain XML (len bytes) keeps to the policy, whose allowed
 * host paths are the blank-separated absolute prefixes of paths ("" or
 * NULL: none).  -1 with why naming the first element refused (and the
 * path, when it is one) otherwise, or when it is not a domain XML.
 */
int defpolicy_check(const char *xml, size_t len, const char *paths,
                    char *why, size_t whylen);

/*
 * Whether path is absolute and normal and equals, or is below, one of
 * the blank-separated prefixes of paths: 1 yes, 0 no.
 */
int defpolicy_path_allowed(const char *path, const char *paths);

/*
 * 0 when paths (a config value) is a list of absolute, normal prefixes
 * other than "/"; -1 with why naming the first that is not.
 */
int defpolicy_paths_valid(const char *paths, char *why, size_t whylen);

#endif
