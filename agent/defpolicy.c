/* defpolicy: see defpolicy.h. */
#include "defpolicy.h"

#include <fnmatch.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <libxml/parser.h>
#include <libxml/tree.h>

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#define QEMU_NS "http://libvirt.org/schemas/domain/qemu/1.0"

/* The element names each level allows (NULL-terminated).  Everything not
 * listed is refused: a new libvirt element is refused until someone
 * decides it reaches nothing of the host. */
static const char *const ROOT[] = {
    "name", "uuid", "genid", "title", "description", "metadata",
    "maxMemory", "memory", "currentMemory", "blkiotune", "memtune",
    "memoryBacking", "vcpu", "vcpus", "iothreads", "iothreadids", "cputune",
    "numatune", "sysinfo", "os", "features", "cpu", "clock", "on_poweroff",
    "on_reboot", "on_crash", "on_lockfailure", "pm", "perf", "devices", NULL
};
static const char *const OS[] = {
    "type", "kernel", "initrd", "dtb", "cmdline", "loader", "nvram", "boot",
    "bootmenu", "smbios", "bios", "firmware", NULL
};
static const char *const DEVICES[] = {
    "emulator", "disk", "controller", "interface", "serial", "console",
    "parallel", "channel", "input", "graphics", "video", "sound", "audio",
    "memballoon", "rng", "watchdog", "panic", "iommu", "vsock", "hub",
    "memory", "tpm", NULL
};
static const char *const DISK[] = {
    "driver", "auth", "source", "target", "address", "boot", "readonly",
    "shareable", "serial", "wwn", "vendor", "product", "iotune", "blockio",
    "geometry", "alias", "transient", "backingStore", NULL
};
static const char *const RBD_SOURCE[] = {
    "host", "config", "auth", "snapshot", NULL
};
static const char *const INTERFACE[] = {
    "mac", "source", "model", "address", "driver", "mtu", "bandwidth",
    "link", "boot", "rom", "alias", "coalesce", "tune", "filterref",
    "virtualport", "vlan", "acpi", "target", NULL
};
static const char *const CHARDEV[] = {
    "serial", "console", "parallel", "channel", NULL
};
/* pty, a unix socket libvirt places, or nothing of the host */
static const char *const CHAR_TYPES[] = {
    "pty", "unix", "null", "vc", "spicevmc", "spiceport", "qemu-vdagent",
    NULL
};
static const char *const CHAR_CHILD[] = {
    "source", "target", "address", "log", "alias", NULL
};
static const char *const RNG_FILES[] = {
    "/dev/urandom", "/dev/random", "/dev/hwrng", NULL
};
static const char *const EMULATOR_DIRS[] = {
    "/usr/bin/", "/usr/libexec/", "/usr/local/bin/", "/usr/sbin/", NULL
};
/* Attributes libvirt reads as host paths (any other starting with "/" is
 * judged too). */
static const char *const PATH_ATTRS[] = {
    "file", "path", "dir", "socket", "template", "evdev", "tap", "vhost",
    "rendernode", NULL
};
/* Element texts that are the guest's, not host paths. */
static const char *const FREE_TEXT[] = {
    "cmdline", "title", "description", NULL
};

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

/* libxml2 wants one initialization before threads parse at once. */
static void
init_parser(void)
{
    xmlInitParser();
}

static int
in(const char *s, const char *const *set)
{
    for (; s && *set; set++)
        if (strcmp(s, *set) == 0)
            return 1;
    return 0;
}

static const char *
nm(const xmlNode *n)
{
    return (const char *)n->name;
}

static int
elem(const xmlNode *n)
{
    return n->type == XML_ELEMENT_NODE;
}

/* The attribute's value (free it), NULL when absent. */
static char *
prop(const xmlNode *n, const char *name)
{
    return (char *)xmlGetProp(n, (const xmlChar *)name);
}

static int
prop_is(const xmlNode *n, const char *name, const char *value)
{
    char *v = prop(n, name);
    int rc = v && strcmp(v, value) == 0;

    xmlFree(v);
    return rc;
}

static const xmlNode *
child(const xmlNode *n, const char *name)
{
    for (const xmlNode *c = n->children; c; c = c->next)
        if (elem(c) && strcmp(nm(c), name) == 0)
            return c;
    return NULL;
}

static int
has_element_child(const xmlNode *n)
{
    for (const xmlNode *c = n->children; c; c = c->next)
        if (elem(c))
            return 1;
    return 0;
}

/* Whether n has a text child that is not blank (libvirt reads an
 * element's text with XPath string(), which joins every descendant's:
 * text beside child elements would be read with them). */
