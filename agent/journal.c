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
    [JOURNAL_REDIRECT] = "redirect",
};

/* The first line of a framed journal.  Without it, a file is of the
 * first format: fields split on blanks, names taken literally. */
#define JOURNAL_MAGIC "cutpoint-journal 2"

/* A byte a field keeps as it is; any other is written %XX, so that a
 * field never holds a blank, a newline or a byte that is not ASCII. */
static int
plain(unsigned char c)
{
    return c > 0x20 && c < 0x7f && c != '%';
}

/* Writes s into out (3 * strlen(s) + 1 bytes at most). */
static void
encode(const char *s, char *out)
{
    static const char hex[] = "0123456789ABCDEF";

    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;

        if (plain(c)) {
            *out++ = (char)c;
        } else {
            *out++ = '%';
            *out++ = hex[c >> 4];
            *out++ = hex[c & 15];
        }
    }
    *out = '\0';
}

static int
hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Decodes the n bytes at s into out (size outlen); -1 when malformed: a
 * bad escape, a %00, a byte that encode never writes, or too long. */
static int
decode(const char *s, size_t n, char *out, size_t outlen)
{
    size_t o = 0;

    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)s[i];

        if (c == '%') {
            int hi, lo;

            if (i + 2 >= n || (hi = hexval(s[i + 1])) < 0 ||
                (lo = hexval(s[i + 2])) < 0)
                return -1;
            c = hi << 4 | lo;
            i += 2;
            if (c == 0)
                return -1;
        } else if (!plain((unsigned char)c)) {
            return -1;
        }
        if (o + 1 >= outlen)
            return -1;
        out[o++] = (char)c;
    }
    if (n == 0)
        return -1;
    out[o] = '\0';
    return 0;
}

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
    /* An empty journal stays an empty file. */
    if (j->n > 0 && fprintf(f, "%s\n", JOURNAL_MAGIC) < 0)
        goto cleanup;
    for (int i = 0; i < j->n; i++) {
        char txn[3 * sizeof(j->e[i].txn)], vm[3 * sizeof(j->e[i].vm)];

        encode(j->e[i].txn, txn);
        encode(j->e[i].vm, vm);
        if (fprintf(f, "%s %s %s\n", kind_name[j->e[i].kind], txn, vm) < 0)
            goto cleanup;
    }
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

static int
kind_of(const char *s, size_t n, enum journal_kind *k)
{
    for (int i = 0; i <= JOURNAL_REDIRECT; i++)
        if (strlen(kind_name[i]) == n && memcmp(kind_name[i], s, n) == 0) {
            *k = (enum journal_kind)i;
            return 0;
        }
    return -1;
}

/* One line of a framed journal: "<kind> <txn> <vm>", single blanks. */
static int
parse_framed(const char *line, size_t n, struct journal_entry *e)
{
    const char *sp1 = memchr(line, ' ', n), *sp2;

    if (!sp1 || kind_of(line, (size_t)(sp1 - line), &e->kind) < 0)
        return -1;
    sp1++;
    if (!(sp2 = memchr(sp1, ' ', (size_t)(line + n - sp1))))
        return -1;
    if (decode(sp1, (size_t)(sp2 - sp1), e->txn, sizeof(e->txn)) < 0 ||
        decode(sp2 + 1, (size_t)(line + n - sp2 - 1), e->vm,
               sizeof(e->vm)) < 0)
        return -1;
    return 0;
}

/* One line of the first format: fields split on blanks, taken as they
 * are (what agents before the framed format wrote). */
static int
parse_legacy(const char *line, size_t n, struct journal_entry *e)
{
    char buf[512], kind[16], txn[129], vm[256];

    if (n >= sizeof(buf))
        return -1;
    memcpy(buf, line, n);
    buf[n] = '\0';
    if (sscanf(buf, "%15s %128s %255s", kind, txn, vm) != 3 ||
        kind_of(kind, strlen(kind), &e->kind) < 0)
        return -1;
    snprintf(e->txn, sizeof(e->txn), "%s", txn);
    snprintf(e->vm, sizeof(e->vm), "%s", vm);
    return 0;
}

int
journal_parse(const char *buf, size_t len, struct journal_entry **out,
              int *n)
{
    struct journal_entry *e = NULL;
    size_t off = 0, mlen = strlen(JOURNAL_MAGIC);
    int cap = 0, framed = 0;

    *out = NULL;
    *n = 0;
    if (len >= mlen + 1 && memcmp(buf, JOURNAL_MAGIC, mlen) == 0 &&
        buf[mlen] == '\n') {
        framed = 1;
        off = mlen + 1;
    }
    while (off < len) {
        const char *line = buf + off, *nl = memchr(line, '\n', len - off);
        size_t ln = nl ? (size_t)(nl - line) : len - off;
        struct journal_entry one;

        off += ln + 1;
        /* Unparseable lines are skipped: a torn line cannot exist (rename
         * is atomic), so this is only a hand-edited file. */
        if ((framed ? parse_framed(line, ln, &one) :
             parse_legacy(line, ln, &one)) < 0)
            continue;
        if (*n == cap) {
            int ncap = cap ? cap * 2 : 16;
            struct journal_entry *ne = realloc(e, (size_t)ncap * sizeof(*ne));

            if (!ne) {
                free(e);
                *n = 0;
                return -1;
            }
            e = ne;
            cap = ncap;
        }
        e[(*n)++] = one;
    }
    *out = e;
    return 0;
}

int
journal_open(const char *path, struct journal **out, char *err,
             size_t errlen)
{
    struct journal *j;
    char *buf = NULL;
    size_t len = 0, cap = 0;
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
    while (f) {
        size_t got;

        if (len == cap) {
            char *nb = realloc(buf, cap = cap ? cap * 2 : 4096);
            if (!nb) {
                snprintf(err, errlen, "out of memory");
                goto fail;
            }
            buf = nb;
        }
        got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                snprintf(err, errlen, "journal %s: read failed: %s", path,
                         strerror(errno));
                goto fail;
            }
            break;
        }
    }
    if (journal_parse(buf ? buf : "", len, &j->e, &j->n) < 0) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    j->cap = j->n;
    if (f)
        fclose(f);
    free(buf);
    *out = j;
    return 0;
fail:
    if (f)
        fclose(f);
    free(buf);
    journal_free(j);
    return -1;
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
