/*
 * The nvidia-smi double: answers the queries verify and `scripts/gpu-check`
 * make, through documented NVML calls of whatever libnvidia-ml.so.1 the
 * loader finds (the NVML double, in tests). NVIDIA's own nvidia-smi needs
 * NVML's private export table and refuses any library without it
 * (docs/gpu-double.md), so a driver root carrying the GPU double carries
 * this one. Test-only; never shipped.
 *
 *   nvidia-smi --query-gpu=FIELD[,FIELD...] --format=csv,noheader[,nounits]
 *       FIELD: index, name, uuid, driver_version, pci.bus_id,
 *              memory.total, memory.used (MiB), utilization.gpu (%)
 *   nvidia-smi -L
 *
 * Anything else is refused with exit code 2 ("not modelled"), never
 * answered with made-up output. NVML failures print NVML's error string and
 * exit 9, as nvidia-smi does without a driver.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

static void *lib;

static void *sym(const char *name)
{
    void *f = dlsym(lib, name);
    if (!f) {
        printf("The NVML library has no %s.\n", name);
        exit(9);
    }
    return f;
}

static void check(nvmlReturn_t r, const char *call)
{
    if (r == 0)
        return;
    const char *(*err)(nvmlReturn_t) = (const char *(*)(nvmlReturn_t))sym("nvmlErrorString");
    printf("%s failed: %s\n", call, err(r));
    exit(9);
}

#define CALL(name, type, ...) check(((type)sym(#name))(__VA_ARGS__), #name)

static void field(nvmlDevice_t d, unsigned int i, const char *f, int units)
{
    char buf[128];
    if (!strcmp(f, "index")) {
        printf("%u", i);
    } else if (!strcmp(f, "name")) {
        CALL(nvmlDeviceGetName, nvmlReturn_t (*)(nvmlDevice_t, char *, unsigned int), d, buf,
             sizeof buf);
        printf("%s", buf);
    } else if (!strcmp(f, "uuid")) {
        CALL(nvmlDeviceGetUUID, nvmlReturn_t (*)(nvmlDevice_t, char *, unsigned int), d, buf,
             sizeof buf);
        printf("%s", buf);
    } else if (!strcmp(f, "driver_version")) {
        CALL(nvmlSystemGetDriverVersion, nvmlReturn_t (*)(char *, unsigned int), buf, sizeof buf);
        printf("%s", buf);
    } else if (!strcmp(f, "pci.bus_id")) {
        nvmlPciInfo_t p;
        CALL(nvmlDeviceGetPciInfo_v3, nvmlReturn_t (*)(nvmlDevice_t, nvmlPciInfo_t *), d, &p);
        printf("%s", p.busId);
    } else if (!strcmp(f, "memory.total") || !strcmp(f, "memory.used")) {
        nvmlMemory_t m;
        CALL(nvmlDeviceGetMemoryInfo, nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t *), d, &m);
        printf("%llu%s", (f[7] == 't' ? m.total : m.used) >> 20, units ? " MiB" : "");
    } else if (!strcmp(f, "utilization.gpu")) {
        nvmlUtilization_t u;
        CALL(nvmlDeviceGetUtilizationRates, nvmlReturn_t (*)(nvmlDevice_t, nvmlUtilization_t *),
             d, &u);
        printf("%u%s", u.gpu, units ? " %" : "");
    }
}

static const char *FIELDS[] = {"index", "name", "uuid", "driver_version", "pci.bus_id",
                               "memory.total", "memory.used", "utilization.gpu", NULL};

static int known(const char *f)
{
    for (int i = 0; FIELDS[i]; i++)
        if (!strcmp(FIELDS[i], f))
            return 1;
    return 0;
}

static int refuse(const char *what)
{
    fprintf(stderr, "the GPU double's nvidia-smi does not model %s (tests/gpu-double/nvidia-smi.c)\n",
            what);
    return 2;
}

int main(int argc, char **argv)
{
    const char *query = NULL, *format = NULL;
    int list = 0;
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "--query-gpu=", 12))
            query = argv[i] + 12;
        else if (!strncmp(argv[i], "--format=", 9))
            format = argv[i] + 9;
        else if (!strcmp(argv[i], "-L") || !strcmp(argv[i], "--list-gpus"))
            list = 1;
        else
            return refuse(argv[i]);
    }
    if (!list && (!query || !format || strncmp(format, "csv,noheader", 12) != 0))
        return refuse("this command line (only --query-gpu with --format=csv,noheader, and -L)");
    int units = !(format && strstr(format, "nounits"));
    char fields[512];
    snprintf(fields, sizeof fields, "%s", query ? query : "");
    for (char *f = strtok(fields, ","); f; f = strtok(NULL, ","))
        if (!known(f))
            return refuse(f);

    lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) {
        printf("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system.\n");
        return 12;
    }
    CALL(nvmlInit_v2, nvmlReturn_t (*)(void));
    unsigned int n;
    CALL(nvmlDeviceGetCount_v2, nvmlReturn_t (*)(unsigned int *), &n);
    for (unsigned int i = 0; i < n; i++) {
        nvmlDevice_t d;
        CALL(nvmlDeviceGetHandleByIndex_v2, nvmlReturn_t (*)(unsigned int, nvmlDevice_t *), i, &d);
        if (list) {
            printf("GPU %u: ", i);
            field(d, i, "name", 0);
            printf(" (UUID: ");
            field(d, i, "uuid", 0);
            printf(")\n");
            continue;
        }
        snprintf(fields, sizeof fields, "%s", query);
        int first = 1;
        for (char *f = strtok(fields, ","); f; f = strtok(NULL, ",")) {
            printf("%s", first ? "" : ", ");
            first = 0;
            field(d, i, f, units);
        }
        printf("\n");
    }
    ((nvmlReturn_t (*)(void))sym("nvmlShutdown"))();
    return 0;
}
