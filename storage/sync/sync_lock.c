#include "sync_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "sync_util.h"

int
sync_lock_take(const char *prog_path, int *fd_out, char *err, size_t errlen)
{
    char path[4200];
    int fd;

    snprintf(path, sizeof(path), "%s.lock", prog_path);
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        sync_seterr(err, errlen, "open %s: %s", path, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        sync_seterr(err, errlen, "another cutpoint-sync is copying this image "
                    "(%s is locked)", path);
        close(fd);
        return -1;
    }
    *fd_out = fd;
    return 0;
}

void
sync_lock_break_stale(const struct sync_opts *o, rbd_image_t dst,
                      const struct sync_progress *rec)
{
    char *owners[8];
    size_t n = 8, i;
    rbd_lock_mode_t mode;
    int rc;

    if (rec->owner[0] == '\0')
        return;
    rc = rbd_lock_get_owners(dst, &mode, owners, &n);
    if (rc < 0)
        return;            /* -ENOENT: nobody holds it */
    for (i = 0; i < n; i++) {
        if (strcmp(owners[i], rec->owner) != 0)
            continue;
        rc = rbd_lock_break(dst, mode, owners[i]);
        sync_logkv(o, rc < 0 ? "warn" : "info", "msg=\"%s stale dr lock of "
                   "a killed run\" image=%s owner=%s%s%s", rc < 0
                   ? "cannot break" : "broke", o->image, owners[i],
                   rc < 0 ? " error=" : "", rc < 0 ? strerror(-rc) : "");
    }
    rbd_lock_get_owners_cleanup(owners, n);
}