static int
has_text_child(const xmlNode *n)
{
    for (const xmlNode *c = n->children; c; c = c->next) {
        if (c->type != XML_TEXT_NODE && c->type != XML_CDATA_SECTION_NODE)
            continue;
        for (const xmlChar *t = c->content; t && *t; t++)
            if (!strchr(" \t\r\n", *t))
                return 1;
    }
    return 0;
}

/* The element's text without surrounding blanks, in buf ("" when it has
 * child elements or no text); -1 when it does not fit (never judged cut:
 * a cut path could pass a prefix that the whole one does not). */
static int
text_of(const xmlNode *n, char *buf, size_t len)
{
    xmlChar *v;
    const char *s;
    size_t l;
    int rc = 0;

    buf[0] = '\0';
    if (has_element_child(n) || !(v = xmlNodeGetContent(n)))
        return 0;
    s = (const char *)v;
    s += strspn(s, " \t\r\n");
    l = strlen(s);
    while (l && strchr(" \t\r\n", s[l - 1]))
        l--;
    if (l >= len)
        rc = -1;
    else
        snprintf(buf, len, "%.*s", (int)l, s);
    xmlFree(v);
    return rc;
}

/* Absolute, no empty, "." or ".." component, no trailing "/". */
static int
normal_abs(const char *p)
{
    if (p[0] != '/' || !p[1])
        return 0;
    for (const char *c = p + 1;;) {
        size_t l = strcspn(c, "/");

        if (l == 0 || (l == 1 && c[0] == '.') ||
            (l == 2 && c[0] == '.' && c[1] == '.'))
            return 0;
        if (!c[l])
            return 1;
        c += l + 1;
    }
}

int
defpolicy_path_allowed(const char *path, const char *paths)
{
    char buf[1024];
    size_t plen;

    if (!path || !normal_abs(path) || !paths)
        return 0;
    for (const char *p = paths; *p;) {
        p += strspn(p, " \t");
        plen = strcspn(p, " \t");
        if (!plen)
            break;
        snprintf(buf, sizeof(buf), "%.*s", (int)plen, p);
        p += plen;
        if (plen >= sizeof(buf))
            plen = sizeof(buf) - 1;
        while (plen > 1 && buf[plen - 1] == '/')
            buf[--plen] = '\0';
        if (normal_abs(buf) && strncmp(path, buf, plen) == 0 &&
            (path[plen] == '\0' || path[plen] == '/'))
            return 1;
    }
    return 0;
}

int
defpolicy_paths_valid(const char *paths, char *why, size_t whylen)
{
    char buf[1024];
    size_t plen;

    for (const char *p = paths; *p;) {
        p += strspn(p, " \t");
        plen = strcspn(p, " \t");
        if (!plen)
            break;
        snprintf(buf, sizeof(buf), "%.*s", (int)plen, p);
        p += plen;
        if (plen >= sizeof(buf))
            plen = sizeof(buf) - 1;
        while (plen > 1 && buf[plen - 1] == '/')
            buf[--plen] = '\0';
        if (!normal_abs(buf)) {
            snprintf(why, whylen, "%s is not an absolute, normal path other "
                     "than /", buf);
            return -1;
        }
    }
    return 0;
}

struct ctx {
    const char *paths;
    char *why;
    size_t whylen;
};

static int
refuse(struct ctx *x, const char *fmt, const char *a, const char *b)
{
    snprintf(x->why, x->whylen, fmt, a, b ? b : "");
    return -1;
}

static int
check_emulator(struct ctx *x, const xmlNode *n)
{
    char p[1024];
    const char *base;
    int dir_ok = 0;

    if (text_of(n, p, sizeof(p)) < 0)
        return refuse(x, "<emulator> path too long%s%s", "", NULL);
    base = strrchr(p, '/');
    for (int i = 0; base && EMULATOR_DIRS[i]; i++)
        if (strncmp(p, EMULATOR_DIRS[i], strlen(EMULATOR_DIRS[i])) == 0 &&
            p + strlen(EMULATOR_DIRS[i]) == base + 1)
            dir_ok = 1;
    if (!dir_ok || !normal_abs(p) ||
        (fnmatch("qemu-system-*", base + 1, 0) != 0 &&
         strcmp(base + 1, "qemu-kvm") != 0 && strcmp(base + 1, "kvm") != 0))
        return refuse(x, "<emulator> %s is not a QEMU of a system "
                      "directory%s", p, NULL);
    return 0;
}

/* The children of n are all in set. */
static int
children_in(struct ctx *x, const xmlNode *n, const char *const *set,
            const char *where)
{
    for (const xmlNode *c = n->children; c; c = c->next)
        if (elem(c) && !in(nm(c), set))
            return refuse(x, "%s: <%s> is not allowed", where, nm(c));
    return 0;
}

