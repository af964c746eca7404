/* Reads the fake GPU node's spec (spec.h) with libyaml. Unknown keys and values of
 * the wrong type are errors naming the file and line: a typo in a test's spec must
 * not silently describe a healthy GPU. */
#include "spec.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

/* nvmlReturn_t values, as nvml.h numbers them. */
static const struct {
    const char *name;
    int code;
} codes[] = {
    {"SUCCESS", 0},
    {"UNINITIALIZED", 1},
    {"INVALID_ARGUMENT", 2},
    {"NOT_SUPPORTED", 3},
    {"NO_PERMISSION", 4},
    {"ALREADY_INITIALIZED", 5},
    {"NOT_FOUND", 6},
    {"INSUFFICIENT_SIZE", 7},
    {"INSUFFICIENT_POWER", 8},
    {"DRIVER_NOT_LOADED", 9},
    {"TIMEOUT", 10},
    {"IRQ_ISSUE", 11},
    {"LIBRARY_NOT_FOUND", 12},
    {"FUNCTION_NOT_FOUND", 13},
    {"CORRUPTED_INFOROM", 14},
    {"GPU_IS_LOST", 15},
    {"RESET_REQUIRED", 16},
    {"OPERATING_SYSTEM", 17},
    {"LIB_RM_VERSION_MISMATCH", 18},
    {"IN_USE", 19},
    {"MEMORY", 20},
    {"NO_DATA", 21},
    {"VGPU_ECC_NOT_SUPPORTED", 22},
    {"INSUFFICIENT_RESOURCES", 23},
    {"FREQ_NOT_SUPPORTED", 24},
    {"ARGUMENT_VERSION_MISMATCH", 25},
    {"DEPRECATED", 26},
    {"NOT_READY", 27},
    {"GPU_NOT_FOUND", 28},
    {"INVALID_STATE", 29},
    {"UNKNOWN", 999},
};

int spec_error_code(const char *name) {
    if (strncmp(name, "NVML_ERROR_", 11) == 0)
        name += 11;
    else if (strcmp(name, "NVML_SUCCESS") == 0)
        name = "SUCCESS";
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        if (strcmp(codes[i].name, name) == 0)
            return codes[i].code;
    char *end;
    long n = strtol(name, &end, 10);
    if (*name && !*end && n >= 0 && n <= 999)
        return (int)n;
    return -1;
}

static int find_error(const struct call_error *errors, int n, const char *call) {
    for (int i = 0; i < n; i++)
        if (strcmp(errors[i].call, call) == 0)
            return errors[i].code;
    return 0;
}

int spec_call_error(const struct spec *spec, const struct device *device, const char *call) {
    int code = device ? find_error(device->errors, device->nerrors, call) : 0;
    return code ? code : find_error(spec->errors, spec->nerrors, call);
}

/* -- walking the document ---------------------------------------------------- */

struct walk {
    yaml_document_t *doc;
    const char *path;
    char *why;
    size_t why_len;
};

static int fail(struct walk *w, yaml_node_t *node, const char *fmt, ...) {
    char detail[256];
    va_list args;
    va_start(args, fmt);
    vsnprintf(detail, sizeof detail, fmt, args);
    va_end(args);
    snprintf(w->why, w->why_len, "%s:%lu: %s", w->path,
             node ? (unsigned long)node->start_mark.line + 1 : 0UL, detail);
    return -1;
}

static const char *scalar(yaml_node_t *node) {
    return node && node->type == YAML_SCALAR_NODE ? (const char *)node->data.scalar.value : NULL;
}

static int is_null(yaml_node_t *node) {
    const char *s = scalar(node);
    return s && node->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
           (!*s || strcmp(s, "null") == 0 || strcmp(s, "~") == 0 || strcmp(s, "Null") == 0 ||
            strcmp(s, "NULL") == 0);
}

