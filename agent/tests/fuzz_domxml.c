/*
 * libFuzzer target: the input is a domain XML, parsed as the libvirt
 * driver parses libvirtd's live XML and the config's `xml =` files
 * (domxml.c).  What it yields must be proper C strings, and disks must
 * be named and described as domxml.h says.  The same input is judged by
 * the policy of signed definitions (defpolicy.c), with and without
 * allowed paths: it answers 0 or -1, and a refusal says why.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "defpolicy.h"
#include "domxml.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define TERMINATED(f) (strnlen((f), sizeof(f)) < sizeof(f))

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct domxml x;
    char err[256], why[512];
    static const char *const paths[] = {"", "/var/lib/cutpoint/boot "
                                        "/var/log/cutpoint/console /etc/ceph"};

    for (int i = 0; i < 2; i++) {
        int rc = defpolicy_check((const char *)data, size, paths[i], why,
                                 sizeof(why));
        if ((rc != 0 && rc != -1) ||
            (rc < 0 && (!TERMINATED(why) || !why[0])))
            abort();
    }
    if (domxml_parse((const char *)data, size, &x, err, sizeof(err)) < 0) {
        if (!TERMINATED(err) || !err[0])
            abort();
        return 0;
    }
    if (!TERMINATED(x.name) || !x.name[0] || !TERMINATED(x.uuid) ||
        x.ndisks < 0 || x.ndisks > CFG_MAX_DISKS ||
        x.nunsupported < 0 || x.nunsupported > DOMXML_MAX_UNSUPPORTED)
        abort();
    for (int i = 0; i < x.ndisks; i++) {
        const struct cfg_disk *d = &x.disks[i];
        if (!TERMINATED(d->node) || !d->node[0] || strchr(d->node, '/'))
            abort();
        if (d->backend == CFG_BACKEND_RBD &&
            (!TERMINATED(d->pool) || !d->pool[0] || !TERMINATED(d->image) ||
             !d->image[0] || strchr(d->image, '/')))
            abort();
        if (d->backend == CFG_BACKEND_QCOW2 &&
            (!TERMINATED(d->file) || d->file[0] != '/'))
            abort();
    }
    return 0;
}
