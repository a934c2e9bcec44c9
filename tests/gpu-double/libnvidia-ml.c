/*
 * The NVML double: a libnvidia-ml.so.1 that reports the GPUs of the GPU
 * double's profile (profile.h), for NVIDIA's real nvidia-smi, NVIDIA's
 * device plugin and our exporter where no GPU is. Test-only; never shipped.
 *
 * It exports the NVML C functions those programs call, with nvml.h's
 * signatures and structure layouts (the facts: NVIDIA's nvml.h as vendored
 * by github.com/NVIDIA/go-nvml v0.13.4-1, gen/nvml/nvml.h). Whatever a
 * profile does not describe answers NVML_ERROR_NOT_SUPPORTED, never a
 * made-up success; docs/gpu-double.md lists every function and what it
 * returns. Without a profile, init fails as NVIDIA's library does on a
 * machine without the driver (NVML_ERROR_DRIVER_NOT_LOADED).
 *
 * Faults for the exporter's tests: -DSTUB_NO_SHUTDOWN leaves nvmlShutdown
 * out (a broken or foreign library); GPU_DOUBLE_NVML_INIT_SLEEP=S makes
 * init sleep S seconds first (a hung init); a profile's `gpus` may claim
 * more devices than it describes (a hostile count).
 */
#include "profile.h" /* first: it defines _GNU_SOURCE */

#include <strings.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
typedef struct gd_gpu *nvmlDevice_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_UNKNOWN 999

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

static int initialized;

static nvmlReturn_t init(void)
{
    const char *s = getenv("GPU_DOUBLE_NVML_INIT_SLEEP");
    if (s)
        sleep((unsigned)atoi(s));
    if (!gd_profile()->loaded)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    initialized++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return init(); }
nvmlReturn_t nvmlInit(void) { return init(); }

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return init();
}

#ifndef STUB_NO_SHUTDOWN
nvmlReturn_t nvmlShutdown(void)
{
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    initialized--;
    return NVML_SUCCESS;
}
#endif

