/* libnvidia-ml.so.1 for machines without a GPU: NVML's C ABI over the fake GPU node's
 * spec file (spec.h), found through $GPUHEAL_FAKE_NVML_SPEC and read again whenever it
 * changes.
 *
 * The real pynvml (nvidia-ml-py) dlopens it by its ordinary name, so the agent's probe
 * code (gpuheal/agent/nvml.py) runs unchanged over real ctypes structures and the
 * versioned entry points pynvml resolves. So does go-nvml in NVIDIA's Kubernetes device
 * plugin (testenv/deviceplugin), which binds its calls lazily: a function it calls that
 * is missing here kills it. Only what the agent and the device plugin call is here
 * (testenv/deviceplugin/README.md lists the plugin's); the struct layouts and constants
 * are nvml.h's (NVML 12.x, as in NVIDIA/go-nvml's pkg/nvml/nvml.h) and agree with
 * pynvml's ctypes definitions.
 *
 * Semantics follow gpuheal/agent/fakenvml.py, the Python stand-in the unit tests use
 * (tests/unit/test_nvml_library.py runs one spec through both and compares). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "spec.h"

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

enum { NVML_TEMPERATURE_GPU = 0 };
enum { NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1 };
enum { NVML_VOLATILE_ECC = 0 };
enum { NVML_VALUE_TYPE_UNSIGNED_INT = 1, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3 };
#define NVML_FI_DEV_GET_GPU_RECOVERY_ACTION 230
#define NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL 38
#define NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL 45
#define NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL 52
#define NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL 59
#define nvmlEventTypeXidCriticalError 0x0000000000000008ULL
#define nvmlEventTypeGpuUnavailableError 0x0000000000004000ULL
/* The event types this stand-in can deliver (nvmlDeviceGetSupportedEventTypes). */
#define SUPPORTED_EVENTS (nvmlEventTypeXidCriticalError | nvmlEventTypeGpuUnavailableError)

/* A device handle is a pointer to one of these: a GPU (slot < 0) or a MIG device. */
struct nvmlDevice_st {
    int index;
    int slot;
};
typedef struct nvmlDevice_st *nvmlDevice_t;

struct nvmlEventSet_st {
    unsigned long long mask[MAX_DEVICES];
};
typedef struct nvmlEventSet_st *nvmlEventSet_t;

