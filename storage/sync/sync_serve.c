/* sync_serve: see sync_serve.h. */
#include "sync_serve.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "sync_conn.h"
#include "sync_fence.h"
#include "sync_util.h"

/* A request line longer than this is refused: ours are a few hundred
 * bytes; a runaway writer must not make the session buffer without end. */
#define SERVE_LINE_MAX 65536
#define SERVE_ID_MAX 64

int
sync_exit_code(int rc)
{
    switch (rc) {
    case SYNC_OK: return 0;
    case SYNC_ENOBASE: return 3;
    case SYNC_EVERIFY: return 4;
    case SYNC_ENOSRC: return 5;
    case SYNC_EFENCED: return 6;
    default: return 1;
    }
}

json_t *
sync_error_event(int code, const char *id, const char *image,
                 const char *target, const char *message)
{
    json_t *ev = json_pack("{s:s,s:i}", "event", "error", "exit", code);

    if (ev == NULL)
        return NULL;
    if (id != NULL)
        json_object_set_new(ev, "id", json_string(id));
    if (image != NULL)
        json_object_set_new(ev, "image", json_string(image));
    if (target != NULL)
        json_object_set_new(ev, "target", json_string(target));
    json_object_set_new(ev, "message", json_string(message ? message : ""));
    return ev;
}

/* A non-empty string member of req, or NULL (*bad says why if present
 * but not one). */
static const char *
str_member(json_t *req, const char *key, const char **bad, const char *why)
{
    json_t *v = json_object_get(req, key);

    if (v == NULL)
        return NULL;
    if (!json_is_string(v) || json_string_length(v) == 0 ||
        strlen(json_string_value(v)) != json_string_length(v)) {
        *bad = why;
        return NULL;
    }
    return json_string_value(v);
}

static int
bool_member(json_t *req, const char *key, int dflt, const char **bad,
            const char *why)
{
    json_t *v = json_object_get(req, key);

    if (v == NULL)
        return dflt;
    if (!json_is_boolean(v)) {
        *bad = why;
        return dflt;
    }
    return json_is_true(v);
}

static int
known_keys(json_t *req)
{
    static const char *const keys[] = {
        "id", "image", "snap", "base", "src_pool", "dst_pool", "epoch",
        "rate_mbps", "verify_full", "full_resync"};
    const char *k;
    json_t *v;

    json_object_foreach(req, k, v) {
        size_t i;

        (void)v;
        for (i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
            if (strcmp(k, keys[i]) == 0)
                break;
        if (i == sizeof(keys) / sizeof(keys[0]))
            return -1;
    }
    return 0;
}

/* The request's fields over the session's options; *bad on the first
 * field that is wrong. */
static void
fill_opts(json_t *req, struct sync_opts *o, const char **bad)
{
    json_t *v;
    const char *s;

    o->image = str_member(req, "image", bad, "image wants a non-empty string");
    o->target = str_member(req, "snap", bad, "snap wants a non-empty string");
    if (*bad == NULL && (o->image == NULL || o->target == NULL))
        *bad = "image and snap are required";
    v = json_object_get(req, "base");
    if (*bad == NULL && v != NULL && !json_is_null(v))
        o->base = str_member(req, "base", bad,
                             "base wants a non-empty string or null");
    if (*bad == NULL && o->base != NULL && strcmp(o->base, o->target) == 0)
        *bad = "base and snap name the same snapshot";
    if (*bad == NULL && (s = str_member(req, "src_pool", bad,
                                        "src_pool wants a non-empty string")))
        o->src.pool = s;
    if (*bad == NULL && (s = str_member(req, "dst_pool", bad,
                                        "dst_pool wants a non-empty string")))
        o->dst.pool = s;
    v = json_object_get(req, "epoch");
    if (*bad == NULL && v != NULL) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            (uint64_t)json_integer_value(v) > SYNC_FENCE_MAX)
            *bad = "epoch wants a whole number from 0 to 9007199254740991";
        else
            o->epoch = (uint64_t)json_integer_value(v);
    }
    v = json_object_get(req, "rate_mbps");
    if (*bad == NULL && v != NULL) {
        if (!json_is_number(v) || json_number_value(v) < 0 ||
            json_number_value(v) > 1e6)
            *bad = "rate_mbps wants a number from 0 to 1000000";
        else
            o->rate_mbps = json_number_value(v);
    }
    if (*bad == NULL)
        o->verify_full = bool_member(req, "verify_full", o->verify_full, bad,
                                     "verify_full wants true or false");
    if (*bad == NULL)
        o->full_resync = bool_member(req, "full_resync", o->full_resync,
                                     bad, "full_resync wants true or false");
}

json_t *
sync_serve_parse(const char *line, const struct sync_opts *base,
                 struct sync_opts *o, const char **bad, const char **id_out)
{
    static char idbuf[SERVE_ID_MAX + 1];
    json_error_t jerr;
    json_t *req = NULL;
    json_t *id;