static int get_bool(struct walk *w, yaml_node_t *node, const char *key, int *out) {
    const char *s = scalar(node);
    if (is_null(node)) {
        *out = 0;
        return 0;
    }
    if (s && (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE"))) {
        *out = 1;
        return 0;
    }
    if (s && (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE"))) {
        *out = 0;
        return 0;
    }
    return fail(w, node, "%s: expected true or false, got %s", key, s ? s : "a collection");
}

static int get_ull(struct walk *w, yaml_node_t *node, const char *key, unsigned long long max,
                   unsigned long long *out) {
    const char *s = scalar(node);
    if (is_null(node)) {
        *out = 0;
        return 0;
    }
    if (s && *s && *s != '-') {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(s, &end, 10);
        if (!*end && !errno && n <= max) {
            *out = n;
            return 0;
        }
    }
    return fail(w, node, "%s: expected a whole number from 0 to %llu, got %s", key, max,
                s ? s : "a collection");
}

static int get_uint(struct walk *w, yaml_node_t *node, const char *key, unsigned *out) {
    unsigned long long n;
    if (get_ull(w, node, key, 0xffffffffULL, &n))
        return -1;
    *out = (unsigned)n;
    return 0;
}

static int get_int(struct walk *w, yaml_node_t *node, const char *key, int *out) {
    unsigned long long n;
    if (get_ull(w, node, key, 0x7fffffffULL, &n))
        return -1;
    *out = (int)n;
    return 0;
}

static int get_double(struct walk *w, yaml_node_t *node, const char *key, double *out) {
    const char *s = scalar(node);
    if (is_null(node)) {
        *out = 0;
        return 0;
    }
    if (s && *s) {
        char *end;
        double d = strtod(s, &end);
        if (!*end && d >= 0) {
            *out = d;
            return 0;
        }
    }
    return fail(w, node, "%s: expected a number of seconds, got %s", key, s ? s : "a collection");
}

static int get_str(struct walk *w, yaml_node_t *node, const char *key, char *out, size_t len) {
    const char *s = scalar(node);
    if (!s || is_null(node))
        return fail(w, node, "%s: expected a string", key);
    if (strlen(s) >= len)
        return fail(w, node, "%s: longer than %zu characters", key, len - 1);
    memcpy(out, s, strlen(s) + 1);
    return 0;
}

/* Calls fn(w, key, value, ctx) for each pair of a mapping. */
typedef int (*pair_fn)(struct walk *, const char *, yaml_node_t *, void *);

static int each_pair(struct walk *w, yaml_node_t *node, const char *what, pair_fn fn, void *ctx) {
    if (is_null(node))
        return 0;
    if (!node || node->type != YAML_MAPPING_NODE)
        return fail(w, node, "%s: expected a mapping", what);
    for (yaml_node_pair_t *p = node->data.mapping.pairs.start; p < node->data.mapping.pairs.top;
         p++) {
        yaml_node_t *key = yaml_document_get_node(w->doc, p->key);
        const char *k = scalar(key);
        if (!k)
            return fail(w, key, "%s: keys must be strings", what);
        if (fn(w, k, yaml_document_get_node(w->doc, p->value), ctx))
            return -1;
    }
    return 0;
}

static int sequence(struct walk *w, yaml_node_t *node, const char *what, yaml_node_item_t **start,
                    yaml_node_item_t **top) {
    if (is_null(node)) {
        *start = *top = NULL;
        return 0;
    }
    if (!node || node->type != YAML_SEQUENCE_NODE)
        return fail(w, node, "%s: expected a list", what);
    *start = node->data.sequence.items.start;
    *top = node->data.sequence.items.top;
    return 0;
}

struct errors_ctx {
    struct call_error *errors;
    int *n;
};

static int error_pair(struct walk *w, const char *call, yaml_node_t *value, void *ctx) {
    struct errors_ctx *e = ctx;
    const char *name = scalar(value);
    int code = name ? spec_error_code(name) : -1;
    if (code < 0)
        return fail(w, value, "errors: %s: not an NVML error name (e.g. NOT_SUPPORTED)", call);
    if (*e->n >= MAX_ERRORS)
        return fail(w, value, "errors: more than %d calls", MAX_ERRORS);
    if (strlen(call) >= sizeof e->errors[0].call)
        return fail(w, value, "errors: %s: not an NVML function name", call);
    struct call_error *slot = &e->errors[(*e->n)++];
    strcpy(slot->call, call);
    slot->code = code;
    return 0;
}

static int rows_pair(struct walk *w, const char *key, yaml_node_t *value, void *ctx) {
    struct device *d = ctx;
    int b;
    if (!strcmp(key, "pending")) {
        if (get_bool(w, value, "remappedRows.pending", &b))
            return -1;
        d->rows_pending = (unsigned)b;
    } else if (!strcmp(key, "failure")) {
        if (get_bool(w, value, "remappedRows.failure", &b))
            return -1;
        d->rows_failure = (unsigned)b;
    } else if (!strcmp(key, "correctable")) {
        return get_uint(w, value, "remappedRows.correctable", &d->rows_correctable);
    } else if (!strcmp(key, "uncorrectable")) {
        return get_uint(w, value, "remappedRows.uncorrectable", &d->rows_uncorrectable);
    } else {
        return fail(w, value, "remappedRows: unknown key %s", key);
    }
    return 0;
}

static int pcie_pair(struct walk *w, const char *key, yaml_node_t *value, void *ctx) {
    struct device *d = ctx;
    if (!strcmp(key, "replays"))
        return get_uint(w, value, "pcie.replays", &d->pcie_replays);
    if (!strcmp(key, "width"))
        return get_uint(w, value, "pcie.width", &d->pcie_width);
    if (!strcmp(key, "maxWidth"))
        return get_uint(w, value, "pcie.maxWidth", &d->pcie_max_width);
    if (!strcmp(key, "generation"))
        return get_uint(w, value, "pcie.generation", &d->pcie_generation);
    if (!strcmp(key, "maxGeneration"))
        return get_uint(w, value, "pcie.maxGeneration", &d->pcie_max_generation);
    return fail(w, value, "pcie: unknown key %s", key);
}

static int power_pair(struct walk *w, const char *key, yaml_node_t *value, void *ctx) {
    struct device *d = ctx;
    double watts;
    if (strcmp(key, "drawW") && strcmp(key, "limitW"))
        return fail(w, value, "power: unknown key %s", key);
    if (get_double(w, value, key, &watts))
        return -1;
    if (watts < 0 || watts > 100000)
        return fail(w, value, "power.%s: expected 0 to 100000 watts", key);
    *(!strcmp(key, "drawW") ? &d->power_draw_mw : &d->power_limit_mw) = (unsigned)(watts * 1000);
    return 0;
}

static int nvlink_errors_pair(struct walk *w, const char *key, yaml_node_t *value, void *ctx) {
    struct device *d = ctx;
    if (!strcmp(key, "crcFlit"))
        return get_ull(w, value, "nvlinkErrors.crcFlit", ~0ULL, &d->nvlink_crc_flit);
    if (!strcmp(key, "crcData"))
        return get_ull(w, value, "nvlinkErrors.crcData", ~0ULL, &d->nvlink_crc_data);
    if (!strcmp(key, "replay"))
        return get_ull(w, value, "nvlinkErrors.replay", ~0ULL, &d->nvlink_replay);
    if (!strcmp(key, "recovery"))
        return get_ull(w, value, "nvlinkErrors.recovery", ~0ULL, &d->nvlink_recovery);
    return fail(w, value, "nvlinkErrors: unknown key %s", key);
}

static int fabric_pair(struct walk *w, const char *key, yaml_node_t *value, void *ctx) {
    struct device *d = ctx;
    if (!strcmp(key, "state"))
        return get_uint(w, value, "fabric.state", &d->fabric_state);
    if (!strcmp(key, "status"))
        return get_int(w, value, "fabric.status", &d->fabric_status);
    if (!strcmp(key, "healthMask"))
        return get_uint(w, value, "fabric.healthMask", &d->fabric_health_mask);
    return fail(w, value, "fabric: unknown key %s", key);
}

static int proc_pair(struct walk *w, const char *key, yaml_node_t *value, void *ctx) {
    struct proc *p = ctx;
    if (!strcmp(key, "pid"))
        return get_uint(w, value, "processes.pid", &p->pid);
    if (!strcmp(key, "usedMemoryMiB")) {
        unsigned long long mib;
        if (get_ull(w, value, "processes.usedMemoryMiB", 1ULL << 40, &mib))
            return -1;
        p->used_bytes = mib << 20;
        return 0;
    }
    return fail(w, value, "processes: unknown key %s", key);
}

static int device_pair(struct walk *w, const char *key, yaml_node_t *value, void *ctx) {
    struct device *d = ctx;
    yaml_node_item_t *i, *top;
    if (!strcmp(key, "uuid"))
        return get_str(w, value, key, d->uuid, sizeof d->uuid);
    if (!strcmp(key, "devicePath"))
        return get_str(w, value, key, d->device_path, sizeof d->device_path);
    if (!strcmp(key, "pciBusId"))
        return get_str(w, value, key, d->pci, sizeof d->pci);
    if (!strcmp(key, "name"))
        return get_str(w, value, key, d->name, sizeof d->name);
    if (!strcmp(key, "temperature"))
        return get_uint(w, value, key, &d->temperature);
    if (!strcmp(key, "eccUncorrectedVolatile"))
        return get_ull(w, value, key, ~0ULL, &d->ecc_uncorrected_volatile);
    if (!strcmp(key, "retiredPagesPending"))
        return get_bool(w, value, key, &d->retired_pages_pending);
    if (!strcmp(key, "recoveryAction"))
        return get_uint(w, value, key, &d->recovery_action);
    if (!strcmp(key, "lost"))
        return get_bool(w, value, key, &d->lost);
    if (!strcmp(key, "hangSeconds"))
        return get_double(w, value, key, &d->hang_seconds);
    if (!strcmp(key, "resetFailures"))
        return get_int(w, value, key, &d->reset_failures);
    if (!strcmp(key, "migSupported"))
        return get_bool(w, value, key, &d->mig_supported);
    if (!strcmp(key, "clocksEventReasons"))
        return get_ull(w, value, key, 0xffffffffULL, &d->clocks_event_reasons);
    if (!strcmp(key, "persistenceMode"))
        return get_bool(w, value, key, &d->persistence_mode);
    if (!strcmp(key, "vbios"))
        return get_str(w, value, key, d->vbios, sizeof d->vbios);
    if (!strcmp(key, "utilization")) {
        if (get_uint(w, value, key, &d->utilization))
            return -1;
        return d->utilization > 100 ? fail(w, value, "utilization: at most 100") : 0;
    }
    if (!strcmp(key, "pcie"))
        return each_pair(w, value, key, pcie_pair, d);
    if (!strcmp(key, "power"))
        return each_pair(w, value, key, power_pair, d);
    if (!strcmp(key, "nvlinkErrors"))
        return each_pair(w, value, key, nvlink_errors_pair, d);
    if (!strcmp(key, "fabric")) {
        if (is_null(value))
            return 0; /* null: no NVSwitch fabric */
        d->has_fabric = 1;
        d->fabric_state = 3; /* NVML_GPU_FABRIC_STATE_COMPLETED */
        return each_pair(w, value, key, fabric_pair, d);
    }
    if (!strcmp(key, "errors")) {
        struct errors_ctx e = {d->errors, &d->nerrors};
        return each_pair(w, value, key, error_pair, &e);
    }
    if (!strcmp(key, "remappedRows")) {
        if (is_null(value))
            return 0; /* null: the GPU does not remap rows */
        d->has_rows = 1;
        return each_pair(w, value, key, rows_pair, d);
    }
    if (!strcmp(key, "nvlinks")) {
        /* A number of links, all up, or one boolean per link. */
        if (value && value->type == YAML_SCALAR_NODE) {
            unsigned n;
            if (get_uint(w, value, key, &n))
                return -1;
            if (n > MAX_LINKS)
                return fail(w, value, "nvlinks: at most %d", MAX_LINKS);
            d->nlinks = (int)n;
            for (unsigned l = 0; l < n; l++)
                d->link_up[l] = 1;
            return 0;
        }
        if (sequence(w, value, key, &i, &top))
            return -1;
        for (; i && i < top; i++) {
            if (d->nlinks >= MAX_LINKS)
                return fail(w, value, "nvlinks: at most %d", MAX_LINKS);
            if (get_bool(w, yaml_document_get_node(w->doc, *i), key, &d->link_up[d->nlinks]))
                return -1;
            d->nlinks++;
        }
        return 0;
    }
    if (!strcmp(key, "processes")) {
        if (sequence(w, value, key, &i, &top))
            return -1;
        for (; i && i < top; i++) {
            if (d->nprocs >= MAX_PROCS)
                return fail(w, value, "processes: at most %d", MAX_PROCS);
            struct proc *p = &d->procs[d->nprocs++];
            if (each_pair(w, yaml_document_get_node(w->doc, *i), key, proc_pair, p))
                return -1;
        }
        return 0;
    }
    if (!strcmp(key, "mig")) {
        /* Present: MIG enabled, with these MIG devices (profiles); absent: disabled. */
        if (sequence(w, value, key, &i, &top))
            return -1;
        d->mig_enabled = 1;
        for (; i && i < top; i++) {
            if (d->nmig >= MAX_MIG)
                return fail(w, value, "mig: at most %d MIG devices", MAX_MIG);
            if (get_str(w, yaml_document_get_node(w->doc, *i), key, d->mig[d->nmig],
                        sizeof d->mig[0]))
                return -1;
            d->nmig++;
        }
        return 0;
    }
    return fail(w, value, "devices: unknown key %s", key);
}

struct xid_ctx {
    struct xid_event *x;
    int has_xid;
};

static int xid_pair(struct walk *w, const char *key, yaml_node_t *value, void *ctx) {
    struct xid_ctx *c = ctx;
    if (!strcmp(key, "id")) {
        const char *s = scalar(value);
        if (!s || strlen(s) + 4 >= sizeof c->x->key)
            return fail(w, value, "xidEvents.id: expected a short scalar");
        snprintf(c->x->key, sizeof c->x->key, "id:%s", s);
        return 0;
    }
    if (!strcmp(key, "device"))
        return get_int(w, value, "xidEvents.device", &c->x->device);
    if (!strcmp(key, "xid")) {
        c->has_xid = 1;
        return get_ull(w, value, "xidEvents.xid", 0xffffffffULL, &c->x->xid);
    }
    if (!strcmp(key, "reset"))
        return get_bool(w, value, "xidEvents.reset", &c->x->reset);
    return fail(w, value, "xidEvents: unknown key %s", key);
}

static int top_pair(struct walk *w, const char *key, yaml_node_t *value, void *ctx) {
    struct spec *s = ctx;
    yaml_node_item_t *i, *top;
    if (!strcmp(key, "driverVersion"))
        return get_str(w, value, key, s->driver_version, sizeof s->driver_version);
    if (!strcmp(key, "cudaDriverVersion"))
        return get_int(w, value, key, &s->cuda_driver_version);
    if (!strcmp(key, "visible"))
        return get_int(w, value, key, &s->visible);
    if (!strcmp(key, "initError"))
        return get_bool(w, value, key, &s->init_error);
    if (!strcmp(key, "errors")) {
        struct errors_ctx e = {s->errors, &s->nerrors};
        return each_pair(w, value, key, error_pair, &e);
    }
    if (!strcmp(key, "devices")) {
        if (sequence(w, value, key, &i, &top))
            return -1;
        for (; i && i < top; i++) {
            if (s->ndevices >= MAX_DEVICES)
                return fail(w, value, "devices: at most %d", MAX_DEVICES);
            int index = s->ndevices++;
            struct device *d = &s->devices[index];
            /* The Python fake's defaults (fakenvml.py), so both read one spec alike. */
            d->temperature = 40;
            d->mig_supported = 1;
            d->pcie_width = d->pcie_max_width = 16;
            d->pcie_generation = d->pcie_max_generation = 5;
            d->power_draw_mw = 350000;
            d->power_limit_mw = 700000;
            d->persistence_mode = 1;
            snprintf(d->vbios, sizeof d->vbios, "96.00.89.00.01");
            snprintf(d->name, sizeof d->name, "NVIDIA H100 80GB HBM3");
            snprintf(d->pci, sizeof d->pci, "00000000:%02X:00.0", (unsigned)(index + 1) & 0xff);
            yaml_node_t *node = yaml_document_get_node(w->doc, *i);
            if (each_pair(w, node, key, device_pair, d))
                return -1;
            if (!d->uuid[0])
                return fail(w, node, "devices[%d]: uuid is required", index);
        }
        return 0;
    }
    if (!strcmp(key, "xidEvents")) {
        if (sequence(w, value, key, &i, &top))
            return -1;
        for (; i && i < top; i++) {
            if (s->nxids >= MAX_XIDS)
                return fail(w, value, "xidEvents: at most %d", MAX_XIDS);
            struct xid_ctx c = {&s->xids[s->nxids++], 0};
            yaml_node_t *node = yaml_document_get_node(w->doc, *i);
            if (each_pair(w, node, key, xid_pair, &c))
                return -1;
            if (!c.has_xid)
                return fail(w, node, "xidEvents: xid is required");
            if (!c.x->key[0]) /* no id: the event is its device and Xid, as in fakenvml.py */
                snprintf(c.x->key, sizeof c.x->key, "dev:%d:xid:%llu", c.x->device, c.x->xid);
        }
        return 0;
    }
    return fail(w, value, "unknown key %s", key);
}

int spec_load(const char *path, struct spec *out, char *why, size_t why_len) {
    memset(out, 0, sizeof *out);
    snprintf(out->driver_version, sizeof out->driver_version, "550.54.15");
    out->cuda_driver_version = 12040;
    out->visible = -1;
    FILE *f = fopen(path, "rb");
    if (!f) {
        int gone = errno == ENOENT;
        snprintf(why, why_len, "%s: %s", path, strerror(errno));
        return gone ? -2 : -1;
    }
    yaml_parser_t parser;
    yaml_document_t doc;
    int rc = -1;
    if (!yaml_parser_initialize(&parser)) {
        snprintf(why, why_len, "%s: cannot start the YAML parser", path);
        fclose(f);
        return -1;
    }
    yaml_parser_set_input_file(&parser, f);
    if (!yaml_parser_load(&parser, &doc)) {
        snprintf(why, why_len, "%s:%lu: YAML: %s", path,
                 (unsigned long)parser.problem_mark.line + 1,
                 parser.problem ? parser.problem : "malformed");
    } else {
        struct walk w = {&doc, path, why, why_len};
        yaml_node_t *root = yaml_document_get_root_node(&doc);
        rc = root ? each_pair(&w, root, "the spec", top_pair, out) : 0; /* empty: no GPUs */
        if (!rc && out->visible < 0)
            out->visible = out->ndevices;
        yaml_document_delete(&doc);
    }
    yaml_parser_delete(&parser);
    fclose(f);
    return rc;
}