/* nvmlPciInfo_t (v2 and v3 share the layout). */
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
typedef struct {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

/* nvmlProcessInfo_t of the _v3 (and _v2) process queries. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    signed int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

/* nvmlGpuFabricInfo_v2_t: nvmlGpuFabricState_t is an unsigned char (pynvml reads it as
 * a c_uint over the padding after it, which its zeroed struct keeps 0). */
#define NVML_GPU_FABRIC_UUID_LEN 16
typedef struct {
    unsigned int version;
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned char state;
    unsigned int healthMask;
} nvmlGpuFabricInfo_v2_t;
#define nvmlGpuFabricInfo_v2 (unsigned int)(sizeof(nvmlGpuFabricInfo_v2_t) | (2 << 24U))

/* pynvml's ctypes mirror these; a layout change here would corrupt its reads. */
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t");
_Static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t");
_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t");
_Static_assert(sizeof(nvmlGpuFabricInfo_v2_t) == 36, "nvmlGpuFabricInfo_v2_t");

/* -- state ------------------------------------------------------------------- */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int init_count;
static struct spec *spec;          /* the last good read; never NULL again once set */
static struct stat spec_stat;      /* of the file as last read */
static char spec_problem[512];     /* why the last read failed ("" when it did not) */
static struct nvmlDevice_st gpus[MAX_DEVICES];
static struct nvmlDevice_st migs[MAX_DEVICES][MAX_MIG];
/* The device files held open while initialised (spec devicePath), as NVML holds
 * /dev/nvidia<N>: a GPU reset is refused until every session is shut down. */
static int device_fds[MAX_DEVICES];
static int ndevice_fds;
/* Xid events already delivered by this process (each once, as fakenvml.py does). */
static char (*delivered)[64];
static size_t ndelivered, delivered_cap;

static void handles_init(void) {
    for (int i = 0; i < MAX_DEVICES; i++) {
        gpus[i] = (struct nvmlDevice_st){i, -1};
        for (int s = 0; s < MAX_MIG; s++)
            migs[i][s] = (struct nvmlDevice_st){i, s};
    }
}

/* Re-read the spec when the file changed (a test rewrites it by rename, so the inode,
 * size or mtime moves). Called with the lock held. */
static nvmlReturn_t refresh(void) {
    const char *path = getenv(SPEC_ENV);
    if (!path || !*path) {
        if (strcmp(spec_problem, "unset"))
            fprintf(stderr, "libnvidia-ml (gpuheal stand-in): $%s is not set\n", SPEC_ENV);
        snprintf(spec_problem, sizeof spec_problem, "unset");
        return NVML_ERROR_LIBRARY_NOT_FOUND;
    }
    struct stat st;
    if (stat(path, &st) != 0) {
        /* No spec: no driver state to describe, as fakenvml.py answers. The last one
         * stays allocated (a call between enter() and its read may still look at it)
         * and is read afresh when the file is back. */
        memset(&spec_stat, 0, sizeof spec_stat);
        spec_stat.st_ino = (ino_t)-1;
        return NVML_ERROR_LIBRARY_NOT_FOUND;
    }
    if (spec && st.st_ino == spec_stat.st_ino && st.st_size == spec_stat.st_size &&
        st.st_mtim.tv_sec == spec_stat.st_mtim.tv_sec &&
        st.st_mtim.tv_nsec == spec_stat.st_mtim.tv_nsec)
        return NVML_SUCCESS;
    struct spec *next = malloc(sizeof *next);
    char why[512];
    if (!next)
        return NVML_ERROR_UNKNOWN;
    int loaded = spec_load(path, next, why, sizeof why);
    if (loaded == -2) { /* gone since the stat: as no spec at all, said by the code alone */
        free(next);
        memset(&spec_stat, 0, sizeof spec_stat);
        spec_stat.st_ino = (ino_t)-1;
        return NVML_ERROR_LIBRARY_NOT_FOUND;
    }
    if (loaded != 0) {
        free(next);
        if (strcmp(why, spec_problem)) /* say it once per problem, not per call */
            fprintf(stderr, "libnvidia-ml (gpuheal stand-in): bad spec: %s\n", why);
        snprintf(spec_problem, sizeof spec_problem, "%s", why);
        return NVML_ERROR_UNKNOWN;
    }
    spec_problem[0] = 0;
    free(spec);
    spec = next;
    spec_stat = st;
    return NVML_SUCCESS;
}

/* The common entry of every call after nvmlInit: initialised, spec read, the spec's
 * error for `call` if it sets one. With `handle`, the device is copied into *device
 * (so no lock is held while a hung device sleeps); a lost device fails every call. */
static nvmlReturn_t enter(const char *call, nvmlDevice_t handle, struct device *device) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = init_count ? refresh() : NVML_ERROR_UNINITIALIZED;
    int index = -1;
    if (!rc && handle) {
        int gpu = handle >= &gpus[0] && handle < &gpus[MAX_DEVICES];
        int mig = (void *)handle >= (void *)&migs[0][0] &&
                  (void *)handle < (void *)(&migs[0][0] + MAX_DEVICES * MAX_MIG);
        if (!gpu && !mig)
            rc = NVML_ERROR_INVALID_ARGUMENT;
        else if ((index = handle->index) >= spec->visible || index >= spec->ndevices)
            rc = NVML_ERROR_INVALID_ARGUMENT;
        else
            *device = spec->devices[index];
    }
    int code = rc ? 0 : spec_call_error(spec, handle && device ? device : NULL, call);
    pthread_mutex_unlock(&lock);
    if (rc)
        return rc;
    if (handle && device->hang_seconds > 0) { /* a hung driver: the call blocks */
        struct timespec ts = {(time_t)device->hang_seconds,
                              (long)((device->hang_seconds - (double)(time_t)device->hang_seconds) * 1e9)};
        while (nanosleep(&ts, &ts) != 0) {
        }
    }
    if (handle && device->lost)
        return NVML_ERROR_GPU_IS_LOST;
    return code;
}

