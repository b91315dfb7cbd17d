/*
 * libFuzzer target: the input is an agent config file's bytes, loaded by
 * config_load as `cutpointd -n -c FILE` loads it (the file is a memfd, so
 * nothing touches the disk).  A load that succeeds must leave a config
 * the agent can use as is: every string a proper C string of its field,
 * counts within their arrays, numbers within their documented ranges and
 * every VM's method resolved.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "vm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A field that must end inside its array. */
#define TERMINATED(f) (strnlen((f), sizeof(f)) < sizeof(f))

static struct agent_config cfg;

static void
check_loaded(void)
{
    if (!TERMINATED(cfg.host) || !TERMINATED(cfg.listen_addr) ||
        !TERMINATED(cfg.journal) || !TERMINATED(cfg.log_level) ||
        !TERMINATED(cfg.ca) || !TERMINATED(cfg.cert) ||
        !TERMINATED(cfg.key) || !TERMINATED(cfg.revoked) ||
        !TERMINATED(cfg.ceph_conf) ||
        !TERMINATED(cfg.ceph_id) || !TERMINATED(cfg.ceph_keyring) ||
        !TERMINATED(cfg.libvirt_uri))
        abort();
    if (!cfg.ca[0] || !cfg.cert[0] || !cfg.key[0])
        abort();
    if (cfg.listen_port < 1 || cfg.listen_port > 65535 ||
        cfg.qmp_timeout_ms < 10 || cfg.qmp_timeout_ms > 600000 ||
        cfg.freeze_timeout_ms < 10 || cfg.freeze_timeout_ms > 600000 ||
        cfg.storage_probe_ms < 0 || cfg.storage_probe_ms > 600000 ||
        cfg.max_connections < 1 ||
        cfg.max_connections > CFG_MAX_CONNECTIONS ||
        cfg.handshake_timeout_ms < 100 ||
        cfg.handshake_timeout_ms > 600000 || cfg.workers < 1 ||
        cfg.workers > 256 || cfg.queue < 1 || cfg.queue > 65536)
        abort();
    if (cfg.nvms < 0 || cfg.nvms > CFG_MAX_VMS)
        abort();
    for (int i = 0; i < cfg.nvms; i++) {
        const struct cfg_vm *m = &cfg.vms[i];

        if (!TERMINATED(m->name) || !m->name[0] || !TERMINATED(m->driver) ||
            !TERMINATED(m->qmp) || !TERMINATED(m->qga) ||
            !TERMINATED(m->domain) || !TERMINATED(m->start))
            abort();
        if (!vm_driver_find(m->driver) || m->method == CFG_METHOD_AUTO ||
            m->ndisks < 0 || m->ndisks > CFG_MAX_DISKS)
            abort();
        if (m->qga[0] && m->qga[0] != '/')
            abort();
        for (int d = 0; d < m->ndisks; d++) {
            const struct cfg_disk *k = &m->disks[d];

            if (!TERMINATED(k->node) || !k->node[0] ||
                strchr(k->node, '/') || !TERMINATED(k->pool) ||
                !TERMINATED(k->image) || !TERMINATED(k->file))
                abort();
            if (k->backend == CFG_BACKEND_RBD ? !k->pool[0] || !k->image[0]
                                              : k->file[0] != '/')
                abort();
        }
        if (m->method == CFG_METHOD_RBD)
            for (int d = 0; d < m->ndisks; d++)
                if (m->disks[d].backend != CFG_BACKEND_RBD)
                    abort();
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    char err[1024];

    if (fd < 0) {
        log_set_level(LOG_WARN);
        fd = memfd_create("cutpointd.ini", 0);
        if (fd < 0)
            abort();
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) < 0 ||
        (size > 0 && pwrite(fd, data, size, 0) != (ssize_t)size))
        abort();
    err[0] = '\0';
    if (config_load(path, &cfg, err, sizeof(err)) == 0)
        check_loaded();
    else if (!err[0] || !TERMINATED(err))
        abort();   /* a refused file always says why */
    return 0;
}