static int
check_disk(struct ctx *x, const xmlNode *d)
{
    const xmlNode *src = child(d, "source"), *bs;
    char *device = prop(d, "device");
    int rc = -1;

    if (device && (strcmp(device, "cdrom") == 0 ||
                   strcmp(device, "floppy") == 0)) {
        rc = src ? refuse(x, "<disk device='%s'> with a <source> on the "
                          "host%s", device, NULL) : 0;
        goto cleanup;
    }
    if (device && strcmp(device, "disk") != 0) {
        refuse(x, "<disk device='%s'>: a host device passed through%s",
               device, NULL);
        goto cleanup;
    }
    if (!prop_is(d, "type", "network") || !src ||
        !prop_is(src, "protocol", "rbd")) {
        refuse(x, "<disk> that is not an RBD network disk (a host file or "
               "device)%s%s", "", NULL);
        goto cleanup;
    }
    if (children_in(x, d, DISK, "<disk>") < 0 ||
        children_in(x, src, RBD_SOURCE, "<disk><source>") < 0)
        goto cleanup;
    if ((bs = child(d, "backingStore")) && has_element_child(bs)) {
        refuse(x, "<disk> with a <backingStore> that names one%s%s", "",
               NULL);
        goto cleanup;
    }
    rc = 0;
cleanup:
    xmlFree(device);
    return rc;
}

static int
check_interface(struct ctx *x, const xmlNode *i)
{
    const xmlNode *t = child(i, "target");
    char *type = prop(i, "type");
    int rc = -1;

    if (!type || (strcmp(type, "bridge") != 0 && strcmp(type, "network"))) {
        refuse(x, "<interface type='%s'>: only bridge and network "
               "interfaces%s", type ? type : "", NULL);
        goto cleanup;
    }
    if (child(i, "script") || child(i, "downscript")) {
        refuse(x, "<interface> runs a host script (<script>)%s%s", "", NULL);
        goto cleanup;
    }
    if (children_in(x, i, INTERFACE, "<interface>") < 0)
        goto cleanup;
    if (t && prop_is(t, "managed", "no")) {
        /* an existing tap of the host's, handed to the guest */
        refuse(x, "<interface><target managed='no'>: a host device%s%s", "",
               NULL);
        goto cleanup;
    }
    rc = 0;
cleanup:
    xmlFree(type);
    return rc;
}

static int
check_device(struct ctx *x, const xmlNode *n)
{
    const char *tag = nm(n);
    char *type = NULL, buf[256];
    int rc = -1;

    if (!in(tag, DEVICES))
        return refuse(x, "<%s> is not allowed (host access, or not in the "
                      "allow-list)%s", tag, NULL);
    if (strcmp(tag, "disk") == 0)
        return check_disk(x, n);
    if (strcmp(tag, "interface") == 0)
        return check_interface(x, n);
    if (strcmp(tag, "emulator") == 0)
        return check_emulator(x, n);
    type = prop(n, "type");
    if (in(tag, CHARDEV)) {
        if (type && !in(type, CHAR_TYPES)) {
            refuse(x, "<%s type='%s'> reaches a host file or device", tag,
                   type);
            goto cleanup;
        }
        if (children_in(x, n, CHAR_CHILD, tag) < 0)
            goto cleanup;
    } else if (strcmp(tag, "input") == 0) {
        if (!type || !in(type, (const char *const[]){"mouse", "keyboard",
                                                     "tablet", NULL})) {
            refuse(x, "<input type='%s'>: a host input device%s",
                   type ? type : "", NULL);
            goto cleanup;
        }
    } else if (strcmp(tag, "rng") == 0) {
        for (const xmlNode *b = n->children; b; b = b->next) {
            if (!elem(b) || strcmp(nm(b), "backend") != 0)
                continue;
            if (text_of(b, buf, sizeof(buf)) < 0)
                snprintf(buf, sizeof(buf), "(too long)");
            if (prop_is(b, "model", "builtin") ||
                (prop_is(b, "model", "random") &&
                 (!buf[0] || in(buf, RNG_FILES))))
                continue;
            refuse(x, "<rng> backend %s%s is not allowed", buf[0] ? buf :
                   "egd", NULL);
            goto cleanup;
        }
    } else if (strcmp(tag, "tpm") == 0) {
        const xmlNode *b = child(n, "backend");
        if (b && !prop_is(b, "type", "emulator")) {
            refuse(x, "<tpm> backend that is not the emulator%s%s", "", NULL);
            goto cleanup;
        }
    }
    rc = 0;
cleanup:
    xmlFree(type);
    return rc;
}

