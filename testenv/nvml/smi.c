/* nvidia-smi for machines without a GPU, over the fake GPU node's spec ($GPUHEAL_FAKE_NVML_SPEC,
 * spec.h): the two commands the agent runs.
 *
 *   nvidia-smi -r -i <uuid>       the GPU reset (gpuheal/agent/repair.py::smi_reset)
 *   nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv,noheader   the smi probe
 *                                 (gpuheal/agent/smi.py; fields: index, uuid, pci.bus_id, name)
 *
 * The reset has gpuheal/agent/fakenvml.py's FakeNvml.reset_gpu semantics: refused while a
 * process holds the GPU (a compute process of the spec, or, where the spec names the GPU's
 * `devicePath`, any other process with that file open: the device plugin, DCGM, an NVML
 * session not shut down), the first `resetFailures` resets of a GPU fail, a lost GPU cannot be
 * reset; otherwise it clears what a reset clears (the volatile ECC count, the driver's recovery
 * action, a pending row remap) in the spec, and marks the GPU's Xid events `reset: true` (a new
 * NVML session, a restarted device plugin's, is not told of them). Each reset is a line of `<spec>.resets`,
 * `<uuid> ok|failed|in-use`.
 *
 * The query answers as NVML (nvml.c) answers over the same spec: a GPU past `visible` is not
 * listed; a `lost` GPU, or one whose `errors` fail nvmlDeviceGetHandleByIndex, is an "Unable to
 * determine the device handle" line; a field whose NVML call the spec's `errors` fail is that
 * error in brackets ("[N/A]", "[GPU is lost]", "[Unknown Error]"); a GPU with `hangSeconds`
 * blocks the query that long, as its hung driver call would.
 *
 * Messages and exit codes are the real nvidia-smi's: "GPU 00000000:1A:00.0 was successfully
 * reset." (exit 0) and, for a busy GPU, "The following GPUs could not be reset:" with the GPU
 * and NVML's error string, then the advice to kill the processes (exit 255), as quoted from
 * driver 5xx output in NVIDIA/NVSentinel issue #1690 and NVIDIA/gpu-operator issue #118. Exit
 * codes 6 (a query to find an object was unsuccessful), 15 (GPU fallen off the bus) and
 * 2 (invalid argument) are the nvidia-smi(1) manual's RETURN VALUE section. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <yaml.h>

#include "spec.h"

#define EXIT_INVALID 2
#define EXIT_NOT_FOUND 6
#define EXIT_LOST 15
#define EXIT_OTHER 255

static const char *spec_path(void) {
    const char *path = getenv(SPEC_ENV);
    if (!path || !*path) {
        /* What nvidia-smi prints when it cannot load NVML (exit 12 in the manual). */
        fprintf(stderr, "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. "
                        "Please make sure that the NVIDIA Display Driver is properly installed "
                        "and present in your system.\n(gpuheal stand-in: $%s is not set)\n",
                SPEC_ENV);
        exit(12);
    }
    return path;
}

static void load(const char *path, struct spec *spec) {
    char why[512];
    if (spec_load(path, spec, why, sizeof why) != 0) {
        fprintf(stderr, "nvidia-smi (gpuheal stand-in): bad spec: %s\n", why);
        exit(EXIT_OTHER);
    }
}

/* -- the reset ---------------------------------------------------------------- */

static int failed_resets(const char *log_path, const char *uuid) {
    FILE *f = fopen(log_path, "r");
    if (!f)
        return 0;
    char line[256], want[200];
    snprintf(want, sizeof want, "%s failed", uuid);
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        n += !strcmp(line, want);
    }
    fclose(f);
    return n;
}

static void log_reset(const char *log_path, const char *uuid, const char *outcome) {
    FILE *f = fopen(log_path, "a");
    if (!f || fprintf(f, "%s %s\n", uuid, outcome) < 0 || fclose(f) != 0) {
        fprintf(stderr, "nvidia-smi (gpuheal stand-in): %s: %s\n", log_path, strerror(errno));
        exit(EXIT_OTHER);
    }
}

static yaml_node_t *lookup(yaml_document_t *doc, yaml_node_t *map, const char *key, int *pair) {
    if (!map || map->type != YAML_MAPPING_NODE)
        return NULL;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        if (k && k->type == YAML_SCALAR_NODE && !strcmp((char *)k->data.scalar.value, key)) {
            if (pair)
                *pair = (int)(p - map->data.mapping.pairs.start);
            return yaml_document_get_node(doc, p->value);
        }
    }
    return NULL;
}

