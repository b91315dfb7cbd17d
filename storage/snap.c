/* snap: see snap.h.  The backend table. */
#include "snap.h"

#include <string.h>

static const struct snap_ops *const backends[] = {
    &snap_rbd_ops,
    &snap_qmp_ops,
};

const struct snap_ops *
snap_backend_find(const char *name)
{
    for (size_t i = 0; i < sizeof(backends) / sizeof(backends[0]); i++)
        if (name && strcmp(backends[i]->name, name) == 0)
            return backends[i];
    return NULL;
}

const struct snap_ops *
snap_disk_backend(const struct snap_disk *d)
{
    return d->img ? &snap_rbd_ops : &snap_qmp_ops;
}