static nvmlReturn_t copy_text(const char *text, char *buf, unsigned int length) {
    if (!buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

/* -- initialisation ---------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, handles_init);
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = refresh();
    if (!rc && spec->init_error)
        rc = NVML_ERROR_DRIVER_NOT_LOADED; /* the kernel module is not loaded */
    if (!rc)
        rc = spec_call_error(spec, NULL, "nvmlInit");
    if (!rc && init_count++ == 0) {
        ndevice_fds = 0;
        for (int i = 0; i < spec->ndevices && i < spec->visible; i++) {
            int fd = spec->devices[i].device_path[0] ? open(spec->devices[i].device_path, O_RDONLY | O_CLOEXEC) : -1;
            if (fd >= 0)
                device_fds[ndevice_fds++] = fd;
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = init_count ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (init_count && --init_count == 0) {
        while (ndevice_fds > 0)
            close(device_fds[--ndevice_fds]);
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* nvmlErrorString: NVML's own texts (pynvml carries the same ones for the common codes;
 * "In use by another client" is what nvidia-smi prints from it for a busy GPU). */
EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt Request Issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request.";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 22: return "The requested vgpu operation is not available on target device, becasue ECC is enabled";
    case 23: return "Ran out of critical resources, other than memory";
    case 24: return "Frequency not supported";
    case 25: return "Argument version mismatch";
    case 26: return "Deprecated";
    case 27: return "Not Ready";
    case 28: return "GPU not found";
    case 29: return "Invalid state";
    default: return "Unknown Error";
    }
}

/* -- system ------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    nvmlReturn_t rc = enter("nvmlSystemGetDriverVersion", NULL, NULL);
    if (rc)
        return rc;
    pthread_mutex_lock(&lock);
    rc = copy_text(spec->driver_version, version, length);
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    nvmlReturn_t rc = enter("nvmlSystemGetNVMLVersion", NULL, NULL);
    if (rc)
        return rc;
    char text[96];
    pthread_mutex_lock(&lock);
    /* NVML's version is the CUDA major and the driver's: "12.550.54.15". */
    snprintf(text, sizeof text, "%d.%s", spec->cuda_driver_version / 1000, spec->driver_version);
    pthread_mutex_unlock(&lock);
    return copy_text(text, version, length);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    nvmlReturn_t rc = enter("nvmlSystemGetCudaDriverVersion", NULL, NULL);
    if (rc)
        return rc;
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&lock);
    *cudaDriverVersion = spec->cuda_driver_version;
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* -- devices ----------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    nvmlReturn_t rc = enter("nvmlDeviceGetCount", NULL, NULL);
    if (rc)
        return rc;
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&lock);
    /* `visible` below the devices listed: the last ones fell off the bus. */
    int n = spec->visible < spec->ndevices ? spec->visible : spec->ndevices;
    pthread_mutex_unlock(&lock);
    *deviceCount = (unsigned)n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) {
    return nvmlDeviceGetCount_v2(deviceCount);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    struct device d;
    if (!device)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= MAX_DEVICES) {
        nvmlReturn_t rc = enter("nvmlDeviceGetHandleByIndex", NULL, NULL);
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    }
    nvmlReturn_t rc = enter("nvmlDeviceGetHandleByIndex", &gpus[index], &d);
    if (!rc)
        *device = &gpus[index];
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

