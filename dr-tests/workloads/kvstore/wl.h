/*
 * wl: the small toolbox shared by the guest workloads cp-kvstore and
 * cp-sharedlog (CRC, raw-disk access with an optional simulated page
 * cache, blocking TCP helpers with inet_pton only, configuration from
 * the tiny-guest environment, logging).
 *
 * Everything is little-endian on disk and on the wire: both ends are
 * x86-64 and the checkers (Python) use struct '<'.
 */
#ifndef WL_H
#define WL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- logging (to stderr = the guest's serial console) ---- */
void wl_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void wl_fatal(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));

/* ---- CRC-32 (IEEE, same as zlib.crc32 so the checkers need no extra
 * module) ---- */
uint32_t wl_crc32(uint32_t crc, const void *buf, size_t len);
uint64_t wl_fnv64(uint64_t h, const void *buf, size_t len);
#define WL_FNV_INIT 0xcbf29ce484222325ULL
/* The 64-bit finalizer of MurmurHash3 (fmix64): the clients draw their
 * operations and payloads from it, and dr-tests/checkers/sharedlog.py
 * (_mix) rebuilds the payloads with the same function, so it must not
 * change. */
uint64_t wl_mix64(uint64_t x);

/* ---- little-endian helpers ---- */
void wl_put32(uint8_t *p, uint32_t v);
void wl_put64(uint8_t *p, uint64_t v);
uint32_t wl_get32(const uint8_t *p);
uint64_t wl_get64(const uint8_t *p);

/*
 * ---- disk ----
 * A disk is a raw block device (/dev/vda in the guest) or a plain file
 * (host tests).  The workloads lay out their own records on it; there is
 * no filesystem.
 *
 * Durability modes:
 *   normal      pwrite, and wl_dev_sync() = fdatasync()
 *   nofsync     wl_dev_sync() does nothing (negative control)
 *   simulate    writes are held in an in-process "page cache" and only
 *               reach the file on wl_dev_sync(); kill -9 therefore
 *               drops exactly the unsynced data, as a power cut would.
 *               Combined with nofsync, nothing written after start-up
 *               ever reaches the disk.
 */
struct wl_dev;

/* Opens PATH read-write.  Returns NULL and fills err on failure. */
struct wl_dev *wl_dev_open(const char *path, int nofsync, int simulate,
                           char *err, size_t errlen);
/* The same, for start-up: exits through wl_fatal on failure. */
struct wl_dev *wl_dev_open_or_die(const char *path, int nofsync,
                                  int simulate);
void wl_dev_free(struct wl_dev *d);
uint64_t wl_dev_size(const struct wl_dev *d);
int wl_dev_read(struct wl_dev *d, uint64_t off, void *buf, size_t len);
int wl_dev_write(struct wl_dev *d, uint64_t off, const void *buf,
                 size_t len);
int wl_dev_sync(struct wl_dev *d);

/*
 * ---- superblock frame ----
 * Both workloads start their disk with a superblock of `size` bytes: an
 * 8-byte magic at offset 0, their own fields, and the CRC-32 of the first
 * size - 4 bytes in the last 4.  What lies between is each workload's.
 *
 * wl_sb_read: reads the superblock into sb.  Returns 1 if it carries magic
 * and a good CRC, 0 if not (a blank or foreign disk: the caller formats
 * it), -1 with err filled if the disk is smaller than min_dev_size or
 * cannot be read.
 * wl_sb_write: seals sb with its CRC, writes it at offset 0 and calls
 * wl_dev_sync (which does nothing on a nofsync device: the mains open
 * the superblock's device with fsync on).  Returns 0, or -1 with err
 * filled.
 */
int wl_sb_read(struct wl_dev *dev, uint8_t *sb, size_t size,
               uint64_t min_dev_size, const char *magic, char *err,
               size_t errlen);
int wl_sb_write(struct wl_dev *dev, uint8_t *sb, size_t size, char *err,
                size_t errlen);

/* ---- network (blocking, IPv4, inet_pton only: no NSS in the guest) ---- */
struct wl_addr {
    char host[64];
    int port;
};

/* Parses "a.b.c.d[:port]"; port defaults to defport. */
int wl_addr_parse(const char *s, int defport, struct wl_addr *a);
/* Parses a peer list "A[:PORT],B[:PORT],..." (commas or spaces) into
 * out[0..max).  Returns the number of peers, or -1 with err naming the
 * first address that is bad or beyond max. */
int wl_peers_parse(const char *list, int defport, struct wl_addr *out,
                   int max, char *err, size_t errlen);
int wl_listen(const char *host, int port);
/* Connects with a timeout; returns fd or -1. */
int wl_connect(const struct wl_addr *a, int timeout_ms);
int wl_write_full(int fd, const void *buf, size_t len);
int wl_read_full(int fd, void *buf, size_t len);
int wl_set_nonblock(int fd);
void wl_set_timeouts(int fd, int ms);

/*
 * A frame is a 4-byte little-endian length then that many bytes.
 * wl_frame_recv allocates *body (caller frees).  Frames above max are
 * rejected.
 */
int wl_frame_send(int fd, const void *body, uint32_t len);
int wl_frame_recv(int fd, uint8_t **body, uint32_t *len, uint32_t max);

/* ---- growable byte buffer ---- */
struct wl_buf {
    uint8_t *p;
    size_t len, cap;
};
int wl_buf_add(struct wl_buf *b, const void *p, size_t len);
void wl_buf_free(struct wl_buf *b);

/* ---- configuration ----
 * argv and CP_ARGS (comma-separated, as in the tiny-guest contract) are
 * merged into one argument vector: CP_ARGS first, then argv, so flags on
 * the command line win.
 */
int wl_args_merge(int argc, char **argv, int *out_argc, char ***out_argv);
/*
 * Which node this is: node itself when given (>= 0), else the index of the
 * peer whose host is CP_IP's (the guest's own address).  Exits through
 * wl_fatal when CP_IP is malformed or neither names one of the n peers.
 */
int wl_node_resolve(int node, const struct wl_addr *peers, int n,
                    int defport);
/*
 * Our disk: disk itself when given, else the first word of CP_DISKS
 * (copied into buf).  Exits through wl_fatal when there is neither.
 */
const char *wl_disk_resolve(const char *disk, char *buf, size_t len);
/* Current monotonic time in milliseconds / microseconds. */
uint64_t wl_now_ms(void);
uint64_t wl_now_us(void);

/* Latency window of a client: the progress lines of the consoles carry
 * "rate=<ops/s> p50=<ms> p99=<ms> max=<ms>" for the benchmark. */
#define WL_WINDOW 256
struct wl_window {
    uint64_t start_us;
    int n;
    double ms[WL_WINDOW];
};
void wl_window_add(struct wl_window *w, double ms);
/* Formats the window into buf and starts a new one. */
void wl_window_fmt(struct wl_window *w, char *buf, size_t len);
void wl_sleep_ms(unsigned ms);

#endif
