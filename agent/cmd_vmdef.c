/*
 * cmd_vmdef: a VM's definition, for DR (agent-protocol §4.9, §4.11).
 *
 *   vm.definition{vm}   the VM's persistent definition, which the control
 *                       plane stores (versioned) and rewrites for the DR
 *                       site: a libvirt domain's inactive XML (never the
 *                       secure XML: no passwords), or a qmp VM's `start =`
 *                       command (its start template)
 *   vm.start{spec: {vm, xml, sig, transient?}}
 *                       a domain XML from the wire, defined and started
 *                       (transient: started with nothing defined, so that
 *                       vm.stop leaves no domain: a drill's copy)
 *                       only when the control plane's definition-signing
 *                       key ([libvirt] definition_key) signed that XML for
 *                       that VM name (defsig.h), and only when the XML
 *                       keeps to this agent's own policy of what a
 *                       definition may name of the host ([libvirt]
 *                       definition_paths, defpolicy.h: the signature says
 *                       who signed, not that it is safe); FORBIDDEN
 *                       otherwise, naming the element
 */
#include "cmd.h"

#include <string.h>
#include <openssl/evp.h>

#include "defpolicy.h"
#include "defsig.h"
#include "domxml.h"
#include "log.h"
#include "mono.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

/* Reading a definition is in no pause window: the manager's deadline. */
#define DEFINITION_TIMEOUT_MS 10000
/* A signed start of a VM the config does not name: the [vm] default. */
#define START_TIMEOUT_MS 60000

