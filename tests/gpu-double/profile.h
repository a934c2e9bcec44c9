/*
 * The GPU double's profile: what the NVML and CUDA doubles report, read from
 * a small text file (docs/gpu-double.md has the format and an example):
 *
 *   $GPU_DOUBLE_PROFILE, else `gpu-double.profile` beside the library itself
 *   (so a driver root that carries the doubles carries its profile too, into
 *   every container that mounts it).
 *
 * No profile means no GPU: the doubles then answer as NVIDIA's libraries do
 * on a machine without the driver. Test-only; never shipped in an image.
 */
#ifndef GPU_DOUBLE_PROFILE_H
#define GPU_DOUBLE_PROFILE_H

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GD_MAX_GPUS 16
#define GD_MAX_PROCS 8

struct gd_process {
    unsigned int pid;
    unsigned long long used;
};

struct gd_gpu {
    char name[96];
    char uuid[80];
    char bus_id[32];           /* 00000000:3B:00.0 */
    unsigned int pci_device_id; /* device << 16 | vendor (0x10DE) */
    unsigned int minor;
    unsigned long long memory_total, memory_used;
    unsigned int util_gpu, util_memory;
    unsigned int mig;          /* current MIG mode (0/1); MIG devices are not modelled */
    int cc_major, cc_minor;
    unsigned int nprocs;
    struct gd_process procs[GD_MAX_PROCS];
};

struct gd_profile {
    int loaded;
    char driver_version[32];
    char nvml_version[48];
    int cuda_version;          /* 12020 = 12.2 */
    unsigned long long gpus;   /* may exceed GD_MAX_GPUS: a hostile count */
    char kernel_module[32];    /* set: no driver unless /sys/module/<it> exists */
    struct gd_gpu gpu[GD_MAX_GPUS];
};

static void gd_copy(char *dst, size_t n, const char *src)
{
    snprintf(dst, n, "%s", src);
}

static void gd_set_gpu(struct gd_gpu *g, const char *key, const char *v)
{
    if (!strcmp(key, "name"))
        gd_copy(g->name, sizeof g->name, v);
    else if (!strcmp(key, "uuid"))
        gd_copy(g->uuid, sizeof g->uuid, v);
    else if (!strcmp(key, "pci_bus_id"))
        gd_copy(g->bus_id, sizeof g->bus_id, v);
    else if (!strcmp(key, "pci_device_id"))
        g->pci_device_id = (unsigned int)strtoul(v, NULL, 0);
    else if (!strcmp(key, "minor"))
        g->minor = (unsigned int)strtoul(v, NULL, 10);
    else if (!strcmp(key, "memory_total"))
        g->memory_total = strtoull(v, NULL, 10);
    else if (!strcmp(key, "memory_used"))
        g->memory_used = strtoull(v, NULL, 10);
    else if (!strcmp(key, "utilization_gpu"))
        g->util_gpu = (unsigned int)strtoul(v, NULL, 10);
    else if (!strcmp(key, "utilization_memory"))
        g->util_memory = (unsigned int)strtoul(v, NULL, 10);
    else if (!strcmp(key, "mig"))
        g->mig = (unsigned int)strtoul(v, NULL, 10);
    else if (!strcmp(key, "compute_capability"))
        sscanf(v, "%d.%d", &g->cc_major, &g->cc_minor);
    else if (!strcmp(key, "process") && g->nprocs < GD_MAX_PROCS) {
        struct gd_process *p = &g->procs[g->nprocs];
        if (sscanf(v, "%u:%llu", &p->pid, &p->used) == 2)
            g->nprocs++;
    }
}

static void gd_set(struct gd_profile *p, char *key, char *v)
{
    if (!strcmp(key, "driver_version"))
        gd_copy(p->driver_version, sizeof p->driver_version, v);
    else if (!strcmp(key, "nvml_version"))
        gd_copy(p->nvml_version, sizeof p->nvml_version, v);
    else if (!strcmp(key, "cuda_version"))
        p->cuda_version = atoi(v);
    else if (!strcmp(key, "gpus"))
        p->gpus = strtoull(v, NULL, 10);
    else if (!strcmp(key, "kernel_module"))
        gd_copy(p->kernel_module, sizeof p->kernel_module, v);
    else if (!strncmp(key, "gpu", 3)) {
        char *dot = strchr(key, '.');
        unsigned long i = strtoul(key + 3, NULL, 10);
        if (dot && i < GD_MAX_GPUS)
            gd_set_gpu(&p->gpu[i], dot + 1, v);
    }
}

static char *gd_trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r'))
        *--e = '\0';
    return s;
}

/* The profile's path: the environment's, else beside this library. */
static int gd_path(char *out, size_t n)
{
    const char *env = getenv("GPU_DOUBLE_PROFILE");
    if (env) {
        gd_copy(out, n, env);
        return 1;
    }
    Dl_info info;
    if (!dladdr((void *)gd_path, &info) || !info.dli_fname)
        return 0;
    gd_copy(out, n, info.dli_fname);
    char *slash = strrchr(out, '/');
    if (!slash)
        return 0;
    snprintf(slash + 1, n - (size_t)(slash + 1 - out), "gpu-double.profile");
    return 1;
}

/* Reads the profile once; `loaded` stays 0 without one. */
static inline struct gd_profile *gd_profile(void)
{
    static struct gd_profile p;
    static int tried;
    if (tried)
        return &p;
    tried = 1;
    char path[4096];
    if (!gd_path(path, sizeof path))
        return &p;
    FILE *f = fopen(path, "r");
    if (!f)
        return &p;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *eq = strchr(line, '=');
        if (!eq)
            continue;
        *eq = '\0';
        gd_set(&p, gd_trim(line), gd_trim(eq + 1));
    }
    fclose(f);
    /* NVIDIA's libraries find no driver while its module is not loaded
     * (after a reboot, before the reinstall): so does the double, where
     * the profile names the module (on a real kernel: scripts/real-node). */
    if (p.kernel_module[0] && !strchr(p.kernel_module, '/')) {
        char sys[64];
        snprintf(sys, sizeof sys, "/sys/module/%s", p.kernel_module);
        if (access(sys, F_OK) != 0)
            return &p;
    }
    p.loaded = 1;
    return &p;
}

/* GPUs that have a record (a hostile `gpus` count is still reported). */
static inline unsigned int gd_modelled(const struct gd_profile *p)
{
    return p->gpus < GD_MAX_GPUS ? (unsigned int)p->gpus : GD_MAX_GPUS;
}

#endif
