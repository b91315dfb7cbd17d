/* journal: see journal.h. */
#include "journal.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const kind_name[] = {
    [JOURNAL_PAUSED] = "paused",
    [JOURNAL_FROZEN] = "frozen",
};

struct journal {
    char *path;
    pthread_mutex_t mu;
    struct journal_entry *e;
    int n, cap;
};

static int
persist(struct journal *j, char *err, size_t errlen)
{
    char tmp[4096], dir[4096];
    const char *err_op = "open";
    FILE *f = NULL;
    int fd = -1, dfd = -1, ret = -1;

    snprintf(tmp, sizeof(tmp), "%s.tmp", j->path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        goto cleanup;
    f = fdopen(fd, "w");
    if (!f)
        goto cleanup;
    fd = -1;
    err_op = "write";
    for (int i = 0; i < j->n; i++)
        if (fprintf(f, "%s %s %s\n", kind_name[j->e[i].kind], j->e[i].txn,
                    j->e[i].vm) < 0)
            goto cleanup;
    if (fflush(f) != 0)
        goto cleanup;
    err_op = "fsync";
    if (fsync(fileno(f)) < 0)
        goto cleanup;
    err_op = "close";
    if (fclose(f) != 0) {
        f = NULL;
        goto cleanup;
    }
    f = NULL;
    err_op = "rename";
    if (rename(tmp, j->path) < 0)
        goto cleanup;
    /* The rename is durable only once the directory entry is. */
    err_op = "fsync-dir";
    snprintf(dir, sizeof(dir), "%s", j->path);
    dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd) < 0)
        goto cleanup;
    ret = 0;
cleanup:
    if (ret < 0)
        snprintf(err, errlen, "journal %s: %s failed: %s", j->path, err_op,
                 strerror(errno));
    if (f)
        fclose(f);
    if (fd >= 0)
        close(fd);
    if (dfd >= 0)
        close(dfd);
    return ret;
}

