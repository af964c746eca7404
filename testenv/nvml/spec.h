/* The fake GPU node's state: the spec file gpuheal/sim/agent.py writes and
 * gpuheal/agent/fakenvml.py documents, read into plain C structs.
 *
 * Shared by the NVML stand-in (nvml.c, libnvidia-ml.so.1) and the nvidia-smi
 * stand-in (smi.c). Both re-read the file whenever it changes, so a test injects
 * a fault by rewriting it. */
#ifndef GPUHEAL_SPEC_H
#define GPUHEAL_SPEC_H

#include <stddef.h>

#define SPEC_ENV "GPUHEAL_FAKE_NVML_SPEC"
#define MAX_DEVICES 64
#define MAX_LINKS 36 /* NVML_NVLINK_MAX_LINKS in nvml.h (NVML 12.x) */
#define MAX_PROCS 64
#define MAX_MIG 7 /* nvmlDeviceGetMaxMigDeviceCount on an A100/H100 */
#define MAX_ERRORS 32
#define MAX_XIDS 512

struct call_error {
    char call[64]; /* an NVML function name as the agent's pynvml resolves it */
    int code;      /* an nvmlReturn_t */
};

struct proc {
    unsigned pid;
    unsigned long long used_bytes;
};

struct device {
    char uuid[96];
    char pci[32]; /* "00000000:3B:00.0" */
    char name[96];
    /* The device file the driver serves this GPU by (/dev/nvidia<N> on a node): the NVML
     * stand-in holds it open while initialised, as NVML does, and the reset refuses while
     * any process holds it (nvidia-smi's "In use by another client"). "" for none. */
    char device_path[256];
    unsigned temperature;
    unsigned long long ecc_uncorrected_volatile;
    int has_rows; /* remappedRows given: the GPU remaps rows (Ampere and later) */
    unsigned rows_correctable, rows_uncorrectable, rows_pending, rows_failure;
    int retired_pages_pending;
    int nlinks; /* 0: no NVLink */
    int link_up[MAX_LINKS];
    unsigned recovery_action;
    int lost;
    double hang_seconds;
    int nprocs;
    struct proc procs[MAX_PROCS];
    int reset_failures;
    int mig_supported;
    int mig_enabled;
    int nmig;
    char mig[MAX_MIG][32];
    int nerrors;
    struct call_error errors[MAX_ERRORS];
    /* The degradation readings (gpuheal/agent/degradation.py); defaults: a healthy card. */
    unsigned pcie_replays, pcie_width, pcie_max_width, pcie_generation, pcie_max_generation;
    unsigned long long clocks_event_reasons; /* nvmlClocksEventReason* bits */
    unsigned power_draw_mw, power_limit_mw;
    unsigned long long nvlink_crc_flit, nvlink_crc_data, nvlink_replay, nvlink_recovery;
    int has_fabric; /* fabric given: the GPU joins an NVSwitch fabric */
    unsigned fabric_state, fabric_health_mask;
    int fabric_status;
    int persistence_mode;
    char vbios[32];
    unsigned utilization; /* nvmlDeviceGetUtilizationRates' GPU percentage */
};

struct xid_event {
    char key[64]; /* `id`, or device and xid: delivered once per key and process */
    int device;
    unsigned long long xid;
    int reset; /* `reset: true`: the GPU was reset since (nvidia-smi -r): no session sees it */
};

struct spec {
    char driver_version[80];
    int cuda_driver_version;
    int visible; /* how many devices nvmlDeviceGetCount reports */
    int init_error;
    int ndevices;
    struct device devices[MAX_DEVICES];
    int nxids;
    struct xid_event xids[MAX_XIDS];
    int nerrors;
    struct call_error errors[MAX_ERRORS]; /* for every device (or system) call */
};

/* Parse the spec at `path` into *out. 0 on success; otherwise -1 with a message
 * (file and line) in `why`, or -2 when there is no file (it went between a stat and
 * the open: a writer replacing it by rename). */
int spec_load(const char *path, struct spec *out, char *why, size_t why_len);

/* The nvmlReturn_t for NVML's name of it: "NOT_SUPPORTED", "NVML_ERROR_NOT_SUPPORTED",
 * "SUCCESS", or a number. -1 when unknown. */
int spec_error_code(const char *name);

/* The error the spec sets for `call` on this device (or globally), 0 if none. */
int spec_call_error(const struct spec *spec, const struct device *device, const char *call);

#endif