/* Every host path under n (and n's own) is allowed; see defpolicy.h. */
static int
check_paths(struct ctx *x, const xmlNode *n, const xmlNode *parent)
{
    char buf[1024];

    if (strcmp(nm(n), "metadata") == 0)
        return 0;       /* opaque to libvirt: it acts on nothing in it */
    if (n->ns && n->ns->href) {
        /* libvirt acts on qemu:commandline and friends; nothing else
         * outside <metadata> has a namespace */
        return refuse(x, strcmp((const char *)n->ns->href, QEMU_NS) == 0 ?
                      "<qemu:%s>: QEMU arguments passed through (qemu: "
                      "namespace)%s" : "<%s>: an element of another "
                      "namespace%s", nm(n), NULL);
    }
    if (strcmp(nm(n), "seclabel") == 0)
        return refuse(x, "<seclabel> (the host labels the VM by its own "
                      "policy)%s%s", "", NULL);
    if (has_element_child(n) && in(nm(n), (const char *const[]){"kernel",
                                      "initrd", "dtb", "loader", NULL}))
        return refuse(x, "<%s> with child elements%s", nm(n), NULL);
    if (has_element_child(n) && has_text_child(n))
        return refuse(x, "<%s> with text beside its child elements%s", nm(n),
                      NULL);
    for (const xmlAttr *a = n->properties; a; a = a->next) {
        char *v = (char *)xmlNodeGetContent((const xmlNode *)a);
        int bad = v && (in((const char *)a->name, PATH_ATTRS) || v[0] == '/')
                  && !defpolicy_path_allowed(v, x->paths);

        if (bad) {
            snprintf(x->why, x->whylen, "<%s %s='%s'>: a host path not under "
                     "[libvirt] definition_paths", nm(n),
                     (const char *)a->name, v);
        }
        xmlFree(v);
        if (bad)
            return -1;
    }
    if (!in(nm(n), FREE_TEXT) && strcmp(nm(n), "emulator") != 0 &&
        !(strcmp(nm(n), "backend") == 0 && parent &&
          strcmp(nm(parent), "rng") == 0)) {
        if (text_of(n, buf, sizeof(buf)) < 0)
            return refuse(x, "<%s> text too long%s", nm(n), NULL);
        if ((buf[0] == '/' || (in(nm(n), (const char *const[]){"kernel",
                                  "initrd", "dtb", "loader", NULL}) && buf[0]))
            && !defpolicy_path_allowed(buf, x->paths))
            return refuse(x, "<%s> %s: a host path not under [libvirt] "
                          "definition_paths", nm(n), buf);
    }
    for (const xmlNode *c = n->children; c; c = c->next)
        if (elem(c) && check_paths(x, c, n) < 0)
            return -1;
    return 0;
}

int
defpolicy_check(const char *xml, size_t len, const char *paths, char *why,
                size_t whylen)
{
    struct ctx x = {.paths = paths ? paths : "", .why = why,
                    .whylen = whylen};
    xmlDocPtr doc = NULL;
    const xmlNode *root, *n;
    int rc = -1;

    pthread_once(&init_once, init_parser);
    if (len > INT_MAX) {
        snprintf(why, whylen, "domain XML too large");
        return -1;
    }
    /* No network, no entity expansion, no DTD loading. */
    doc = xmlReadMemory(xml, (int)len, "domain.xml", NULL,
                        XML_PARSE_NONET | XML_PARSE_NOERROR |
                        XML_PARSE_NOWARNING);
    if (!doc || !(root = xmlDocGetRootElement(doc)) || !elem(root) ||
        strcmp(nm(root), "domain") != 0 || root->ns) {
        snprintf(why, whylen, "not a libvirt domain XML");
        goto cleanup;
    }
    if (doc->intSubset || doc->extSubset) {
        /* entities would make libvirt read another document than this */
        snprintf(why, whylen, "a DOCTYPE in a domain XML");
        goto cleanup;
    }
    for (n = root->children; n; n = n->next) {
        if (!elem(n) || n->ns)
            continue;   /* a namespace: refused, named, by check_paths */
        if (!in(nm(n), ROOT)) {
            refuse(&x, "<domain> child <%s> is not allowed%s", nm(n), NULL);
            goto cleanup;
        }
        if (strcmp(nm(n), "os") == 0 && children_in(&x, n, OS, "<os>") < 0)
            goto cleanup;
        if (strcmp(nm(n), "devices") == 0)
            for (const xmlNode *d = n->children; d; d = d->next)
                if (elem(d) && !d->ns && check_device(&x, d) < 0)
                    goto cleanup;
    }
    if (check_paths(&x, root, NULL) < 0)
        goto cleanup;
    rc = 0;
cleanup:
    xmlFreeDoc(doc);
    return rc;
}
