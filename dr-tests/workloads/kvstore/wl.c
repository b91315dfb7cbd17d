/* wl: shared helpers of the guest workloads; see wl.h. */
#include "wl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <linux/fs.h>

void wl_log(const char *fmt, ...)
{
    va_list ap;
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    fprintf(stderr, "%ld.%03ld [%d] ", (long)ts.tv_sec,
            ts.tv_nsec / 1000000, (int)getpid());
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void wl_fatal(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "FATAL [%d] ", (int)getpid());
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xedb88320U ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t wl_crc32(uint32_t crc, const void *buf, size_t len)
{
    const uint8_t *p = buf;

    pthread_once(&crc_once, crc_init);
    crc = ~crc;
    while (len--)
        crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

uint64_t wl_fnv64(uint64_t h, const void *buf, size_t len)
{
    const uint8_t *p = buf;

    while (len--) {
        h ^= *p++;
        h *= 0x100000001b3ULL;
    }
    return h;
}

uint64_t wl_mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

void wl_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

void wl_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

uint32_t wl_get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

uint64_t wl_get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* ---- disk ---- */

struct pending {
    uint64_t off;
    size_t len;
    struct pending *next;
    uint8_t data[];
};

struct wl_dev {
    int fd;
    int nofsync;
    int simulate;
    uint64_t size;
    pthread_mutex_t mu;          /* guards the simulated page cache */
    struct pending *head, *tail;
};

struct wl_dev *wl_dev_open(const char *path, int nofsync, int simulate,
                           char *err, size_t errlen)
{
    struct wl_dev *d = NULL;
    struct stat st;
    int fd = open(path, O_RDWR | O_CLOEXEC);

    if (fd < 0) {
        snprintf(err, errlen, "open %s: %s", path, strerror(errno));
        goto cleanup;
    }
    if (fstat(fd, &st) < 0) {
        snprintf(err, errlen, "fstat %s: %s", path, strerror(errno));
        goto cleanup;
    }
    d = calloc(1, sizeof(*d));
    if (!d) {
        snprintf(err, errlen, "out of memory");
        goto cleanup;
    }
    d->fd = fd;
    d->nofsync = nofsync;
    d->simulate = simulate;
    d->size = (uint64_t)st.st_size;
    if (S_ISBLK(st.st_mode)) {
        uint64_t sz = 0;
        if (ioctl(fd, BLKGETSIZE64, &sz) < 0) {
            snprintf(err, errlen, "BLKGETSIZE64 %s: %s", path,
                     strerror(errno));
            free(d);
            d = NULL;
            goto cleanup;
        }
        d->size = sz;
    }
    pthread_mutex_init(&d->mu, NULL);
    fd = -1;
cleanup:
    if (fd >= 0)
        close(fd);
    return d;
}

struct wl_dev *wl_dev_open_or_die(const char *path, int nofsync,
                                  int simulate)
{
    char err[256];
    struct wl_dev *d = wl_dev_open(path, nofsync, simulate, err,
                                   sizeof(err));

    if (!d)
        wl_fatal("%s", err);
    return d;
}

void wl_dev_free(struct wl_dev *d)
{
    if (!d)
        return;
    while (d->head) {
        struct pending *n = d->head->next;
        free(d->head);
        d->head = n;
    }
    close(d->fd);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

uint64_t wl_dev_size(const struct wl_dev *d)
{
    return d->size;
}

int wl_dev_read(struct wl_dev *d, uint64_t off, void *buf, size_t len)
{
    size_t done = 0;

    if (off + len > d->size) {
        errno = EINVAL;
        return -1;
    }
    while (done < len) {
        ssize_t n = pread(d->fd, (uint8_t *)buf + done, len - done,
                          (off_t)(off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        done += (size_t)n;
    }
    /* Reads happen only while loading, before anything is pending; a
     * read that overlaps pending data would be a bug of the caller. */
    return 0;
}

static int dev_pwrite(int fd, uint64_t off, const void *buf, size_t len)
{
    size_t done = 0;

    while (done < len) {
        ssize_t n = pwrite(fd, (const uint8_t *)buf + done, len - done,
                           (off_t)(off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        done += (size_t)n;
    }
    return 0;
}

int wl_dev_write(struct wl_dev *d, uint64_t off, const void *buf,
                 size_t len)
{
    struct pending *p;

    if (off + len > d->size) {
        errno = ENOSPC;
        return -1;
    }
    if (!d->simulate)
        return dev_pwrite(d->fd, off, buf, len);
    p = malloc(sizeof(*p) + len);
    if (!p)
        return -1;
    p->off = off;
    p->len = len;
    p->next = NULL;
    memcpy(p->data, buf, len);
    pthread_mutex_lock(&d->mu);
    if (d->tail)
        d->tail->next = p;
    else
        d->head = p;
    d->tail = p;
    pthread_mutex_unlock(&d->mu);
    return 0;
}

int wl_dev_sync(struct wl_dev *d)
{
    int rc = 0;

    /* The negative control: with fsync off nothing is forced to the
     * disk, and under simulation the page cache is never written back. */
    if (d->nofsync)
        return 0;
    if (d->simulate) {
        pthread_mutex_lock(&d->mu);
        while (d->head) {
            struct pending *p = d->head;
            if (dev_pwrite(d->fd, p->off, p->data, p->len) < 0)
                rc = -1;
            d->head = p->next;
            free(p);
        }
        d->tail = NULL;
        pthread_mutex_unlock(&d->mu);
    }
    if (fdatasync(d->fd) < 0)
        rc = -1;
    return rc;
}

/* ---- superblock frame ---- */

int wl_sb_read(struct wl_dev *dev, uint8_t *sb, size_t size,
               uint64_t min_dev_size, const char *magic, char *err,
               size_t errlen)
{
    uint64_t dsize = wl_dev_size(dev);

    if (dsize < min_dev_size) {
        snprintf(err, errlen, "disk too small: %llu bytes",
                 (unsigned long long)dsize);
        return -1;
    }
    if (wl_dev_read(dev, 0, sb, size) < 0) {
        snprintf(err, errlen, "cannot read superblock");
        return -1;
    }
    return memcmp(sb, magic, 8) == 0 &&
           wl_get32(sb + size - 4) == wl_crc32(0, sb, size - 4);
}

int wl_sb_write(struct wl_dev *dev, uint8_t *sb, size_t size, char *err,
                size_t errlen)
{
    wl_put32(sb + size - 4, wl_crc32(0, sb, size - 4));
    if (wl_dev_write(dev, 0, sb, size) < 0 || wl_dev_sync(dev) < 0) {
        snprintf(err, errlen, "cannot write superblock");
        return -1;
    }
    return 0;
}

/* ---- network ---- */

int wl_addr_parse(const char *s, int defport, struct wl_addr *a)
{
    const char *colon = strrchr(s, ':');
    size_t hl = colon ? (size_t)(colon - s) : strlen(s);
    struct in_addr tmp;

    if (hl == 0 || hl >= sizeof(a->host))
        return -1;
    memcpy(a->host, s, hl);
    a->host[hl] = 0;
    /* strip a "/prefix" as in cp.ip=10.77.101.1/16 */
    char *slash = strchr(a->host, '/');
    if (slash)
        *slash = 0;
    if (inet_pton(AF_INET, a->host, &tmp) != 1)
        return -1;
    a->port = defport;
    if (colon) {
        char *end;
        long p = strtol(colon + 1, &end, 10);
        if (*end || p <= 0 || p > 65535)
            return -1;
        a->port = (int)p;
    }
    return 0;
}

int wl_peers_parse(const char *list, int defport, struct wl_addr *out,
                   int max, char *err, size_t errlen)
{
    char *copy = strdup(list), *save = NULL;
    int n = 0;

    if (!copy) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (char *t = strtok_r(copy, ", ", &save); t;
         t = strtok_r(NULL, ", ", &save)) {
        if (n >= max || wl_addr_parse(t, defport, &out[n]) < 0) {
            snprintf(err, errlen, "bad peer address '%s'", t);
            n = -1;
            break;
        }
        n++;
    }
    free(copy);
    return n;
}

int wl_listen(const char *host, int port)
{
    struct sockaddr_in sa;
    int one = 1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (fd < 0)
        return -1;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        goto fail;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
        listen(fd, 64) < 0)
        goto fail;
    return fd;
fail:
    close(fd);
    return -1;
}

int wl_connect(const struct wl_addr *a, int timeout_ms)
{
    struct sockaddr_in sa;
    struct pollfd pfd;
    int one = 1, soerr = 0;
    socklen_t sl = sizeof(soerr);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

    if (fd < 0)
        return -1;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)a->port);
    if (inet_pton(AF_INET, a->host, &sa.sin_addr) != 1)
        goto fail;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        if (errno != EINPROGRESS)
            goto fail;
        pfd.fd = fd;
        pfd.events = POLLOUT;
        if (poll(&pfd, 1, timeout_ms) != 1)
            goto fail;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0 || soerr)
            goto fail;
    }
    /* back to blocking: callers use simple request/reply */
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
fail:
    close(fd);
    return -1;
}

int wl_write_full(int fd, const void *buf, size_t len)
{
    size_t done = 0;

    while (done < len) {
        ssize_t n = send(fd, (const uint8_t *)buf + done, len - done,
                         MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        done += (size_t)n;
    }
    return 0;
}

int wl_read_full(int fd, void *buf, size_t len)
{
    size_t done = 0;

    while (done < len) {
        ssize_t n = recv(fd, (uint8_t *)buf + done, len - done, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        done += (size_t)n;
    }
    return 0;
}

int wl_set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

void wl_set_timeouts(int fd, int ms)
{
    struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

int wl_frame_send(int fd, const void *body, uint32_t len)
{
    uint8_t *f = malloc((size_t)len + 4);
    int rc;

    if (!f)
        return -1;
    wl_put32(f, len);
    memcpy(f + 4, body, len);
    rc = wl_write_full(fd, f, (size_t)len + 4);
    free(f);
    return rc;
}

int wl_frame_recv(int fd, uint8_t **body, uint32_t *len, uint32_t max)
{
    uint8_t hdr[4];
    uint32_t n;
    uint8_t *b;

    *body = NULL;
    if (wl_read_full(fd, hdr, 4) < 0)
        return -1;
    n = wl_get32(hdr);
    if (n > max) {
        errno = EMSGSIZE;
        return -1;
    }
    b = malloc(n ? n : 1);
    if (!b)
        return -1;
    if (wl_read_full(fd, b, n) < 0) {
        free(b);
        return -1;
    }
    *body = b;
    *len = n;
    return 0;
}

int wl_buf_add(struct wl_buf *b, const void *p, size_t len)
{
    if (b->len + len > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        while (nc < b->len + len)
            nc *= 2;
        uint8_t *np = realloc(b->p, nc);
        if (!np)
            return -1;
        b->p = np;
        b->cap = nc;
    }
    if (len)
        memcpy(b->p + b->len, p, len);
    b->len += len;
    return 0;
}

void wl_buf_free(struct wl_buf *b)
{
    if (!b)
        return;
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

int wl_args_merge(int argc, char **argv, int *out_argc, char ***out_argv)
{
    const char *env = getenv("CP_ARGS");
    char *copy = env ? strdup(env) : NULL;
    int n = 1, cap = argc + 64;
    char **v = calloc((size_t)cap + 1, sizeof(char *));

    if (!v || (env && !copy)) {
        free(v);
        free(copy);
        return -1;
    }
    v[0] = argv[0];
    if (copy) {
        /* copy is intentionally kept for the life of the process */
        for (char *tok = strtok(copy, ","); tok && n < cap - argc;
             tok = strtok(NULL, ","))
            if (*tok)
                v[n++] = tok;
    }
    for (int i = 1; i < argc; i++)
        v[n++] = argv[i];
    v[n] = NULL;
    *out_argc = n;
    *out_argv = v;
    return 0;
}

int wl_node_resolve(int node, const struct wl_addr *peers, int n,
                    int defport)
{
    const char *ip = getenv("CP_IP");

    if (node < 0 && ip) {
        struct wl_addr me;
        if (wl_addr_parse(ip, defport, &me) < 0)
            wl_fatal("bad CP_IP '%s'", ip);
        for (int i = 0; i < n; i++)
            if (strcmp(peers[i].host, me.host) == 0)
                node = i;
    }
    if (node < 0 || node >= n)
        wl_fatal("cannot tell which node this is (--node or CP_IP)");
    return node;
}

const char *wl_disk_resolve(const char *disk, char *buf, size_t len)
{
    if (!disk && getenv("CP_DISKS")) {
        snprintf(buf, len, "%s", getenv("CP_DISKS"));
        disk = strtok(buf, " ");
    }
    if (!disk)
        wl_fatal("no disk (--disk or CP_DISKS)");
    return disk;
}

uint64_t wl_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

uint64_t wl_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

void wl_window_add(struct wl_window *w, double ms)
{
    if (!w->start_us)
        w->start_us = wl_now_us();
    if (w->n < WL_WINDOW)
        w->ms[w->n++] = ms;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void wl_window_fmt(struct wl_window *w, char *buf, size_t len)
{
    uint64_t now = wl_now_us();
    double secs = w->start_us ? (double)(now - w->start_us) / 1e6 : 0;

    if (!w->n || secs <= 0) {
        snprintf(buf, len, "rate=0");
    } else {
        qsort(w->ms, (size_t)w->n, sizeof(double), cmp_double);
        snprintf(buf, len, "rate=%.1f p50=%.2f p99=%.2f max=%.2f",
                 w->n / secs, w->ms[w->n / 2], w->ms[(w->n * 99) / 100],
                 w->ms[w->n - 1]);
    }
    w->n = 0;
    w->start_us = now;
}

void wl_sleep_ms(unsigned ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}