/* Set map[key] to a plain scalar, adding the key when it is absent. */
static void set_plain(yaml_document_t *doc, int map_id, const char *key, const char *value) {
    yaml_node_t *node = lookup(doc, yaml_document_get_node(doc, map_id), key, NULL);
    if (node && node->type == YAML_SCALAR_NODE) {
        char *copy = strdup(value);
        if (!copy)
            exit(EXIT_OTHER);
        free(node->data.scalar.value); /* libyaml allocates with malloc */
        node->data.scalar.value = (yaml_char_t *)copy;
        node->data.scalar.length = strlen(copy);
        node->data.scalar.style = YAML_PLAIN_SCALAR_STYLE;
        return;
    }
    if (node)
        return; /* a collection where a scalar belongs: spec_load already refused it */
    int k = yaml_document_add_scalar(doc, NULL, (yaml_char_t *)key, -1, YAML_PLAIN_SCALAR_STYLE);
    int v = yaml_document_add_scalar(doc, NULL, (yaml_char_t *)value, -1, YAML_PLAIN_SCALAR_STYLE);
    if (!k || !v || !yaml_document_append_mapping_pair(doc, map_id, k, v))
        exit(EXIT_OTHER);
}

/* Rewrite the spec as a reset leaves the GPU: by rename, so readers see a whole file. */
static void clear_after_reset(const char *path, int index) {
    FILE *in = fopen(path, "rb");
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!in || !yaml_parser_initialize(&parser))
        exit(EXIT_OTHER);
    yaml_parser_set_input_file(&parser, in);
    if (!yaml_parser_load(&parser, &doc))
        exit(EXIT_OTHER); /* spec_load parsed it a moment ago */
    yaml_parser_delete(&parser);
    fclose(in);
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    yaml_node_t *devices = lookup(&doc, root, "devices", NULL);
    int id = devices->data.sequence.items.start[index];
    set_plain(&doc, id, "eccUncorrectedVolatile", "0");
    set_plain(&doc, id, "recoveryAction", "0");
    /* The GPU's past Xid events: an NVML session opened after the reset (a restarted
     * device plugin) never hears of them, as it would not on a real driver. */
    yaml_node_t *xids = lookup(&doc, root, "xidEvents", NULL);
    if (xids && xids->type == YAML_SEQUENCE_NODE) {
        char mine[16];
        snprintf(mine, sizeof mine, "%d", index);
        for (yaml_node_item_t *e = xids->data.sequence.items.start; e < xids->data.sequence.items.top; e++) {
            yaml_node_t *device = lookup(&doc, yaml_document_get_node(&doc, *e), "device", NULL);
            if (device && device->type == YAML_SCALAR_NODE && !strcmp((char *)device->data.scalar.value, mine))
                set_plain(&doc, *e, "reset", "true");
        }
    }
    yaml_node_t *rows = lookup(&doc, yaml_document_get_node(&doc, id), "remappedRows", NULL);
    if (rows && rows->type == YAML_MAPPING_NODE) {
        int rows_id = 0;
        yaml_node_t *device = yaml_document_get_node(&doc, id);
        int pair = 0;
        lookup(&doc, device, "remappedRows", &pair);
        rows_id = device->data.mapping.pairs.start[pair].value;
        set_plain(&doc, rows_id, "pending", "false");
    }
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.reset-tmp", path);
    FILE *out = fopen(tmp, "wb");
    yaml_emitter_t emitter;
    if (!out || !yaml_emitter_initialize(&emitter))
        exit(EXIT_OTHER);
    yaml_emitter_set_output_file(&emitter, out);
    yaml_emitter_set_unicode(&emitter, 1);
    int ok = yaml_emitter_open(&emitter) && yaml_emitter_dump(&emitter, &doc) &&
             yaml_emitter_close(&emitter) && yaml_emitter_flush(&emitter);
    yaml_emitter_delete(&emitter);
    if (!ok || fclose(out) != 0 || rename(tmp, path) != 0) {
        fprintf(stderr, "nvidia-smi (gpuheal stand-in): cannot rewrite %s\n", path);
        exit(EXIT_OTHER);
    }
}

/* The first process but this one that holds `path` open (scanning /proc/<pid>/fd, as
 * fuser does), or 0. A holder's pid and name are written to `who`. */