    *bad = NULL;
    *id_out = NULL;
    *o = *base;
    o->base = NULL;
    if (strlen(line) > SERVE_LINE_MAX) {
        *bad = "request line too long";
        goto cleanup;
    }
    req = json_loads(line, JSON_REJECT_DUPLICATES, &jerr);
    if (req == NULL || !json_is_object(req)) {
        *bad = "a request is one JSON object per line";
        goto cleanup;
    }
    id = json_object_get(req, "id");
    if (id != NULL) {
        if (!json_is_string(id) || json_string_length(id) == 0 ||
            json_string_length(id) > SERVE_ID_MAX ||
            strlen(json_string_value(id)) != json_string_length(id)) {
            *bad = "id wants a string of 1 to 64 characters";
            goto cleanup;
        }
        memcpy(idbuf, json_string_value(id), json_string_length(id) + 1);
        *id_out = idbuf;
    }
    if (known_keys(req) < 0) {
        *bad = "unknown key in request (known: id, image, snap, base, "
               "src_pool, dst_pool, epoch, rate_mbps, verify_full, "
               "full_resync)";
        goto cleanup;
    }
    fill_opts(req, o, bad);
cleanup:
    if (*bad != NULL) {
        json_decref(req);
        return NULL;
    }
    return req;
}

/* Every event of a request's run, tagged with the request. */
struct serve_tag {
    const char *id;
    const char *image;
    const struct sync_opts *session;
};

static void
tagged_event(const char *line, void *arg)
{
    const struct serve_tag *t = arg;
    json_t *ev = json_loads(line, 0, NULL);

    if (ev == NULL || !json_is_object(ev)) {
        json_decref(ev);
        if (t->session->on_event != NULL)
            t->session->on_event(line, t->session->arg);
        return;
    }
    if (t->id != NULL)
        json_object_set_new(ev, "id", json_string(t->id));
    if (json_object_get(ev, "image") == NULL)
        json_object_set_new(ev, "image", json_string(t->image));
    sync_emit(t->session, ev);
}

struct serve_connect {
    const struct sync_site *s;
    const char *which;
    int op_timeout_s;
    struct sync_conn c;
    int rc;
    char err[512];
};

static void *
serve_connect_run(void *arg)
{
    struct serve_connect *sc = arg;

    sc->rc = sync_conn_open(sc->s, sc->which, sc->op_timeout_s, &sc->c,
                            sc->err, sizeof(sc->err));
    return NULL;
}

/* One request line: parse, run, report. */
static void
serve_one(const struct sync_opts *base, const char *line)
{
    struct sync_opts o;
    struct sync_result r;
    struct serve_tag tag;
    const char *bad, *id;
    char err[1024];
    json_t *req;
    int rc, code;

    req = sync_serve_parse(line, base, &o, &bad, &id);
    if (req == NULL) {
        sync_emit(base, sync_error_event(2, id, NULL, NULL, bad));
        sync_logkv(base, "error", "msg=\"bad request\" error=\"%s\"", bad);
        return;
    }
    tag.id = id;
    tag.image = o.image;
    tag.session = base;
    o.on_event = tagged_event;
    o.arg = &tag;
    rc = sync_run(&o, &r, err, sizeof(err));
    code = sync_exit_code(rc);
    if (code != 0) {
        sync_emit(base, sync_error_event(code, id, o.image, o.target, err));
        for (char *p = err; *p; p++)   /* the log quotes the message */
            if (*p == '"')
                *p = '\'';
        sync_logkv(base, "error", "msg=\"sync failed\" exit=%d image=%s "
                   "target=%s error=\"%s\"", code, o.image, o.target, err);
    } else {
        sync_logkv(base, "info", "msg=\"sync done\" image=%s target=%s "
                   "mode=%s shipped=%llu changed=%llu seconds=%.3f",
                   o.image, o.target, r.already ? "already" : r.full ?
                   "full" : "incremental",
                   (unsigned long long)r.bytes_shipped,
                   (unsigned long long)r.bytes_changed, r.seconds);
    }
    json_decref(req);
}

int
sync_serve(const struct sync_opts *base, FILE *in)
{
    struct serve_connect src = {&base->src, "primary", base->op_timeout_s,
                                {0}, 0, ""};
    struct serve_connect dst = {&base->dst, "dr", base->op_timeout_s,
                                {0}, 0, ""};
    struct sync_opts session = *base;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    pthread_t t;
    uint64_t t0 = sync_now_ns();
    int joined, ret = -1;

    joined = sync_start_or_run(&t, serve_connect_run, &src);
    serve_connect_run(&dst);
    if (joined)
        pthread_join(t, NULL);
    if (src.rc < 0 || dst.rc < 0) {
        sync_emit(base, sync_error_event(1, NULL, NULL, NULL,
                                         src.rc < 0 ? src.err : dst.err));
        goto cleanup;
    }
    session.src_shared = &src.c;
    session.dst_shared = &dst.c;
    sync_emit(base, json_pack("{s:s,s:f}", "event", "ready", "connect_ms",
                              (double)(sync_now_ns() - t0) / 1e6));
    while ((n = getline(&line, &cap, in)) >= 0) {
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = '\0';
        if (n == 0)
            continue;
        serve_one(&session, line);
    }
    ret = 0;
cleanup:
    free(line);
    sync_conn_close(&src.c);
    sync_conn_close(&dst.c);
    return ret;
}