static void
sha256_hex(const char *s, size_t len, char out[65])
{
    unsigned char md[32];
    unsigned mdlen = 0;

    EVP_Digest(s, len, md, &mdlen, EVP_sha256(), NULL);
    for (unsigned i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
}

json_t *
cmd_vm_definition(struct agent *a, json_t *args, const char **code,
                  char *msg, size_t msglen, json_t **err_result)
{
    const char *name = json_string_value(json_object_get(args, "vm"));
    const char *format;
    struct qmp_err qe = {0};
    char *def = NULL, sum[65];
    json_t *r = NULL;
    struct vm *v;

    (void)err_result;
    if (!(v = agent_find_vm(a, name)))
        FAIL("UNKNOWN_VM", "unknown vm %s", name);
    if (v->ops->definition) {
        if (v->ops->definition(v, DEFINITION_TIMEOUT_MS, &def, &qe) < 0)
            FAIL(vm_err_code(&qe), "%s", qe.msg);
        format = v->ops->definition_format;
    } else if (v->cfg->start[0]) {
        /* A qmp VM is defined by the command that starts its QEMU. */
        def = strdup(v->cfg->start);
        format = "qmp-start-command";
    } else {
        FAIL("BAD_REQUEST", "vm %s: its driver (%s) keeps no definition and "
             "its [vm] has no start =", name, v->ops->name);
    }
    if (!def)
        FAIL("INTERNAL", "out of memory");
    sha256_hex(def, strlen(def), sum);
    log_info("event=vm_definition vm=%s format=%s bytes=%zu sha256=%s", name,
             format, strlen(def), sum);
    r = json_pack("{s:s,s:s,s:s,s:s,s:s}", "vm", name, "driver",
                  v->ops->name, "format", format, "definition", def,
                  "sha256", sum);
cleanup:
    free(def);
    return r;
}

/* The driver row and connection that start a definition; -1 none. */
static int
definer(struct agent *a, void **conn)
{
    const struct vm_ops *ops;

    for (int i = 0; (ops = vm_driver_at(i)); i++)
        if (ops->define_start && (*conn = vm_host_conn(&a->host, i)))
            return i;
    return -1;
}

json_t *
cmd_vm_start_signed(struct agent *a, json_t *spec, const char **code,
                    char *msg, size_t msglen)
{
    const char *name = json_string_value(json_object_get(spec, "vm"));
    const char *xml = json_string_value(json_object_get(spec, "xml"));
    const char *sig = json_string_value(json_object_get(spec, "sig"));
    json_t *jtransient = json_object_get(spec, "transient");
    const char *state = "shutoff";
    struct domxml *dx = NULL;
    struct qmp_err qe = {0};
    struct vm *v = NULL;
    char why[512], sum[65];
    double t0 = mono_ms(), cmd_ms = 0;
    json_t *r = NULL;
    void *conn = NULL;
    int row, claimed = 0, tmo = START_TIMEOUT_MS;

    sha256_hex(xml, strlen(xml), sum);
    if (jtransient && !json_is_boolean(jtransient))
        FAIL("BAD_REQUEST", "args.spec.transient must be a boolean");
    if (!a->cfg.definition_key[0]) {
        log_warnx("event=vm_start result=refused why=definition_from_wire");
        FAIL("FORBIDDEN", "vm.start starts only the VMs of this agent's "
             "configuration (args.spec.vm); a definition (args.spec.xml) is "
             "refused: this agent has no [libvirt] definition_key");
    }
    if (!name || !sig) {
        log_warnx("event=vm_start result=refused why=definition_unsigned");
        FAIL("FORBIDDEN", "a definition (args.spec.xml) is started only with "
             "the VM's name (args.spec.vm) and the control plane's "
             "signature (args.spec.sig)");
    }
    if (defsig_verify(a->cfg.definition_key, name, xml, strlen(xml), sig,
                      why, sizeof(why)) < 0) {
        log_warnx("event=vm_start vm=%s result=refused why=bad_signature "
                  "sha256=%s msg=\"%s\"", name, sum, why);
        FAIL("FORBIDDEN", "vm %s: definition refused: %s", name, why);
    }
    if (defpolicy_check(xml, strlen(xml), a->cfg.definition_paths, why,
                        sizeof(why)) < 0) {
        log_warnx("event=vm_start vm=%s result=refused why=definition_policy "
                  "sha256=%s msg=\"%s\"", name, sum, why);
        FAIL("FORBIDDEN", "vm %s: definition refused by this agent's policy "
             "([libvirt] definition_paths): %s", name, why);
    }
    if (!(dx = malloc(sizeof(*dx))))
        FAIL("INTERNAL", "out of memory");
    if (domxml_parse(xml, strlen(xml), dx, why, sizeof(why)) < 0)
        FAIL("BAD_REQUEST", "vm %s: definition: %s", name, why);
    if (strcmp(dx->name, name) != 0)
        FAIL("BAD_REQUEST", "vm %s: the definition names domain %s", name,
             dx->name);
    if ((row = definer(a, &conn)) < 0)
        FAIL("BAD_REQUEST", "vm %s: no VM driver of this agent defines a "
             "domain ([libvirt] uri)", name);
    if ((v = agent_find_vm(a, name))) {
        if (v->ops != vm_driver_at(row))
            FAIL("BAD_REQUEST", "vm %s is a %s VM here, not %s", name,
                 v->ops->name, vm_driver_at(row)->name);
        pthread_mutex_lock(&a->mu);
        if (v->starting) {
            pthread_mutex_unlock(&a->mu);
            FAIL("BUSY", "vm %s: a vm.start is already running", name);
        }
        v->starting = claimed = 1;
        pthread_mutex_unlock(&a->mu);
        tmo = v->cfg->start_timeout_ms;
    }
    log_info("event=vm_start_begin vm=%s definition=signed sha256=%s "
             "transient=%s", name, sum, json_is_true(jtransient) ? "yes" :
             "no");
    if (vm_driver_at(row)->define_start(conn, name, xml,
                                        json_is_true(jtransient), tmo,
                                        &state, &cmd_ms, &qe) < 0) {
        log_warnx("event=vm_start_failed vm=%s msg=\"%s\"", name, qe.msg);
        FAIL(vm_err_code(&qe), "%s", qe.msg);
    }
    if (strcmp(state, "shutoff") != 0) {
        log_info("event=vm_start vm=%s result=already_%s", name, state);
        r = json_pack("{s:s,s:s,s:f,s:b,s:s}", "vm", name, "state", state,
                      "start_ms", 0.0, "already_running", 1,
                      "definition", "signed");
        goto cleanup;
    }
    if (v && v->images_deferred) {
        if (agent_open_images(a, v, why, sizeof(why)) < 0)
            FAIL("SNAPSHOT_FAILED", "vm %s started, but its rbd disks cannot "
                 "be opened: %s", name, why);
        v->images_deferred = 0;
    }
    log_info("event=vm_start vm=%s result=started definition=signed "
             "start_ms=%.3f command_ms=%.3f", name, mono_ms() - t0, cmd_ms);
    r = json_pack("{s:s,s:s,s:f,s:f,s:b,s:s}", "vm", name, "state",
                  "running", "start_ms", mono_ms() - t0, "command_ms",
                  cmd_ms, "already_running", 0, "definition", "signed");
cleanup:
    if (claimed) {
        pthread_mutex_lock(&a->mu);
        v->starting = 0;
        pthread_mutex_unlock(&a->mu);
    }
    free(dx);
    return r;
}
