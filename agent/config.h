/*
 * config: the agent's INI file (agent-protocol §9).  config_load parses and
 * validates everything it can without touching the network; errors name the
 * file, line and key.
 */
#ifndef CP_CONFIG_H
#define CP_CONFIG_H

#include <stddef.h>

#define CFG_MAX_VMS 64
#define CFG_MAX_DISKS 16
/* The server's connection table; [agent] max_connections is at most this. */
#define CFG_MAX_CONNECTIONS 1024

enum cfg_backend { CFG_BACKEND_RBD, CFG_BACKEND_QCOW2 };
enum cfg_method { CFG_METHOD_AUTO, CFG_METHOD_RBD, CFG_METHOD_QMP };

struct cfg_disk {
    char node[64];
    enum cfg_backend backend;
    char pool[128];
    char image[256];
    char file[1024];
};

struct cfg_vm {
    char name[256];
    char driver[32];        /* a row of the VM driver table (vm.h) */
    char qmp[1024];
    char qga[108];          /* guest agent socket, "" none (sun_path size) */
    char domain[256];
    /* qmp driver: the operator's command that starts this VM's QEMU for
     * vm.start (agent-protocol §4.9): an absolute program path and its
     * arguments separated by blanks, no shell; "" none. */
    char start[1024];
    int start_timeout_ms;   /* command + QMP answering "running" */
    /* libvirt driver: the domain's definition, which vm.start defines
     * before it starts the domain (absolute path, "" none), and the guest
     * mountpoints fs-freeze freezes (blank-separated, "" all). */
    char xml[1024];
    char mountpoints[1024];
    /* qmp driver: the VM's stable identity (`id =`), which stays the same
     * when the VM moves to another host; "" none.  A libvirt VM's identity
     * is its domain UUID. */
    char uid[65];
    enum cfg_method method;
    int method_auto;        /* method = auto: config_vm_method resolves it
                               again when the driver learns the disks */
    int discovered;         /* added by the driver's discovery, not the file */
    struct cfg_disk disks[CFG_MAX_DISKS];
    int ndisks;
};

struct agent_config {
    char host[256];
    char listen_addr[64];
    int listen_port;
    char journal[1024];
    int qmp_timeout_ms;
    int freeze_timeout_ms;      /* quiesce fs-freeze: guest-fsfreeze-freeze */
    int storage_probe_ms;       /* prepare's read of each RBD disk: 0 off */
    int pause_in_pause;         /* pause_path = in_pause (default redirect) */
    int pause_live;             /* pause_path = live: no stop (hold.h) */
    int redirect_inline_max;    /* VMs per prepare that make overlays inline */
    char log_level[16];
    char ca[1024], cert[1024], key[1024];
    char revoked[1024];         /* serial deny-list (revoke.h), "" none */
    /* Transport limits (agent-protocol §1.7). */
    int max_connections;        /* open + handshaking; extra ones refused */
    int handshake_timeout_ms;   /* a TLS handshake not done by then: closed */
    int workers;                /* threads that run requests (pool.h) */
    int queue;                  /* requests waiting for one; beyond: BUSY */
    char ceph_conf[1024], ceph_id[128], ceph_keyring[1024];
    char libvirt_uri[512];
    int libvirt_discover;       /* add the domains of the URI it manages */
    char libvirt_manage[256];   /* fnmatch pattern of their names, "" any */
    int libvirt_manage_metadata;    /* only domains whose XML carries
                                       <cutpoint:managed/> (domxml.h) */
    int libvirt_qmp_passthrough;    /* raw QMP (virDomainQemuMonitorCommand,
                                       taints the domain): off by default */
    /* The control plane's definition-signing public key (PEM, Ed25519):
     * vm.start defines a domain XML from the wire only when it signed it
     * (defsig.h); "" none: never. */
    char definition_key[1024];
    /* The host paths a signed definition may name (defpolicy.h): blank-
     * separated absolute prefixes for kernels, initrds, firmware, console
     * logs and the Ceph conf; "" none (a definition naming any host path
     * is refused). */
    char definition_paths[1024];
    struct cfg_vm vms[CFG_MAX_VMS];
    int nvms;
};

int config_load(const char *path, struct agent_config *cfg, char *err,
                size_t errlen);
const char *config_method_name(enum cfg_method m);
/* Resolves method = auto of m from its disks: rbd when every disk is rbd
 * and [ceph] is set, else qmp-transaction.  Other methods stay. */
void config_vm_method(const struct agent_config *cfg, struct cfg_vm *m);
/* Whether discovery takes the domain called name, whose XML does (tagged
 * 1) or does not carry the cutpoint metadata element: it matches [libvirt]
 * manage when set, and is tagged when manage_metadata = yes.  Both set:
 * both must hold. */
int config_libvirt_manages(const struct agent_config *cfg, const char *name,
                           int tagged);

#endif
