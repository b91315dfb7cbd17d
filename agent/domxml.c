/* domxml: see domxml.h. */
#include "domxml.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libxml/parser.h>
#include <libxml/tree.h>

#define GUEST_AGENT_CHANNEL "org.qemu.guest_agent.0"

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

/* libxml2 wants one initialization before threads parse at once. */
static void
init_parser(void)
{
    xmlInitParser();
}

static int
is(const xmlNode *n, const char *name)
{
    return n->type == XML_ELEMENT_NODE &&
           strcmp((const char *)n->name, name) == 0;
}

static const xmlNode *
child(const xmlNode *n, const char *name)
{
    for (const xmlNode *c = n->children; c; c = c->next)
        if (is(c, name))
            return c;
    return NULL;
}

/* libvirt's string v copied into buf (size len) and freed; "" when NULL,
 * -1 when it does not fit. */
static int
take(xmlChar *v, char *buf, size_t len)
{
    int rc = 0;

    buf[0] = '\0';
    if (v) {
        if (strlen((const char *)v) >= len)
            rc = -1;
        else
            snprintf(buf, len, "%s", (const char *)v);
        xmlFree(v);
    }
    return rc;
}

/* The attribute's value copied into buf; "" when absent. */
static int
attr(const xmlNode *n, const char *name, char *buf, size_t len)
{
    return take(n ? xmlGetProp(n, (const xmlChar *)name) : NULL, buf, len);
}

/* The element's text copied into buf; -1 when it does not fit. */
static int
text(const xmlNode *n, char *buf, size_t len)
{
    return take(xmlNodeGetContent(n), buf, len);
}

static void
unsupported(struct domxml *out, const char *target, const char *why)
{
    struct domxml_unsupported *u;

    if (out->nunsupported == DOMXML_MAX_UNSUPPORTED)
        return;
    u = &out->unsupported[out->nunsupported++];
    snprintf(u->target, sizeof(u->target), "%s", target);
    snprintf(u->why, sizeof(u->why), "%s", why);
}

/* "POOL/IMAGE" -> d; 0, or -1 with why (a namespace, an empty part). */
static int
rbd_name(const char *name, struct cfg_disk *d, const char **why)
{
    const char *slash = strchr(name, '/');

    if (!slash || slash == name || !slash[1]) {
        *why = "rbd source name is not POOL/IMAGE";
        return -1;
    }
    if (strchr(slash + 1, '/')) {
        *why = "rbd namespaces are not supported";
        return -1;
    }
    if ((size_t)(slash - name) >= sizeof(d->pool) ||
        strlen(slash + 1) >= sizeof(d->image)) {
        *why = "rbd pool or image name too long";
        return -1;
    }
    memcpy(d->pool, name, (size_t)(slash - name));
    d->pool[slash - name] = '\0';
    snprintf(d->image, sizeof(d->image), "%s", slash + 1);
    return 0;
}

static int
source_index(const xmlNode *src)
{
    char buf[16];
    char *end;
    long v;

    if (attr(src, "index", buf, sizeof(buf)) < 0 || !buf[0])
        return -1;
    v = strtol(buf, &end, 10);
    return *end || v < 0 || v > INT_MAX ? -1 : (int)v;
}

/* One <disk>: 1 added, 0 ignored or unsupported, -1 error. */
static int
parse_disk(const xmlNode *n, struct domxml *out, char *err, size_t errlen)
{
    const xmlNode *tgt = child(n, "target"), *src = child(n, "source");
    char type[32], device[32], target[64], proto[32], name[512], fmt[32];
    struct cfg_disk d;
    const char *why = NULL;

    memset(&d, 0, sizeof(d));
    if (attr(n, "type", type, sizeof(type)) < 0 ||
        attr(n, "device", device, sizeof(device)) < 0)
        type[0] = device[0] = '\0';
    if (device[0] && strcmp(device, "disk") != 0)
        return 0;               /* cdrom, floppy, lun */
    if (!tgt || attr(tgt, "dev", target, sizeof(target)) < 0 || !target[0] ||
        strchr(target, '/') || strlen(target) >= sizeof(d.node)) {
        snprintf(err, errlen, "a disk without a usable <target dev=...>");
        return -1;
    }
    snprintf(d.node, sizeof(d.node), "%s", target);
    if (!src) {
        why = "no source (empty drive)";
    } else if (strcmp(type, "network") == 0) {
        if (attr(src, "protocol", proto, sizeof(proto)) < 0 ||
            strcmp(proto, "rbd") != 0)
            why = "network disk that is not rbd";
        else if (attr(src, "name", name, sizeof(name)) < 0)
            why = "rbd source name too long";
        else if (rbd_name(name, &d, &why) == 0)
            d.backend = CFG_BACKEND_RBD;
    } else if (strcmp(type, "file") == 0) {
        if (attr(child(n, "driver"), "type", fmt, sizeof(fmt)) < 0 ||
            strcmp(fmt, "qcow2") != 0)
            why = "file disk that is not qcow2";
        else if (attr(src, "file", d.file, sizeof(d.file)) < 0 ||
                 d.file[0] != '/')
            why = "qcow2 file path missing, relative or too long";
        else
            d.backend = CFG_BACKEND_QCOW2;
    } else {
        why = strcmp(type, "block") == 0 ? "block device" :
              strcmp(type, "volume") == 0 ? "storage pool volume" :
              "unknown disk type";
    }
    if (why) {
        unsupported(out, target, why);
        return 0;
    }
    for (int i = 0; i < out->ndisks; i++)
        if (strcmp(out->disks[i].node, d.node) == 0) {
            snprintf(err, errlen, "two disks with target %s", d.node);
            return -1;
        }
    if (out->ndisks == CFG_MAX_DISKS) {
        snprintf(err, errlen, "more than %d disks", CFG_MAX_DISKS);
        return -1;
    }
    out->index[out->ndisks] = source_index(src);
    out->disks[out->ndisks++] = d;
    return 1;
}

