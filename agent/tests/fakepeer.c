/* fakepeer: shared parts of the replay peers in the agent tests. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "fakepeer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int
fakepeer_read_line(int fd, char *buf, size_t cap)
{
    size_t n = 0;

    while (n + 1 < cap) {
        ssize_t k = read(fd, buf + n, 1);
        if (k <= 0)
            return -1;
        if (buf[n] == '\n')
            break;
        n++;
    }
    buf[n] = '\0';
    return 0;
}

int
fakepeer_same_execute(const json_t *got, const json_t *want)
{
    const char *g = json_string_value(json_object_get(got, "execute"));
    const char *w = json_string_value(json_object_get(want, "execute"));

    return g && w && strcmp(g, w) == 0;
}

static void
qmp_load(struct fakepeer_qmp *r, const char *name)
{
    char path[1024], line[65536];
    const char *dir = getenv("QMP_FIXTURES");
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", dir ? dir : "qmp-replies", name);
    f = fopen(path, "r");
    if (!f)
        fail_msg("cannot open fixture %s", path);
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        if ((line[0] == '<' || line[0] == '>') &&
            r->n < (int)(sizeof(r->lines) / sizeof(r->lines[0])))
            r->lines[r->n++] = strdup(line);
    }
    fclose(f);
}

/* 1 when the request got is the request want (execute, and with strict
 * also arguments). */
static int
qmp_request_matches(const struct fakepeer_qmp *r, const json_t *got,
                    const json_t *want)
{
    if (!fakepeer_same_execute(got, want))
        return 0;
    return !r->strict_args ||
        json_equal(json_object_get(got, "arguments"),
                   json_object_get(want, "arguments")) ||
        (!json_object_get(got, "arguments") &&
         !json_object_get(want, "arguments"));
}

static void *
qmp_serve(void *arg)
{
    struct fakepeer_qmp *r = arg;
    json_int_t last_id = 0;
    int requests = 0;
    char buf[65536];

    for (int i = 0; i < r->n; i++) {
        const char *l = r->lines[i] + 2;
        if (r->lines[i][0] == '>') {
            json_t *want = json_loads(l, 0, NULL), *got;
            if (fakepeer_read_line(r->fd, buf, sizeof(buf)) < 0) {
                json_decref(want);
                break;
            }
            got = json_loads(buf, 0, NULL);
            if (!qmp_request_matches(r, got, want))
                r->mismatches++;
            last_id = json_integer_value(json_object_get(got, "id"));
            json_decref(want);
            json_decref(got);
            if (r->hang_after >= 0 && ++requests > r->hang_after) {
                sleep(1);   /* a hung QEMU: read, never answer */
                break;
            }
        } else {
            json_t *m = json_loads(l, 0, NULL);
            char *s;
            size_t len, off = 0;
            if (json_object_get(m, "id"))
                json_object_set_new(m, "id", json_integer(last_id));
            s = json_dumps(m, JSON_COMPACT);
            len = strlen(s);
            s = realloc(s, len + 3);
            strcpy(s + len, "\r\n");   /* QEMU ends lines with CRLF */
            len += 2;
            while (off < len) {
                size_t n = r->chunk > 0 && (size_t)r->chunk < len - off ?
                    (size_t)r->chunk : len - off;
                if (write(r->fd, s + off, n) < 0)
                    break;
                off += n;
            }
            free(s);
            json_decref(m);
        }
    }
    return NULL;
}

int
fakepeer_qmp_start(struct fakepeer_qmp *r, const char **files, int chunk,
                   int hang_after)
{
    int sv[2];

    for (; *files; files++)
        qmp_load(r, *files);
    r->chunk = chunk;
    r->hang_after = hang_after;
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    r->fd = sv[1];
    assert_int_equal(pthread_create(&r->th, NULL, qmp_serve, r), 0);
    return sv[0];
}

void
fakepeer_qmp_finish(struct fakepeer_qmp *r)
{
    pthread_join(r->th, NULL);
    close(r->fd);
    for (int i = 0; i < r->n; i++)
        free(r->lines[i]);
    r->n = 0;
}