static nvmlReturn_t text(char *out, unsigned int len, const char *v)
{
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!v[0])
        return NVML_ERROR_NOT_SUPPORTED;
    if (!out || len < strlen(v) + 1)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, v);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *out, unsigned int len)
{
    return text(out, len, gd_profile()->driver_version);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *out, unsigned int len)
{
    return text(out, len, gd_profile()->nvml_version);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v)
{
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!gd_profile()->cuda_version)
        return NVML_ERROR_NOT_SUPPORTED;
    *v = gd_profile()->cuda_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v)
{
    return nvmlSystemGetCudaDriverVersion(v);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long n = gd_profile()->gpus;
    *count = n > 0xffffffffULL ? 0xffffffffU : (unsigned int)n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= gd_modelled(gd_profile()))
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gd_profile()->gpu[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

/* A handle of this library, or NULL. */
static struct gd_gpu *gpu(nvmlDevice_t d)
{
    struct gd_profile *p = gd_profile();
    for (unsigned int i = 0; initialized && i < gd_modelled(p); i++)
        if (d == &p->gpu[i])
            return d;
    return NULL;
}

static int index_of(struct gd_gpu *g)
{
    return (int)(g - gd_profile()->gpu);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    struct gd_profile *p = gd_profile();
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    for (unsigned int i = 0; uuid && i < gd_modelled(p); i++) {
        if (p->gpu[i].uuid[0] && !strcmp(p->gpu[i].uuid, uuid)) {
            *device = &p->gpu[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device)
{
    struct gd_profile *p = gd_profile();
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    for (unsigned int i = 0; bus_id && i < gd_modelled(p); i++) {
        if (p->gpu[i].bus_id[0] && !strcasecmp(p->gpu[i].bus_id, bus_id)) {
            *device = &p->gpu[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus_id, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index)
{
    struct gd_gpu *g = gpu(d);
    if (!g || !index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned int)index_of(g);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *out, unsigned int len)
{
    struct gd_gpu *g = gpu(d);
    return g ? text(out, len, g->name) : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *out, unsigned int len)
{
    struct gd_gpu *g = gpu(d);
    return g ? text(out, len, g->uuid) : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *minor)
{
    struct gd_gpu *g = gpu(d);
    if (!g || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *minor = g->minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
    struct gd_gpu *g = gpu(d);
    if (!g || !m)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->memory_total)
        return NVML_ERROR_NOT_SUPPORTED;
    m->total = g->memory_total;
    m->used = g->memory_used;
    m->free = g->memory_total - g->memory_used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
    nvmlMemory_t v1;
    nvmlReturn_t r;
    if (!m)
        return NVML_ERROR_INVALID_ARGUMENT;
    r = nvmlDeviceGetMemoryInfo(d, &v1);
    if (r != NVML_SUCCESS)
        return r;
    m->total = v1.total;
    m->reserved = 0;
    m->free = v1.free;
    m->used = v1.used;
    return NVML_SUCCESS;
}

static nvmlReturn_t pci(nvmlDevice_t d, nvmlPciInfo_t *p)
{
    struct gd_gpu *g = gpu(d);
    unsigned int domain, bus, dev, fn;
    if (!g || !p)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (sscanf(g->bus_id, "%x:%x:%x.%x", &domain, &bus, &dev, &fn) != 4)
        return NVML_ERROR_NOT_SUPPORTED;
    memset(p, 0, sizeof *p);
    p->domain = domain;
    p->bus = bus;
    p->device = dev;
    p->pciDeviceId = g->pci_device_id;
    snprintf(p->busId, sizeof p->busId, "%08X:%02X:%02X.0", domain, bus, dev);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%04X:%02X:%02X.0", domain & 0xffff, bus, dev);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) { return pci(d, p); }
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *p) { return pci(d, p); }
nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *p) { return pci(d, p); }

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u)
{
    struct gd_gpu *g = gpu(d);
    if (!g || !u)
        return NVML_ERROR_INVALID_ARGUMENT;
    u->gpu = g->util_gpu;
    u->memory = g->util_memory;
    return NVML_SUCCESS;
}

/* MIG mode as the profile says; MIG devices themselves are not modelled. */
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending)
{
    struct gd_gpu *g = gpu(d);
    if (!g || !current || !pending)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g->cc_major && g->cc_major < 8)
        return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = g->mig;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is_mig)
{
    if (!gpu(d) || !is_mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    *is_mig = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor)
{
    struct gd_gpu *g = gpu(d);
    if (!g || !major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->cc_major)
        return NVML_ERROR_NOT_SUPPORTED;
    *major = g->cc_major;
    *minor = g->cc_minor;
    return NVML_SUCCESS;
}

/* Compute processes from the profile; graphics processes: none. */
static nvmlReturn_t processes(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos,
                              int compute)
{
    struct gd_gpu *g = gpu(d);
    unsigned int n;
    if (!g || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    n = compute ? g->nprocs : 0;
    if (*count < n || (n && !infos)) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++) {
        infos[i].pid = g->procs[i].pid;
        infos[i].usedGpuMemory = g->procs[i].used;
        infos[i].gpuInstanceId = 0xffffffffU;
        infos[i].computeInstanceId = 0xffffffffU;
    }
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                     nvmlProcessInfo_t *infos)
{
    return processes(d, count, infos, 1);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                      nvmlProcessInfo_t *infos)
{
    return processes(d, count, infos, 0);
}

/*
 * Events: a GPU of the double supports XID critical error events
 * (nvmlEventTypeXidCriticalError) and never raises one, so a wait times
 * out as on a healthy GPU. ECC, power and clock events are not modelled.
 * NVIDIA's device plugin health-checks its GPUs this way.
 */
#define nvmlEventTypeXidCriticalError 0x0000000000000008ULL

typedef struct nvmlEventSet_st {
    unsigned long long registered;
} *nvmlEventSet_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    *set = calloc(1, sizeof **set);
    return *set ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    free(set);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types)
{
    if (!gpu(d) || !types)
        return NVML_ERROR_INVALID_ARGUMENT;
    *types = nvmlEventTypeXidCriticalError;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set)
{
    if (!gpu(d) || !set)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (types & ~nvmlEventTypeXidCriticalError)
        return NVML_ERROR_NOT_SUPPORTED;
    set->registered |= types;
    return NVML_SUCCESS;
}

/* No event ever arrives: waits `timeoutms` (a signal may end the wait
 * early, as nvml.h allows), then NVML_ERROR_TIMEOUT. */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    struct timespec t = {timeoutms / 1000, (long)(timeoutms % 1000) * 1000000L};
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!set || !data)
        return NVML_ERROR_INVALID_ARGUMENT;
    nanosleep(&t, NULL);
    return NVML_ERROR_TIMEOUT;
}

static const struct {
    nvmlReturn_t code;
    const char *text;
} errors[] = {
    {NVML_SUCCESS, "Success"},
    {NVML_ERROR_UNINITIALIZED, "Uninitialized"},
    {NVML_ERROR_INVALID_ARGUMENT, "Invalid Argument"},
    {NVML_ERROR_NOT_SUPPORTED, "Not Supported"},
    {NVML_ERROR_NOT_FOUND, "Not Found"},
    {NVML_ERROR_INSUFFICIENT_SIZE, "Insufficient Size"},
    {NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"},
    {NVML_ERROR_TIMEOUT, "Timeout"},
};

const char *nvmlErrorString(nvmlReturn_t result)
{
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == result)
            return errors[i].text;
    return "Unknown Error";
}