/* By UUID, among the visible GPUs (the agent's check that a reset GPU answers). */
EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = enter("nvmlDeviceGetHandleByUUID", NULL, NULL);
    if (rc)
        return rc;
    int index = -1;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < spec->ndevices && i < spec->visible; i++)
        if (!strcmp(spec->devices[i].uuid, uuid))
            index = i;
    pthread_mutex_unlock(&lock);
    if (index < 0)
        return NVML_ERROR_NOT_FOUND;
    struct device d;
    rc = enter("nvmlDeviceGetHandleByUUID", &gpus[index], &d);
    if (!rc)
        *device = &gpus[index];
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    struct device d;
    if (device && device->slot >= 0)
        return NVML_ERROR_NOT_SUPPORTED; /* MIG device UUIDs: nothing here asks */
    nvmlReturn_t rc = enter("nvmlDeviceGetUUID", device, &d);
    return rc ? rc : copy_text(d.uuid, uuid, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    struct device d;
    nvmlReturn_t rc = enter("nvmlDeviceGetName", device, &d);
    if (rc)
        return rc;
    char text[160];
    if (device->slot >= 0) /* a MIG device: "NVIDIA A100-SXM4-40GB MIG 1g.5gb" */
        snprintf(text, sizeof text, "%s MIG %s", d.name,
                 device->slot < d.nmig ? d.mig[device->slot] : "");
    else
        snprintf(text, sizeof text, "%s", d.name);
    return copy_text(text, name, length);
}

static nvmlReturn_t pci_info(const char *call, nvmlDevice_t device, nvmlPciInfo_t *pci) {
    struct device d;
    nvmlReturn_t rc = enter(call, device, &d);
    if (rc)
        return rc;
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", d.pci);
    /* The legacy field holds the short form, "0000:3B:00.0" when the domain fits. */
    unsigned domain = 0, bus = 0, dev = 0, fn = 0;
    if (sscanf(d.pci, "%x:%x:%x.%x", &domain, &bus, &dev, &fn) == 4) {
        pci->domain = domain;
        pci->bus = bus;
        pci->device = dev;
    }
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", domain & 0xffff,
             bus & 0xff, dev & 0xff, fn & 0xf);
    pci->pciDeviceId = 0x233010DE; /* H100 SXM5 80GB: device 0x2330, vendor 0x10DE */
    pci->pciSubSystemId = 0x16C110DE;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return pci_info("nvmlDeviceGetPciInfo", device, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return pci_info("nvmlDeviceGetPciInfo", device, pci);
}

/* The device file's minor number: /dev/nvidia<minor>. The N of the spec's devicePath
 * when it names /dev/nvidia<N> (or a file so named elsewhere), else the GPU's index, as
 * on a node whose GPUs the driver numbered in PCI order. */
EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
    struct device d;
    if (device && device->slot >= 0)
        return NVML_ERROR_NOT_SUPPORTED; /* a MIG device has no /dev/nvidia<N> of its own */
    nvmlReturn_t rc = enter("nvmlDeviceGetMinorNumber", device, &d);
    if (rc)
        return rc;
    if (!minorNumber)
        return NVML_ERROR_INVALID_ARGUMENT;
    const char *base = strrchr(d.device_path, '/');
    base = base ? base + 1 : d.device_path;
    *minorNumber = (unsigned)device->index;
    if (!strncmp(base, "nvidia", 6) && base[6] >= '0' && base[6] <= '9' &&
        strspn(base + 6, "0123456789") == strlen(base + 6) && strlen(base + 6) < 10)
        *minorNumber = (unsigned)strtoul(base + 6, NULL, 10);
    return NVML_SUCCESS;
}

/* What the GPU's name says of it: its CUDA compute capability (by the product family
 * in the name) and its memory (the name's "<N>GB", as GiB). The spec's default GPU,
 * an H100 80GB HBM3, is 9.0 with 80 GiB; so is a name neither table knows. */