int
journal_open(const char *path, struct journal **out, char *err,
             size_t errlen)
{
    struct journal *j;
    char line[512], kind[16], txn[129], vm[256];
    FILE *f;

    j = calloc(1, sizeof(*j));
    if (!j || !(j->path = strdup(path))) {
        free(j);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    pthread_mutex_init(&j->mu, NULL);
    f = fopen(path, "r");
    if (!f && errno != ENOENT) {
        snprintf(err, errlen, "journal %s: open failed: %s", path,
                 strerror(errno));
        journal_free(j);
        return -1;
    }
    while (f && fgets(line, sizeof(line), f)) {
        /* Unparseable lines are skipped: a torn line cannot exist (rename
         * is atomic), so this is only a hand-edited file. */
        enum journal_kind k;

        if (sscanf(line, "%15s %128s %255s", kind, txn, vm) != 3)
            continue;
        if (strcmp(kind, kind_name[JOURNAL_PAUSED]) == 0)
            k = JOURNAL_PAUSED;
        else if (strcmp(kind, kind_name[JOURNAL_FROZEN]) == 0)
            k = JOURNAL_FROZEN;
        else
            continue;
        if (j->n == j->cap) {
            int ncap = j->cap ? j->cap * 2 : 16;
            struct journal_entry *ne = realloc(j->e, (size_t)ncap *
                                               sizeof(*ne));
            if (!ne)
                break;
            j->e = ne;
            j->cap = ncap;
        }
        j->e[j->n].kind = k;
        snprintf(j->e[j->n].txn, sizeof(j->e[j->n].txn), "%s", txn);
        snprintf(j->e[j->n].vm, sizeof(j->e[j->n].vm), "%s", vm);
        j->n++;
    }
    if (f)
        fclose(f);
    *out = j;
    return 0;
}

void
journal_free(struct journal *j)
{
    if (!j)
        return;
    pthread_mutex_destroy(&j->mu);
    free(j->e);
    free(j->path);
    free(j);
}

int
journal_entries(struct journal *j, struct journal_entry **out, int *n)
{
    pthread_mutex_lock(&j->mu);
    *out = malloc(sizeof(**out) * (size_t)(j->n ? j->n : 1));
    if (*out)
        memcpy(*out, j->e, sizeof(**out) * (size_t)j->n);
    *n = j->n;
    pthread_mutex_unlock(&j->mu);
    return *out ? 0 : -1;
}

/* Index of the (kind, vm) entry, or j->n. Caller holds mu. */
static int
find(struct journal *j, enum journal_kind kind, const char *vm)
{
    int i;

    for (i = 0; i < j->n; i++)
        if (j->e[i].kind == kind && strcmp(j->e[i].vm, vm) == 0)
            break;
    return i;
}

/* Sets one entry in memory; 0 or -1 (out of memory). Caller holds mu. */
static int
put(struct journal *j, const struct journal_entry *e)
{
    int i = find(j, e->kind, e->vm);

    if (i == j->n) {
        if (j->n == j->cap) {
            int ncap = j->cap ? j->cap * 2 : 16;
            struct journal_entry *ne = realloc(j->e, (size_t)ncap *
                                               sizeof(*ne));
            if (!ne)
                return -1;
            j->e = ne;
            j->cap = ncap;
        }
        j->n++;
    }
    j->e[i] = *e;
    return 0;
}

int
journal_put(struct journal *j, const struct journal_entry *e, int n,
            char *err, size_t errlen)
{
    struct journal_entry *saved = NULL;
    int saved_n, ret = -1;

    pthread_mutex_lock(&j->mu);
    saved_n = j->n;
    saved = malloc(sizeof(*saved) * (size_t)(j->n ? j->n : 1));
    if (!saved) {
        snprintf(err, errlen, "out of memory");
        goto cleanup;
    }
    memcpy(saved, j->e, sizeof(*saved) * (size_t)j->n);
    for (int i = 0; i < n; i++)
        if (put(j, &e[i]) < 0) {
            snprintf(err, errlen, "out of memory");
            goto restore;
        }
    ret = persist(j, err, errlen);
    if (ret == 0)
        goto cleanup;
restore:
    /* not durable: do not pretend it is recorded */
    memcpy(j->e, saved, sizeof(*saved) * (size_t)saved_n);
    j->n = saved_n;
    ret = -1;
cleanup:
    pthread_mutex_unlock(&j->mu);
    free(saved);
    return ret;
}

int
journal_add_many(struct journal *j, const char *txn, const char *const *vms,
                 int n, char *err, size_t errlen)
{
    struct journal_entry *e = malloc(sizeof(*e) * (size_t)(n ? n : 1));
    int ret;

    if (!e) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        e[i].kind = JOURNAL_PAUSED;
        snprintf(e[i].txn, sizeof(e[i].txn), "%s", txn);
        snprintf(e[i].vm, sizeof(e[i].vm), "%s", vms[i]);
    }
    ret = journal_put(j, e, n, err, errlen);
    free(e);
    return ret;
}

int
journal_add(struct journal *j, const char *txn, const char *vm, char *err,
            size_t errlen)
{
    const char *vms[1] = {vm};

    return journal_add_many(j, txn, vms, 1, err, errlen);
}

int
journal_remove(struct journal *j, const char *vm, char *err, size_t errlen)
{
    return journal_remove_kind(j, JOURNAL_PAUSED, vm, NULL, err, errlen);
}

int
journal_remove_kind(struct journal *j, enum journal_kind kind,
                    const char *vm, const char *txn, char *err,
                    size_t errlen)
{
    int i, ret = 0;

    pthread_mutex_lock(&j->mu);
    i = find(j, kind, vm);
    if (i < j->n && (!txn || strcmp(j->e[i].txn, txn) == 0)) {
        j->e[i] = j->e[j->n - 1];
        j->n--;
        ret = persist(j, err, errlen);
    }
    pthread_mutex_unlock(&j->mu);
    return ret;
}