static int
is_guest_agent(const xmlNode *channel)
{
    const xmlNode *tgt = child(channel, "target");
    char type[16], name[64];

    return tgt && attr(tgt, "type", type, sizeof(type)) == 0 &&
           attr(tgt, "name", name, sizeof(name)) == 0 &&
           strcmp(type, "virtio") == 0 &&
           strcmp(name, GUEST_AGENT_CHANNEL) == 0;
}

/* <metadata> holds an element `managed` of cutpoint's namespace: matched
 * by the namespace's URI, as libvirt does, not by the prefix. */
static int
is_managed(const xmlNode *metadata)
{
    for (const xmlNode *c = metadata->children; c; c = c->next)
        if (is(c, "managed") && c->ns && c->ns->href &&
            strcmp((const char *)c->ns->href, DOMXML_CUTPOINT_NS) == 0)
            return 1;
    return 0;
}

int
domxml_parse(const char *xml, size_t len, struct domxml *out, char *err,
             size_t errlen)
{
    xmlDocPtr doc = NULL;
    const xmlNode *root, *n, *devs;
    int rc = -1;

    memset(out, 0, sizeof(*out));
    pthread_once(&init_once, init_parser);
    if (len > INT_MAX) {
        snprintf(err, errlen, "domain XML too large");
        return -1;
    }
    /* No network, no entity expansion, no DTD loading: the XML names
     * nothing the parser should fetch. */
    doc = xmlReadMemory(xml, (int)len, "domain.xml", NULL,
                        XML_PARSE_NONET | XML_PARSE_NOERROR |
                        XML_PARSE_NOWARNING);
    if (!doc || !(root = xmlDocGetRootElement(doc)) || !is(root, "domain")) {
        snprintf(err, errlen, "not a libvirt domain XML");
        goto cleanup;
    }
    if (!(n = child(root, "name")) || text(n, out->name, sizeof(out->name)) < 0
        || !out->name[0]) {
        snprintf(err, errlen, "domain XML without a usable <name>");
        goto cleanup;
    }
    if ((n = child(root, "uuid")) && text(n, out->uuid, sizeof(out->uuid)) < 0)
        out->uuid[0] = '\0';
    if ((n = child(root, "metadata")))
        out->managed = is_managed(n);
    if ((devs = child(root, "devices")))
        for (n = devs->children; n; n = n->next) {
            if (is(n, "disk") && parse_disk(n, out, err, errlen) < 0)
                goto cleanup;
            if (is(n, "channel") && is_guest_agent(n))
                out->guest_agent = 1;
        }
    rc = 0;
cleanup:
    xmlFreeDoc(doc);
    return rc;
}

char *
domxml_with_uuid(const char *xml, const char *uuid, char *err, size_t errlen)
{
    xmlDocPtr doc;
    xmlNodePtr root;
    xmlChar *buf = NULL;
    char *out = NULL;
    int len = 0;

    pthread_once(&init_once, init_parser);
    doc = xmlReadMemory(xml, (int)strlen(xml), "domain.xml", NULL,
                        XML_PARSE_NONET | XML_PARSE_NOERROR |
                        XML_PARSE_NOWARNING);
    if (!doc || !(root = xmlDocGetRootElement(doc)) || !is(root, "domain")) {
        snprintf(err, errlen, "not a libvirt domain XML");
        goto cleanup;
    }
    if (!child(root, "uuid"))
        xmlNewTextChild(root, NULL, (const xmlChar *)"uuid",
                        (const xmlChar *)uuid);
    xmlDocDumpMemory(doc, &buf, &len);
    if (!buf || !(out = strdup((const char *)buf)))
        snprintf(err, errlen, "out of memory");
cleanup:
    xmlFree(buf);
    xmlFreeDoc(doc);
    return out;
}

