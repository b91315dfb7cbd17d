/* config: see config.h. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "defpolicy.h"
#include "log.h"
#include "runcmd.h"
#include "vm.h"

#define SET(dst, v) snprintf((dst), sizeof(dst), "%s", (v))
/* A value of the file is stored whole or refused, never cut short: a cut
 * path would name another file.  (Inside config_load, where v is the
 * value and toolong the refusal.) */
#define TAKE(dst) do {                  \
        if (strlen(v) >= sizeof(dst))   \
            goto toolong;               \
        SET(dst, v);                    \
    } while (0)

static char *
trim(char *s)
{
    char *e;

    while (isspace((unsigned char)*s))
        s++;
    e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

const char *
config_method_name(enum cfg_method m)
{
    return m == CFG_METHOD_RBD ? "rbd" : m == CFG_METHOD_QMP ?
        "qmp-transaction" : "auto";
}

/* "rbd:pool/image" or "qcow2:/path" */
static int
parse_disk(struct cfg_disk *d, const char *node, const char *v)
{
    const char *slash;

    SET(d->node, node);
    if (strncmp(v, "rbd:", 4) == 0) {
        v += 4;
        slash = strchr(v, '/');
        if (!slash || slash == v || !slash[1] ||
            (size_t)(slash - v) >= sizeof(d->pool))
            return -1;
        if (strlen(slash + 1) >= sizeof(d->image))
            return -1;
        d->backend = CFG_BACKEND_RBD;
        memcpy(d->pool, v, (size_t)(slash - v));
        d->pool[slash - v] = '\0';
        SET(d->image, slash + 1);
        return 0;
    }
    if (strncmp(v, "qcow2:", 6) == 0 && v[6] == '/' &&
        strlen(v + 6) < sizeof(d->file)) {
        d->backend = CFG_BACKEND_QCOW2;
        SET(d->file, v + 6);
        return 0;
    }
    return -1;
}

void
config_vm_method(const struct agent_config *cfg, struct cfg_vm *m)
{
    int all_rbd = m->ndisks > 0;

    for (int d = 0; d < m->ndisks; d++)
        if (m->disks[d].backend != CFG_BACKEND_RBD)
            all_rbd = 0;
    if (m->method == CFG_METHOD_AUTO || m->method_auto) {
        m->method_auto = 1;
        m->method = all_rbd && cfg->ceph_conf[0] ? CFG_METHOD_RBD :
            CFG_METHOD_QMP;
    }
}

/* Blank-separated absolute paths. */
static int
parse_paths(const char *v)
{
    for (const char *p = v; *p;) {
        size_t n;
        p += strspn(p, " \t");
        n = strcspn(p, " \t");
        if (n && *p != '/')
            return -1;
        p += n;
    }
    return 0;
}

/* A name pattern of fnmatch(3) that means what it says: not empty, no
 * trailing backslash, every [ closed (fnmatch would take an unclosed [ as
 * a literal, so "web[12" would quietly match nothing). */
static int
check_pattern(const char *v)
{
    if (!*v)
        return -1;
    for (const char *p = v; *p; p++) {
        if (*p == '\\') {
            if (!*++p)
                return -1;
        } else if (*p == '[') {
            const char *q = p + 1;
            if (*q == '!' || *q == '^')
                q++;
            if (*q == ']')
                q++;            /* a leading ] is a member */
            while (*q && *q != ']')
                q++;
            if (!*q)
                return -1;
            p = q;
        }
    }
    return 0;
}

int
config_libvirt_manages(const struct agent_config *cfg, const char *name,
                       int tagged)
{
    if (cfg->libvirt_manage[0] && fnmatch(cfg->libvirt_manage, name, 0) != 0)
        return 0;
    return !cfg->libvirt_manage_metadata || tagged;
}

static int
parse_int(const char *v, int lo, int hi, int *out)
{
    char *end;
    long n;

    errno = 0;
    n = strtol(v, &end, 10);
    if (errno || *end || end == v || n < lo || n > hi)
        return -1;
    *out = (int)n;
    return 0;
}

int
config_load(const char *path, struct agent_config *cfg, char *err,
            size_t errlen)
{
    char line[2048], section[300] = "", *k, *v, *eq;
    struct cfg_vm *vm = NULL;
    FILE *f = NULL;
    int lineno = 0, ret = -1;
    enum log_level lvl;

    memset(cfg, 0, sizeof(*cfg));
    cfg->listen_port = 7443;
    cfg->qmp_timeout_ms = 2000;
    cfg->freeze_timeout_ms = 5000;
    cfg->storage_probe_ms = 500;
    /* redirect by default (agent-protocol §5.1): a VM that cannot take it
     * is cut in the pause anyway (redirect_usable) */
    cfg->pause_in_pause = 0;
    cfg->pause_live = 0;
    /* a VM without overlays made ahead: at most this many per prepare make
     * them inside it (agent-protocol §5.1; the others are cut in the pause) */
    cfg->redirect_inline_max = 8;
    cfg->max_connections = 256;
    cfg->handshake_timeout_ms = 10000;
    cfg->workers = 16;
    cfg->queue = 256;
    SET(cfg->listen_addr, "0.0.0.0");
    SET(cfg->log_level, "info");
    SET(cfg->journal, "/var/lib/cutpoint/agent/journal");
    SET(cfg->ceph_id, "admin");
    if (gethostname(cfg->host, sizeof(cfg->host)) < 0)
        SET(cfg->host, "unknown");

    f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    while (fgets(line, sizeof(line), f)) {
        lineno++;
        if (!strchr(line, '\n') && fgetc(f) != EOF) {
            /* fgets would hand the rest over as a line of its own */
            snprintf(err, errlen, "%s:%d: line longer than %zu bytes", path,
                     lineno, sizeof(line) - 2);
            goto cleanup;
        }
        k = trim(line);
        if (!*k || *k == ';' || *k == '#')
            continue;
        if (*k == '[') {
            char *close = strchr(k, ']');
            if (!close || close[1]) {
                snprintf(err, errlen, "%s:%d: bad section header", path,
                         lineno);
                goto cleanup;
            }
            *close = '\0';
            if (strlen(trim(k + 1)) >= sizeof(section)) {
                snprintf(err, errlen, "%s:%d: section name too long", path,
                         lineno);
                goto cleanup;
            }
            SET(section, trim(k + 1));
            vm = NULL;
            if (strncmp(section, "vm ", 3) == 0) {
                const char *name = trim(section + 3);
                if (cfg->nvms == CFG_MAX_VMS || !*name ||
                    strlen(name) >= sizeof(cfg->vms[0].name)) {
                    snprintf(err, errlen, "%s:%d: too many VMs, or a VM name "
                             "empty or too long", path, lineno);
                    goto cleanup;
                }
                for (int i = 0; i < cfg->nvms; i++)
                    if (strcmp(cfg->vms[i].name, name) == 0) {
                        snprintf(err, errlen, "%s:%d: VM %s defined twice",
                                 path, lineno, name);
                        goto cleanup;
                    }
                vm = &cfg->vms[cfg->nvms++];
                SET(vm->name, name);
                SET(vm->driver, "qmp");
                vm->start_timeout_ms = 60000;
            } else if (strcmp(section, "agent") && strcmp(section, "tls") &&
                       strcmp(section, "ceph") && strcmp(section, "libvirt")) {
                snprintf(err, errlen, "%s:%d: unknown section [%s]", path,
                         lineno, section);
                goto cleanup;
            }
            continue;
        }
        eq = strchr(k, '=');
        if (!eq) {
            snprintf(err, errlen, "%s:%d: expected key = value", path, lineno);
            goto cleanup;
        }
        *eq = '\0';
        v = trim(eq + 1);
        k = trim(k);
        /* strip a trailing "; comment" */
        if ((eq = strstr(v, " ;")))
            *eq = '\0', v = trim(v);
#define KEY(sec, name) (strcmp(section, sec) == 0 && strcmp(k, name) == 0)
        if (KEY("agent", "host"))
            TAKE(cfg->host);
        else if (KEY("agent", "listen")) {
            char *colon = strrchr(v, ':');
            if (!colon || parse_int(colon + 1, 1, 65535,
                                    &cfg->listen_port) < 0)
                goto bad;
            *colon = '\0';
            TAKE(cfg->listen_addr);
        } else if (KEY("agent", "journal"))
            TAKE(cfg->journal);
        else if (KEY("agent", "freeze_timeout_ms")) {
            if (parse_int(v, 10, 600000, &cfg->freeze_timeout_ms) < 0)
                goto bad;
        }
        else if (KEY("agent", "pause_path")) {
            /* redirect (the default): the cut switches disks to overlays
             * (redirect.c) where it can; live: that switch without a stop,
             * the VM's network held instead (hold.h); in_pause: RBD
             * snapshots inside the pause for every VM */
            if (strcmp(v, "redirect") && strcmp(v, "in_pause") &&
                strcmp(v, "live"))
                goto bad;
            cfg->pause_in_pause = strcmp(v, "in_pause") == 0;
            cfg->pause_live = strcmp(v, "live") == 0;
        }
        else if (KEY("agent", "redirect_inline_max")) {
            if (parse_int(v, 0, CFG_MAX_VMS, &cfg->redirect_inline_max) < 0)
                goto bad;
        }
        else if (KEY("agent", "storage_probe_ms")) {
            /* 0: no probe before the pause (prepare.c prepare_probe) */
            if (parse_int(v, 0, 600000, &cfg->storage_probe_ms) < 0)
                goto bad;
        }
        else if (KEY("agent", "qmp_timeout_ms")) {
            if (parse_int(v, 10, 600000, &cfg->qmp_timeout_ms) < 0)
                goto bad;
        } else if (KEY("agent", "log_level")) {
            if (log_parse_level(v, &lvl) < 0)
                goto bad;
            TAKE(cfg->log_level);
        } else if (KEY("agent", "max_connections")) {
            if (parse_int(v, 1, CFG_MAX_CONNECTIONS, &cfg->max_connections) < 0)
                goto bad;
        } else if (KEY("agent", "handshake_timeout_ms")) {
            if (parse_int(v, 100, 600000, &cfg->handshake_timeout_ms) < 0)
                goto bad;
        } else if (KEY("agent", "workers")) {
            if (parse_int(v, 1, 256, &cfg->workers) < 0)
                goto bad;
        } else if (KEY("agent", "queue")) {
            if (parse_int(v, 1, 65536, &cfg->queue) < 0)
                goto bad;
        } else if (KEY("tls", "ca"))
            TAKE(cfg->ca);
        else if (KEY("tls", "cert"))
            TAKE(cfg->cert);
        else if (KEY("tls", "key"))
            TAKE(cfg->key);
        else if (KEY("tls", "revoked"))
            TAKE(cfg->revoked);
        else if (KEY("ceph", "conf"))
            TAKE(cfg->ceph_conf);
        else if (KEY("ceph", "id"))
            TAKE(cfg->ceph_id);
        else if (KEY("ceph", "keyring"))
            TAKE(cfg->ceph_keyring);
        else if (KEY("libvirt", "uri"))
            TAKE(cfg->libvirt_uri);
        else if (KEY("libvirt", "definition_key")) {
            if (v[0] != '/')
                goto bad;
            TAKE(cfg->definition_key);
        } else if (KEY("libvirt", "definition_paths")) {
            char why[256];
            if (defpolicy_paths_valid(v, why, sizeof(why)) < 0) {
                snprintf(err, errlen, "%s:%d: [libvirt] definition_paths: %s",
                         path, lineno, why);
                goto cleanup;
            }
            TAKE(cfg->definition_paths);
        }
        else if (KEY("libvirt", "qmp_passthrough")) {
            if (strcmp(v, "yes") == 0 || strcmp(v, "true") == 0)
                cfg->libvirt_qmp_passthrough = 1;
            else if (strcmp(v, "no") == 0 || strcmp(v, "false") == 0)
                cfg->libvirt_qmp_passthrough = 0;
            else
                goto bad;
        } else if (KEY("libvirt", "manage")) {
            if (check_pattern(v) < 0)
                goto bad;
            TAKE(cfg->libvirt_manage);
        } else if (KEY("libvirt", "manage_metadata")) {
            if (strcmp(v, "yes") == 0 || strcmp(v, "true") == 0)
                cfg->libvirt_manage_metadata = 1;
            else if (strcmp(v, "no") == 0 || strcmp(v, "false") == 0)
                cfg->libvirt_manage_metadata = 0;
            else
                goto bad;
        } else if (KEY("libvirt", "discover")) {
            if (strcmp(v, "yes") == 0 || strcmp(v, "true") == 0)
                cfg->libvirt_discover = 1;
            else if (strcmp(v, "no") == 0 || strcmp(v, "false") == 0)
                cfg->libvirt_discover = 0;
            else
                goto bad;
        }
        else if (vm && strcmp(k, "driver") == 0) {
            if (!vm_driver_find(v))
                goto bad;
            TAKE(vm->driver);
        } else if (vm && strcmp(k, "qmp") == 0)
            TAKE(vm->qmp);
        else if (vm && strcmp(k, "qga") == 0) {
            /* an absolute unix socket path that fits sockaddr_un */
            if (v[0] != '/' || strlen(v) >= sizeof(vm->qga))
                goto bad;
            TAKE(vm->qga);
        }
        else if (vm && strcmp(k, "domain") == 0)
            TAKE(vm->domain);
        else if (vm && strcmp(k, "id") == 0) {
            /* printable, no blanks: it names the VM across hosts */
            if (!v[0] || strlen(v) >= sizeof(vm->uid) ||
                strspn(v, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                       "0123456789._:-") != strlen(v))
                goto bad;
            TAKE(vm->uid);
        }
        else if (vm && strcmp(k, "xml") == 0) {
            if (v[0] != '/')
                goto bad;
            TAKE(vm->xml);
        } else if (vm && strcmp(k, "mountpoints") == 0) {
            if (strlen(v) >= sizeof(vm->mountpoints) || parse_paths(v) < 0)
                goto bad;
            TAKE(vm->mountpoints);
        }
        else if (vm && strcmp(k, "start") == 0) {
            char buf[sizeof(vm->start)], *argv[RUNCMD_MAX_ARGS];
            if (strlen(v) >= sizeof(vm->start) ||
                runcmd_split(v, buf, sizeof(buf), argv, RUNCMD_MAX_ARGS) < 0)
                goto bad;
            TAKE(vm->start);
        } else if (vm && strcmp(k, "start_timeout_ms") == 0) {
            if (parse_int(v, 100, 3600000, &vm->start_timeout_ms) < 0)
                goto bad;
        }
        else if (vm && strcmp(k, "method") == 0) {
            if (strcmp(v, "auto") == 0)
                vm->method = CFG_METHOD_AUTO;
            else if (strcmp(v, "rbd") == 0)
                vm->method = CFG_METHOD_RBD;
            else if (strcmp(v, "qmp") == 0 ||
                     strcmp(v, "qmp-transaction") == 0)
                vm->method = CFG_METHOD_QMP;
            else
                goto bad;
        } else if (vm && strncmp(k, "disk.", 5) == 0) {
            if (vm->ndisks == CFG_MAX_DISKS || !k[5] || strlen(k + 5) >= 64 ||
                strchr(k + 5, '/') ||
                parse_disk(&vm->disks[vm->ndisks], k + 5, v) < 0)
                goto bad;
            vm->ndisks++;
        } else {
            snprintf(err, errlen, "%s:%d: unknown key %s in [%s]", path,
                     lineno, k, section);
            goto cleanup;
        }
#undef KEY
        continue;
bad:
        snprintf(err, errlen, "%s:%d: bad value for %s: %s", path, lineno, k,
                 v);
        goto cleanup;
toolong:
        snprintf(err, errlen, "%s:%d: value of %s is too long (%zu bytes)",
                 path, lineno, k, strlen(v));
        goto cleanup;
    }
    /* cross-checks */
    if (!cfg->ca[0] || !cfg->cert[0] || !cfg->key[0]) {
        snprintf(err, errlen, "%s: [tls] ca, cert and key are required", path);
        goto cleanup;
    }
    if ((cfg->libvirt_manage[0] || cfg->libvirt_manage_metadata) &&
        !cfg->libvirt_discover) {
        /* a selection nothing uses is a mistake the operator should see */
        snprintf(err, errlen, "%s: [libvirt] manage%s selects the domains "
                 "discovery takes, but discover is not yes", path,
                 cfg->libvirt_manage[0] ? "" : "_metadata");
        goto cleanup;
    }
    if (cfg->definition_key[0] &&
        (!cfg->libvirt_uri[0] || !cfg->libvirt_discover)) {
        /* only the libvirt driver defines a domain from a definition, and
         * the domain becomes a VM of the inventory (failover waits for it
         * there) only through discovery */
        snprintf(err, errlen, "%s: [libvirt] definition_key needs [libvirt] "
                 "uri and discover = yes", path);
        goto cleanup;
    }
    if (cfg->definition_paths[0] && !cfg->definition_key[0]) {
        snprintf(err, errlen, "%s: [libvirt] definition_paths is the policy "
                 "of signed definitions, but definition_key is not set", path);
        goto cleanup;
    }
    if (cfg->definition_key[0] && access(cfg->definition_key, R_OK) < 0) {
        /* -n tells the operator now, not at the first failover. */
        snprintf(err, errlen, "%s: [libvirt] definition_key: %s: %s", path,
                 cfg->definition_key, strerror(errno));
        goto cleanup;
    }
    for (int i = 0; i < cfg->nvms; i++) {
        struct cfg_vm *m = &cfg->vms[i];
        int all_rbd = m->ndisks > 0;
        const struct vm_ops *drv = vm_driver_find(m->driver);
        if (m->start[0]) {
            char buf[sizeof(m->start)], *argv[RUNCMD_MAX_ARGS];
            /* -n tells the operator now, not at the first failover. */
            runcmd_split(m->start, buf, sizeof(buf), argv, RUNCMD_MAX_ARGS);
            if (access(argv[0], X_OK) < 0) {
                snprintf(err, errlen, "%s: [vm %s] start: %s: %s", path,
                         m->name, argv[0], strerror(errno));
                goto cleanup;
            }
        }
        for (int d = 0; d < m->ndisks; d++)
            if (m->disks[d].backend != CFG_BACKEND_RBD)
                all_rbd = 0;
        if (m->method == CFG_METHOD_RBD && (!all_rbd || !cfg->ceph_conf[0])) {
            snprintf(err, errlen, "%s: [vm %s] method = rbd needs only rbd "
                     "disks and a [ceph] section", path, m->name);
            goto cleanup;
        }
        config_vm_method(cfg, m);
        /* after the method: a driver may not run every method */
        if (drv->config_check &&
            drv->config_check(cfg, m, path, err, errlen) < 0)
            goto cleanup;
    }
    ret = 0;
cleanup:
    fclose(f);
    return ret;
}