static void product(const char *name, int *major, int *minor, unsigned long long *memory) {
    static const struct {
        const char *family;
        int major, minor;
    } families[] = {
        {"B200", 10, 0}, {"B100", 10, 0}, {"H200", 9, 0}, {"H100", 9, 0}, {"H800", 9, 0},
        {"L40", 8, 9},   {"L4", 8, 9},    {"A100", 8, 0}, {"A800", 8, 0}, {"A30", 8, 0},
        {"A10", 8, 6},   {"T4", 7, 5},    {"V100", 7, 0},
    };
    *major = 9;
    *minor = 0;
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (strstr(name, families[i].family)) {
            *major = families[i].major;
            *minor = families[i].minor;
            break;
        }
    *memory = 80ULL << 30;
    for (const char *p = name; *p; p++) {
        unsigned gb = 0;
        int used = 0;
        if (*p >= '0' && *p <= '9' && (p == name || p[-1] == ' ' || p[-1] == '-') &&
            sscanf(p, "%uGB%n", &gb, &used) == 1 && used > 2 && gb > 0 && gb <= 4096) {
            *memory = (unsigned long long)gb << 30;
            break;
        }
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major,
                                                       int *minor) {
    struct device d;
    nvmlReturn_t rc = enter("nvmlDeviceGetCudaComputeCapability", device, &d);
    if (rc)
        return rc;
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long memory;
    product(d.name, major, minor, &memory);
    return NVML_SUCCESS;
}

/* nvmlMemory_t (v1): total, free and used bytes. */
typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;
_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t");

/* A GPU's memory: its product's (product()), used by its compute processes. A MIG
 * device's is its profile's ("1g.10gb": 10 GiB), none of it used. */
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    struct device d;
    nvmlReturn_t rc = enter("nvmlDeviceGetMemoryInfo", device, &d);
    if (rc)
        return rc;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    int major, minor;
    unsigned long long total, used = 0;
    product(d.name, &major, &minor, &total);
    unsigned slices = 0, gb = 0;
    if (device->slot >= 0) {
        if (device->slot >= d.nmig)
            return NVML_ERROR_INVALID_ARGUMENT; /* an empty slot has no handle */
        if (sscanf(d.mig[device->slot], "%ug.%ugb", &slices, &gb) == 2 && gb > 0 && gb <= 4096)
            total = (unsigned long long)gb << 30;
    } else {
        for (int i = 0; i < d.nprocs; i++)
            used += d.procs[i].used_bytes;
        if (used > total)
            used = total;
    }
    *memory = (nvmlMemory_t){total, total - used, used};
    return NVML_SUCCESS;
}

