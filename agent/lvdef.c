/* lvdef: see lvdef.h. */
#include "lvdef.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "lvdomain.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#define SET(dst, v) snprintf((dst), sizeof(dst), "%s", (v))
#define MAX_XML_BYTES (1024 * 1024)

static void
vm_from_dom(const struct agent_config *cfg, const struct lvdom *d,
            struct cfg_vm *m)
{
    memset(m, 0, sizeof(*m));
    SET(m->name, d->name);
    SET(m->domain, d->name);
    SET(m->driver, vm_libvirt_ops.name);
    memcpy(m->disks, d->xml.disks, sizeof(m->disks));
    m->ndisks = d->xml.ndisks;
    m->start_timeout_ms = 60000;
    m->method = CFG_METHOD_AUTO;
    m->discovered = 1;
    config_vm_method(cfg, m);
}

/* [libvirt] discover = yes: every domain (running or defined) that no
 * [vm] section names and that the agent manages (manage, manage_metadata),
 * once its XML is known. */
int
lvdef_discover(void *conn, const struct agent_config *cfg,
               struct cfg_vm *out, int max)
{
    struct lvdom *doms = NULL;
    int n, k = 0;

    if (!cfg->libvirt_discover)
        return 0;
    n = lvcache_list(lvconn_cache(((struct lv_host *)conn)->c), &doms);
    for (int i = 0; i < n && k < max; i++) {
        int known = 0;

        for (int v = 0; v < cfg->nvms; v++)
            known |= strcmp(cfg->vms[v].domain, doms[i].name) == 0 ||
                     strcmp(cfg->vms[v].name, doms[i].name) == 0;
        if (known)
            continue;
        if (!doms[i].have_xml) {
            if (doms[i].xml_error[0])
                log_warnx("event=discover_failed domain=%s msg=\"%s\"",
                          doms[i].name, doms[i].xml_error);
            continue;
        }
        if (!config_libvirt_manages(cfg, doms[i].name, doms[i].xml.managed))
            continue;
        vm_from_dom(cfg, &doms[i], &out[k++]);
    }
    free(doms);
    return k;
}

/* Reads the definition file path (at most MAX_XML_BYTES) into a new
 * string; NULL with err. */
static char *
read_xml(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    char *buf = NULL;
    size_t n = 0;

    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    if ((buf = malloc(MAX_XML_BYTES + 1)))
        n = fread(buf, 1, MAX_XML_BYTES + 1, f);
    fclose(f);
    if (!buf || n > MAX_XML_BYTES) {
        snprintf(err, errlen, "%s: %s", path, buf ? "larger than 1 MiB" :
                 "out of memory");
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

/* The definition file of m, checked: it parses and names m's domain. */
char *
lvdef_read(const struct cfg_vm *m, struct domxml *dx, char *err,
           size_t errlen)
{
    char *xml = read_xml(m->xml, err, errlen), e[256];

    if (!xml)
        return NULL;
    if (domxml_parse(xml, strlen(xml), dx, e, sizeof(e)) < 0) {
        snprintf(err, errlen, "%s: %s", m->xml, e);
    } else if (strcmp(dx->name, m->domain) != 0) {
        snprintf(err, errlen, "%s defines domain %s, not %s", m->xml,
                 dx->name, m->domain);
    } else {
        return xml;
    }
    free(xml);
    return NULL;
}

/* A configured VM that names no disks takes those of its domain's XML,
 * or of its definition file when the domain is not defined here. */
int
lvdef_fill(void *conn, const struct agent_config *cfg, struct cfg_vm *m)
{
    struct lvdom *d = malloc(sizeof(*d));
    struct domxml *dx = malloc(sizeof(*dx));
    const struct domxml *src = NULL;
    char err[300], *xml = NULL;

    if (m->ndisks || !d || !dx)
        goto cleanup;
    if (lvcache_find(lvconn_cache(((struct lv_host *)conn)->c), m->domain, d) == 0 &&
        d->have_xml)
        src = &d->xml;
    else if (m->xml[0] && (xml = lvdef_read(m, dx, err, sizeof(err))))
        src = dx;
    if (src) {
        memcpy(m->disks, src->disks, sizeof(m->disks));
        m->ndisks = src->ndisks;
        config_vm_method(cfg, m);
        log_info("event=vm_disks vm=%s disks=%d from=%s", m->name, m->ndisks,
                 src == dx ? m->xml : "domain");
    }
cleanup:
    free(xml);
    free(d);
    free(dx);
    return src != NULL;
}

int
lvdef_config_check(const struct agent_config *cfg, struct cfg_vm *m,
                   const char *path, char *err, size_t errlen)
{
    struct domxml *dx;
    char e[300], *xml;

    if (m->start[0] || m->qga[0] || m->uid[0]) {
        snprintf(err, errlen, "%s: [vm %s] %s = is for the qmp driver "
                 "(libvirt: vm.start defines and starts the domain; "
                 "fs-freeze uses libvirt's guest agent channel; the "
                 "identity is the domain's UUID)", path,
                 m->name, m->start[0] ? "start" : m->qga[0] ? "qga" : "id");
        return -1;
    }
    if (!cfg->libvirt_uri[0]) {
        snprintf(err, errlen, "%s: [vm %s] uses libvirt but [libvirt] uri is "
                 "not set", path, m->name);
        return -1;
    }
    if (!m->domain[0])
        SET(m->domain, m->name);
    if (m->ndisks && m->method == CFG_METHOD_QMP &&
        !cfg->libvirt_qmp_passthrough) {
        snprintf(err, errlen, "%s: [vm %s] method qmp-transaction on a "
                 "libvirt domain needs [libvirt] qmp_passthrough = yes (it "
                 "marks the domain tainted); use rbd disks", path, m->name);
        return -1;
    }
    if (m->xml[0]) {
        /* -n tells the operator now, not at the first failover. */
        if (!(dx = malloc(sizeof(*dx))))
            return -1;
        xml = lvdef_read(m, dx, e, sizeof(e));
        free(dx);
        free(xml);
        if (!xml) {
            snprintf(err, errlen, "%s: [vm %s] xml: %s", path, m->name, e);
            return -1;
        }
    }
    return 0;
}