static int holder_of(const char *path, char *who, size_t who_len) {
    char want[4096];
    if (!realpath(path, want))
        return 0;
    DIR *proc = opendir("/proc");
    if (!proc)
        return 0;
    int found = 0;
    struct dirent *p;
    while (!found && (p = readdir(proc))) {
        int pid = atoi(p->d_name);
        if (pid <= 0 || pid == getpid())
            continue;
        char fds[64];
        snprintf(fds, sizeof fds, "/proc/%d/fd", pid);
        DIR *dir = opendir(fds);
        if (!dir)
            continue;
        struct dirent *f;
        while ((f = readdir(dir))) {
            char link[384], target[4096];
            snprintf(link, sizeof link, "%s/%s", fds, f->d_name);
            ssize_t n = readlink(link, target, sizeof target - 1);
            if (n > 0 && (target[n] = 0, !strcmp(target, want))) {
                found = pid;
                break;
            }
        }
        closedir(dir);
    }
    closedir(proc);
    if (found) {
        char comm_path[64], comm[64] = "?";
        snprintf(comm_path, sizeof comm_path, "/proc/%d/comm", found);
        FILE *c = fopen(comm_path, "r");
        if (c) {
            if (fgets(comm, sizeof comm, c))
                comm[strcspn(comm, "\n")] = 0;
            fclose(c);
        }
        snprintf(who, who_len, "%d (%s)", found, comm);
    }
    return found;
}

static int reset(const char *uuid) {
    const char *path = spec_path();
    static struct spec spec;
    load(path, &spec);
    int index = -1;
    for (int i = 0; i < spec.ndevices && i < spec.visible; i++)
        if (!strcmp(spec.devices[i].uuid, uuid))
            index = i;
    if (index < 0) {
        printf("No devices were found\n");
        return EXIT_NOT_FOUND;
    }
    const struct device *d = &spec.devices[index];
    char log_path[4096];
    snprintf(log_path, sizeof log_path, "%s.resets", path);
    if (d->lost) {
        log_reset(log_path, uuid, "failed");
        printf("Unable to determine the device handle for GPU %s: GPU is lost. "
               "Reboot the system to recover this GPU\n", d->pci);
        return EXIT_LOST;
    }
    char who[128] = "";
    if (d->nprocs || (d->device_path[0] && holder_of(d->device_path, who, sizeof who))) {
        log_reset(log_path, uuid, "in-use");
        printf("The following GPUs could not be reset:\n  GPU %s: In use by another client\n\n"
               "1 device is currently being used by one or more other processes (e.g., Fabric "
               "Manager, CUDA application, graphics application such as an X server, or a "
               "monitoring application such as another instance of nvidia-smi). Please first "
               "kill all processes using this device and all compute applications running in "
               "the system.\n", d->pci);
        return EXIT_OTHER;
    }
    if (failed_resets(log_path, uuid) < d->reset_failures) {
        log_reset(log_path, uuid, "failed");
        /* NVML_ERROR_RESET_REQUIRED's text, as FakeNvml.reset_gpu raises it. */
        printf("The following GPUs could not be reset:\n  GPU %s: GPU requires restart\n", d->pci);
        return EXIT_OTHER;
    }
    log_reset(log_path, uuid, "ok");
    clear_after_reset(path, index);
    printf("GPU %s was successfully reset.\n", d->pci);
    return 0;
}

/* -- the query ---------------------------------------------------------------- */

/* What nvidia-smi prints for an NVML error in a --query-gpu field (in brackets) and after
 * "Unable to determine the device handle": "[N/A]" for a reading the GPU does not
 * support, NVML's text otherwise ("[GPU is lost]", "[Unknown Error]"), as quoted from
 * real output in utkuozdemir/nvidia_gpu_exporter issues #68 and #115 ([N/A]), NVIDIA
 * k8s-test-infra's nvidia-smi e2e checks ([GPU is lost]) and dcgm-exporter issue #604
 * (Unknown Error). */
static const char *error_text(int code) {
    switch (code) {
    case 3: return "N/A";
    case 4: return "Insufficient Permissions";
    case 15: return "GPU is lost";
    case 16: return "GPU requires reset";
    default: return "Unknown Error";
    }
}

static int is_field(const char *name) {
    return !strcmp(name, "index") || !strcmp(name, "uuid") || !strcmp(name, "pci.bus_id") ||
           !strcmp(name, "name");
}

/* One field of one GPU's row: the value, or the error of the NVML call behind it. */
static void print_field(const struct spec *spec, const struct device *d, int index,
                        const char *field) {
    const char *call = !strcmp(field, "uuid")         ? "nvmlDeviceGetUUID"
                       : !strcmp(field, "pci.bus_id") ? "nvmlDeviceGetPciInfo"
                       : !strcmp(field, "name")       ? "nvmlDeviceGetName"
                                                      : NULL; /* index: nvidia-smi's own */
    int code = call ? spec_call_error(spec, d, call) : 0;
    if (code)
        printf("[%s]", error_text(code));
    else if (!call)
        printf("%d", index);
    else
        printf("%s", !strcmp(field, "uuid") ? d->uuid : !strcmp(field, "pci.bus_id") ? d->pci : d->name);
}