static nvmlReturn_t processes(const char *call, nvmlDevice_t device, unsigned int *count,
                              nvmlProcessInfo_t *infos) {
    struct device d;
    nvmlReturn_t rc = enter(call, device, &d);
    if (rc)
        return rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* NVML's sizing protocol: too small (or no array) says how many are needed. */
    if (*count < (unsigned)d.nprocs || (!infos && d.nprocs)) {
        *count = (unsigned)d.nprocs;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < d.nprocs; i++)
        infos[i] = (nvmlProcessInfo_t){d.procs[i].pid, d.procs[i].used_bytes, 0xFFFFFFFFu,
                                       0xFFFFFFFFu}; /* no GPU/compute instance (no MIG) */
    *count = (unsigned)d.nprocs;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                            unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos) {
    return processes("nvmlDeviceGetComputeRunningProcesses", device, infoCount, infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                            unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos) {
    return processes("nvmlDeviceGetComputeRunningProcesses", device, infoCount, infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errorType,
                                                int counterType, unsigned long long *eccCounts) {
    struct device d;
    nvmlReturn_t rc = enter("nvmlDeviceGetTotalEccErrors", device, &d);
    if (rc)
        return rc;
    if (!eccCounts || errorType < 0 || errorType > 1 || counterType < 0 || counterType > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* The spec has the one counter the agent reads; corrected and aggregate are 0. */
    *eccCounts = errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED && counterType == NVML_VOLATILE_ECC
                     ? d.ecc_uncorrected_volatile
                     : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                              unsigned int *uncRows, unsigned int *isPending,
                                              unsigned int *failureOccurred) {
    struct device d;
    nvmlReturn_t rc = enter("nvmlDeviceGetRemappedRows", device, &d);
    if (rc)
        return rc;
    if (!d.has_rows)
        return NVML_ERROR_NOT_SUPPORTED; /* pre-Ampere: page retirement instead */
    if (!corrRows || !uncRows || !isPending || !failureOccurred)
        return NVML_ERROR_INVALID_ARGUMENT;
    *corrRows = d.rows_correctable;
    *uncRows = d.rows_uncorrectable;
    *isPending = d.rows_pending;
    *failureOccurred = d.rows_failure;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, int *isPending) {
    struct device d;
    nvmlReturn_t rc = enter("nvmlDeviceGetRetiredPagesPendingStatus", device, &d);
    if (rc)
        return rc;
    if (!isPending)
        return NVML_ERROR_INVALID_ARGUMENT;
    *isPending = d.retired_pages_pending;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensorType,
                                             unsigned int *temp) {
    struct device d;
    nvmlReturn_t rc = enter("nvmlDeviceGetTemperature", device, &d);
    if (rc)
        return rc;
    if (!temp || sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temp = d.temperature;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                             int *isActive) {
    struct device d;
    nvmlReturn_t rc = enter("nvmlDeviceGetNvLinkState", device, &d);
    if (rc)
        return rc;
    if (!d.nlinks)
        return NVML_ERROR_NOT_SUPPORTED; /* a GPU without NVLink */
    if (!isActive || link >= (unsigned)d.nlinks)
        return NVML_ERROR_INVALID_ARGUMENT;
    *isActive = d.link_up[link];
    return NVML_SUCCESS;
}

/* The remote end of a GPU's NVLink: on the HGX board the spec's node stands for, every
 * link goes to one of its 4 NVSwitches (link % 4), never straight to another GPU; the
 * switches' PCI addresses are made up (bus 0x05 + switch). A link that is down still
 * has its far end. */
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                        nvmlPciInfo_t *pci) {
    struct device d;
    nvmlReturn_t rc = enter("nvmlDeviceGetNvLinkRemotePciInfo", device, &d);
    if (rc)
        return rc;
    if (!d.nlinks)
        return NVML_ERROR_NOT_SUPPORTED; /* a GPU without NVLink */
    if (!pci || link >= (unsigned)d.nlinks)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned bus = 0x05 + link % 4;
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "00000000:%02X:00.0", bus);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", bus);
    pci->bus = bus;
    pci->pciDeviceId = 0x22A310DE; /* NVSwitch (third generation): device 0x22A3, vendor 0x10DE */
    return NVML_SUCCESS;
}

/* nvmlGpuTopologyLevel_t values (nvml.h). */
enum { NVML_TOPOLOGY_INTERNAL = 0, NVML_TOPOLOGY_NODE = 40, NVML_TOPOLOGY_SYSTEM = 50 };

/* The PCIe path between two GPUs, as on an 8-GPU HGX node with two CPU sockets: GPUs
 * 0-3 on one NUMA node, 4-7 on the other (and so on by fours). A GPU with itself is
 * INTERNAL (one board). */
EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                        int *pathInfo) {
    struct device d1, d2;
    nvmlReturn_t rc = enter("nvmlDeviceGetTopologyCommonAncestor", device1, &d1);
    if (!rc)
        rc = enter("nvmlDeviceGetTopologyCommonAncestor", device2, &d2);
    if (rc)
        return rc;
    if (!pathInfo || device1->slot >= 0 || device2->slot >= 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (device1->index == device2->index)
        *pathInfo = NVML_TOPOLOGY_INTERNAL;
    else if (device1->index / 4 == device2->index / 4)
        *pathInfo = NVML_TOPOLOGY_NODE;
    else
        *pathInfo = NVML_TOPOLOGY_SYSTEM;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                             nvmlFieldValue_t *values) {
    struct device d;
    nvmlReturn_t rc = enter("nvmlDeviceGetFieldValues", device, &d);
    if (rc)
        return rc;
    if (valuesCount < 0 || (valuesCount && !values))
        return NVML_ERROR_INVALID_ARGUMENT;
    struct timeval now;
    gettimeofday(&now, NULL);
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)now.tv_sec * 1000000 + now.tv_usec;
        v->latencyUsec = 0;
        memset(&v->value, 0, sizeof v->value);
        /* Each field answers for itself; only the one the agent reads is known here. */
        const unsigned long long *nvlink = NULL;
        switch (v->fieldId) {
        case NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL:
            nvlink = &d.nvlink_crc_flit;
            break;
        case NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL:
            nvlink = &d.nvlink_crc_data;
            break;
        case NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL:
            nvlink = &d.nvlink_replay;
            break;
        case NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL:
            nvlink = &d.nvlink_recovery;
            break;
        }
        if (v->fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) {
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->nvmlReturn = NVML_SUCCESS;
            v->value.uiVal = d.recovery_action;
        } else if (nvlink && d.nlinks) { /* a GPU without NVLink has no such counter */
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
            v->nvmlReturn = NVML_SUCCESS;
            v->value.ullVal = *nvlink;
        } else {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return NVML_SUCCESS;
}

/* -- degradation readings (gpuheal/agent/readings.py) ---------------------------- */

/* One unsigned reading of the device: the spec's value at `offset` in struct device. */
static nvmlReturn_t uint_reading(const char *call, nvmlDevice_t device, size_t offset,
                                 unsigned int *out) {
    struct device d;
    nvmlReturn_t rc = enter(call, device, &d);
    if (rc)
        return rc;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    *out = *(const unsigned *)((const char *)&d + offset);
    return NVML_SUCCESS;
}

#define UINT_READING(fn, member)                                                      \
    EXPORT nvmlReturn_t fn(nvmlDevice_t device, unsigned int *out) {                  \
        return uint_reading(#fn, device, offsetof(struct device, member), out);       \
    }
UINT_READING(nvmlDeviceGetPcieReplayCounter, pcie_replays)
UINT_READING(nvmlDeviceGetCurrPcieLinkWidth, pcie_width)
UINT_READING(nvmlDeviceGetMaxPcieLinkWidth, pcie_max_width)
UINT_READING(nvmlDeviceGetCurrPcieLinkGeneration, pcie_generation)
UINT_READING(nvmlDeviceGetGpuMaxPcieLinkGeneration, pcie_max_generation)
UINT_READING(nvmlDeviceGetPowerUsage, power_draw_mw)
UINT_READING(nvmlDeviceGetEnforcedPowerLimit, power_limit_mw)

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                           unsigned long long *reasons) {
    struct device d;
    nvmlReturn_t rc = enter("nvmlDeviceGetCurrentClocksEventReasons", device, &d);
    if (rc)
        return rc;
    if (!reasons)
        return NVML_ERROR_INVALID_ARGUMENT;
    *reasons = d.clocks_event_reasons;
    return NVML_SUCCESS;
}

/* nvmlUtilization_t: percentages over the driver's last sample period. */
typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                  nvmlUtilization_t *utilization) {
    struct device d;
    nvmlReturn_t rc = enter("nvmlDeviceGetUtilizationRates", device, &d);
    if (rc)
        return rc;
    if (!utilization)
        return NVML_ERROR_INVALID_ARGUMENT;
    *utilization = (nvmlUtilization_t){d.utilization, 0};
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, int *mode) {
    struct device d;
    nvmlReturn_t rc = enter("nvmlDeviceGetPersistenceMode", device, &d);
    if (rc)
        return rc;
    if (!mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mode = d.persistence_mode; /* nvmlEnableState_t: 1 enabled */
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char *version,
                                              unsigned int length) {
    struct device d;
    nvmlReturn_t rc = enter("nvmlDeviceGetVbiosVersion", device, &d);
    return rc ? rc : copy_text(d.vbios, version, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device,
                                                nvmlGpuFabricInfo_v2_t *info) {
    struct device d;
    nvmlReturn_t rc = enter("nvmlDeviceGetGpuFabricInfoV", device, &d);
    if (rc)
        return rc;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlGpuFabricInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH; /* only v2 is served here */
    if (!d.has_fabric)
        return NVML_ERROR_NOT_SUPPORTED; /* no NVSwitch fabric */
    memset((char *)info + sizeof info->version, 0, sizeof *info - sizeof info->version);
    info->status = d.fabric_status;
    info->state = (unsigned char)d.fabric_state;
    info->healthMask = d.fabric_health_mask;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                         unsigned int *pendingMode) {
    struct device d;
    nvmlReturn_t rc = enter("nvmlDeviceGetMigMode", device, &d);
    if (rc)
        return rc;
    if (!d.mig_supported)
        return NVML_ERROR_NOT_SUPPORTED;
    if (!currentMode || !pendingMode)
        return NVML_ERROR_INVALID_ARGUMENT;
    *currentMode = *pendingMode = (unsigned)d.mig_enabled;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    struct device d;
    nvmlReturn_t rc = enter("nvmlDeviceGetMaxMigDeviceCount", device, &d);
    if (rc)
        return rc;
    if (!d.mig_supported)
        return NVML_ERROR_NOT_SUPPORTED;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = MAX_MIG;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                        nvmlDevice_t *migDevice) {
    struct device d;
    nvmlReturn_t rc = enter("nvmlDeviceGetMigDeviceHandleByIndex", device, &d);
    if (rc)
        return rc;
    if (!migDevice || device->slot >= 0 || index >= MAX_MIG)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= (unsigned)d.nmig)
        return NVML_ERROR_NOT_FOUND; /* an empty slot */
    *migDevice = &migs[device->index][index];
    return NVML_SUCCESS;
}

/* -- events ------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    nvmlReturn_t rc = enter("nvmlEventSetCreate", NULL, NULL);
    if (rc)
        return rc;
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    *set = calloc(1, sizeof **set);
    return *set ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    free(set);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                                     unsigned long long *eventTypes) {
    struct device d;
    nvmlReturn_t rc = enter("nvmlDeviceGetSupportedEventTypes", device, &d);
    if (rc)
        return rc;
    if (!eventTypes)
        return NVML_ERROR_INVALID_ARGUMENT;
    *eventTypes = SUPPORTED_EVENTS;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                             nvmlEventSet_t set) {
    struct device d;
    nvmlReturn_t rc = enter("nvmlDeviceRegisterEvents", device, &d);
    if (rc)
        return rc;
    if (!set || device->slot >= 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!(eventTypes & SUPPORTED_EVENTS))
        return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&lock);
    set->mask[device->index] |= eventTypes & SUPPORTED_EVENTS;
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}

static int was_delivered(const char *key) {
    for (size_t i = 0; i < ndelivered; i++)
        if (!strcmp(delivered[i], key))
            return 1;
    return 0;
}

/* The next undelivered Xid event of the spec on a device registered for Xids, or -1.
 * Called with the lock held. */
static int next_event(nvmlEventSet_t set) {
    for (int i = 0; i < spec->nxids; i++) {
        const struct xid_event *x = &spec->xids[i];
        if (x->reset || x->device < 0 || x->device >= spec->ndevices || x->device >= MAX_DEVICES ||
            !(set->mask[x->device] & nvmlEventTypeXidCriticalError) || was_delivered(x->key))
            continue;
        if (ndelivered == delivered_cap) {
            size_t cap = delivered_cap ? delivered_cap * 2 : 64;
            void *grown = realloc(delivered, cap * sizeof *delivered);
            if (!grown)
                return -1;
            delivered = grown;
            delivered_cap = cap;
        }
        memcpy(delivered[ndelivered++], x->key, sizeof x->key);
        return i;
    }
    return -1;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                        unsigned int timeoutms) {
    nvmlReturn_t rc = enter("nvmlEventSetWait", NULL, NULL);
    if (rc)
        return rc;
    if (!set || !data)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        pthread_mutex_lock(&lock);
        rc = refresh();
        int i = rc ? -1 : next_event(set);
        if (i >= 0) {
            const struct xid_event *x = &spec->xids[i];
            *data = (nvmlEventData_t){&gpus[x->device], nvmlEventTypeXidCriticalError, x->xid,
                                      0xFFFFFFFFu, 0xFFFFFFFFu};
        }
        pthread_mutex_unlock(&lock);
        if (rc)
            return rc;
        if (i >= 0)
            return NVML_SUCCESS;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long waited = (now.tv_sec - start.tv_sec) * 1000LL +
                           (now.tv_nsec - start.tv_nsec) / 1000000LL;
        if (waited >= (long long)timeoutms)
            return NVML_ERROR_TIMEOUT;
        struct timespec step = {0, 50 * 1000000L}; /* poll the spec every 50 ms */
        nanosleep(&step, NULL);
    }
}

EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data,
                                     unsigned int timeoutms) {
    return nvmlEventSetWait_v2(set, data, timeoutms);
}