static void print_row(const struct spec *spec, const struct device *d, int index,
                      const char *fields) {
    char copy[256];
    snprintf(copy, sizeof copy, "%s", fields);
    const char *sep = "";
    for (char *save = NULL, *f = strtok_r(copy, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
        printf("%s", sep);
        print_field(spec, d, index, f);
        sep = ", ";
    }
    printf("\n");
}

/* The GPU's handle, as nvmlDeviceGetHandleByIndex answers it: a hung GPU blocks the
 * call (hangSeconds), a lost one answers GPU_IS_LOST (every call, as nvml.c does). */
static int open_handle(const struct spec *spec, const struct device *d) {
    if (d->hang_seconds > 0) {
        struct timespec ts = {(time_t)d->hang_seconds,
                              (long)((d->hang_seconds - (double)(time_t)d->hang_seconds) * 1e9)};
        while (nanosleep(&ts, &ts) != 0) {
        }
    }
    return d->lost ? 15 : spec_call_error(spec, d, "nvmlDeviceGetHandleByIndex");
}

static int query(const char *fields, const char *format) {
    char copy[256];
    snprintf(copy, sizeof copy, "%s", fields);
    for (char *save = NULL, *f = strtok_r(copy, ",", &save); f; f = strtok_r(NULL, ",", &save))
        if (!is_field(f)) {
            printf("Field \"%s\" is not a valid field to query.\n\n", f);
            return EXIT_INVALID;
        }
    if (strcmp(format, "csv,noheader")) {
        fprintf(stderr, "nvidia-smi (gpuheal stand-in): only --format=csv,noheader is "
                        "implemented (fields: index, uuid, pci.bus_id, name)\n");
        return EXIT_INVALID;
    }
    static struct spec spec;
    load(spec_path(), &spec);
    if (spec.init_error) {
        /* The real text when the kernel module is not loaded (exit 9 in the manual). */
        printf("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.\n\n");
        return 9;
    }
    int n = spec.visible < spec.ndevices ? spec.visible : spec.ndevices;
    if (!n) {
        printf("No devices were found\n");
        return EXIT_NOT_FOUND;
    }
    /* A GPU whose handle cannot be had is a line of its own, ahead of the others' rows
     * (as in the default view of NVIDIA/open-gpu-kernel-modules issue #387), naming its
     * bus id in the short form: "Unable to determine the device handle for
     * GPU0000:CB:00.0: Unknown Error" (leptonai/gpud's test of it), "...: GPU is lost.
     * Reboot the system to recover this GPU" (JosephKJ/OWOD issue #81). The exit code:
     * 15 for a lost GPU, the manual's "GPU has fallen off the bus"; 255 otherwise. */
    int handle[MAX_DEVICES], rc = 0;
    for (int i = 0; i < n; i++) {
        const struct device *d = &spec.devices[i];
        handle[i] = open_handle(&spec, d);
        if (!handle[i])
            continue;
        const char *pci = strlen(d->pci) > 12 ? d->pci + strlen(d->pci) - 12 : d->pci;
        printf("Unable to determine the device handle for GPU%s: %s%s\n", pci,
               error_text(handle[i]),
               handle[i] == 15 ? ". Reboot the system to recover this GPU" : "");
        rc = handle[i] == 15 || rc == EXIT_LOST ? EXIT_LOST : EXIT_OTHER;
    }
    for (int i = 0; i < n; i++)
        if (!handle[i])
            print_row(&spec, &spec.devices[i], i, fields);
    return rc;
}

int main(int argc, char **argv) {
    const char *id = NULL, *fields = NULL, *format = NULL;
    int do_reset = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-r") || !strcmp(a, "--gpu-reset"))
            do_reset = 1;
        else if ((!strcmp(a, "-i") || !strcmp(a, "--id")) && i + 1 < argc)
            id = argv[++i];
        else if (!strncmp(a, "--id=", 5))
            id = a + 5;
        else if (!strncmp(a, "--query-gpu=", 12))
            fields = a + 12;
        else if (!strncmp(a, "--format=", 9))
            format = a + 9;
        else {
            printf("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n");
            return EXIT_INVALID;
        }
    }
    if (do_reset && id && !fields)
        return reset(id);
    if (fields && format && !do_reset && !id)
        return query(fields, format);
    /* The stand-in implements only what the agent runs; say so rather than guess. */
    fprintf(stderr, "nvidia-smi (gpuheal stand-in): implemented: -r -i <uuid>; "
                    "--query-gpu=<index,uuid,pci.bus_id,name> --format=csv,noheader\n");
    return EXIT_INVALID;
}
