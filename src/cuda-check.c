/*
 * gpu-driver-cuda-check LIBCUDA: the CUDA half of `gpu-driver-installer
 * verify` (see src/cuda.rs and docs/install.md, "The CUDA check").
 *
 * Loads the driver root's libcuda.so.1 with dlopen and, through the CUDA
 * driver API, on every device: cuDeviceGet, cuDeviceGetName, cuCtxCreate,
 * cuMemAlloc of a small buffer, a cuMemcpyHtoD/cuMemcpyDtoH round trip
 * compared byte for byte, cuMemFree, cuCtxDestroy. Prints exactly one JSON
 * line on stdout; src/cuda.rs parses it.
 *
 * The installer is a static binary and runs this dynamically linked one
 * with the HOST's dynamic loader (ld.so --library-path ... this-file), so
 * that libcuda is loaded against the host's glibc. Built by build.rs with
 * the system C compiler; it may use only what glibc 2.34 has (build.rs
 * refuses a newer symbol version): dlopen, dlsym, dlerror, dlinfo, stdio,
 * memcmp/memset/strstr.
 *
 * Exit status: 0 every device passed; 1 a CUDA call failed or a round
 * trip differed (in the JSON); 2 libcuda could not be loaded or lacks an
 * entry point (in the JSON); 64 usage.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <gnu/libc-version.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr; /* the _v2 API's 64-bit pointer */

#define BUFFER_BYTES 4096
#define NAME_BYTES 256

static struct {
    CUresult (*init)(unsigned int);
    CUresult (*driver_get_version)(int *);
    CUresult (*device_get_count)(int *);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*device_get_name)(char *, int, CUdevice);
    CUresult (*ctx_create)(CUcontext *, unsigned int, CUdevice);
    CUresult (*ctx_destroy)(CUcontext);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*memcpy_htod)(CUdeviceptr, const void *, size_t);
    CUresult (*memcpy_dtoh)(void *, CUdeviceptr, size_t);
    CUresult (*get_error_name)(CUresult, const char **);
    CUresult (*get_error_string)(CUresult, const char **);
} cu;

/* The exported names: cuda.h maps cuCtxCreate etc. to their _v2 symbols. */
static const struct {
    const char *name;
    void **slot;
} entry_points[] = {
    {"cuInit", (void **)&cu.init},
    {"cuDriverGetVersion", (void **)&cu.driver_get_version},
    {"cuDeviceGetCount", (void **)&cu.device_get_count},
    {"cuDeviceGet", (void **)&cu.device_get},
    {"cuDeviceGetName", (void **)&cu.device_get_name},
    {"cuCtxCreate_v2", (void **)&cu.ctx_create},
    {"cuCtxDestroy_v2", (void **)&cu.ctx_destroy},
    {"cuMemAlloc_v2", (void **)&cu.mem_alloc},
    {"cuMemFree_v2", (void **)&cu.mem_free},
    {"cuMemcpyHtoD_v2", (void **)&cu.memcpy_htod},
    {"cuMemcpyDtoH_v2", (void **)&cu.memcpy_dtoh},
    {"cuGetErrorName", (void **)&cu.get_error_name},
    {"cuGetErrorString", (void **)&cu.get_error_string},
};

/* A JSON string, or null. */
static void put_str(const char *s)
{
    if (s == NULL) {
        fputs("null", stdout);
        return;
    }
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p < 0x20)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    }
    putchar('"');
}

/* "error":{"call":…,"code":…,"name":…,"message":…}; code < 0: none. */
static void put_error(const char *call, CUresult code, const char *message)
{
    const char *name = NULL;
    if (code >= 0) {
        if (cu.get_error_name == NULL || cu.get_error_name(code, &name) != 0)
            name = NULL;
        if (message == NULL &&
            (cu.get_error_string == NULL || cu.get_error_string(code, &message) != 0))
            message = NULL;
    }
    fputs("\"error\":{\"call\":", stdout);
    put_str(call);
    if (code >= 0)
        printf(",\"code\":%d,\"name\":", code);
    else
        fputs(",\"code\":null,\"name\":", stdout);
    put_str(name);
    fputs(",\"message\":", stdout);
    put_str(message);
    putchar('}');
}

/* The path of the libc.so.6 this process runs with: the host's, when the
 * installer ran us with the host's loader. */
static const char *loaded_libc(void *handle)
{
    struct link_map *map = NULL;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0)
        return NULL;
    while (map != NULL && map->l_prev != NULL)
        map = map->l_prev;
    for (; map != NULL; map = map->l_next)
        if (map->l_name != NULL && strstr(map->l_name, "/libc.so.6") != NULL)
            return map->l_name;
    return NULL;
}

/* One device's checks; 0 when all passed. Prints the device's fields
 * after its index. */
static int check_device(int index)
{
    static unsigned char wrote[BUFFER_BYTES], got[BUFFER_BYTES];
    char name[NAME_BYTES] = {0};
    CUdevice dev = 0;
    CUcontext ctx = NULL;
    CUdeviceptr ptr = 0;
    CUresult r;
    const char *call;

    if ((r = cu.device_get(&dev, index)) != 0) {
        call = "cuDeviceGet";
        goto fail;
    }
    if ((r = cu.device_get_name(name, NAME_BYTES, dev)) != 0) {
        call = "cuDeviceGetName";
        goto fail;
    }
    if ((r = cu.ctx_create(&ctx, 0, dev)) != 0) {
        call = "cuCtxCreate_v2";
        goto fail;
    }
    if ((r = cu.mem_alloc(&ptr, BUFFER_BYTES)) != 0) {
        call = "cuMemAlloc_v2";
        goto fail;
    }
    for (int i = 0; i < BUFFER_BYTES; i++)
        wrote[i] = (unsigned char)(i * 31 + index * 7 + 1);
    memset(got, 0, sizeof got);
    if ((r = cu.memcpy_htod(ptr, wrote, BUFFER_BYTES)) != 0) {
        call = "cuMemcpyHtoD_v2";
        goto fail;
    }
    if ((r = cu.memcpy_dtoh(got, ptr, BUFFER_BYTES)) != 0) {
        call = "cuMemcpyDtoH_v2";
        goto fail;
    }
    if (memcmp(wrote, got, BUFFER_BYTES) != 0) {
        fputs(",\"name\":", stdout);
        put_str(name);
        fputs(",\"ok\":false,", stdout);
        put_error("memcmp", -1, "the bytes read back from the device differ from those written");
        cu.mem_free(ptr);
        cu.ctx_destroy(ctx);
        return 1;
    }
    if ((r = cu.mem_free(ptr)) != 0) {
        ptr = 0;
        call = "cuMemFree_v2";
        goto fail;
    }
    ptr = 0;
    if ((r = cu.ctx_destroy(ctx)) != 0) {
        ctx = NULL;
        call = "cuCtxDestroy_v2";
        goto fail;
    }
    fputs(",\"name\":", stdout);
    put_str(name);
    fputs(",\"ok\":true", stdout);
    return 0;

fail:
    fputs(",\"name\":", stdout);
    put_str(name[0] ? name : NULL);
    fputs(",\"ok\":false,", stdout);
    put_error(call, r, NULL);
    if (ptr != 0)
        cu.mem_free(ptr);
    if (ctx != NULL)
        cu.ctx_destroy(ctx);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fputs("usage: gpu-driver-cuda-check LIBCUDA\n", stderr);
        return 64;
    }
    printf("{\"library\":");
    put_str(argv[1]);
    printf(",\"glibc\":");
    put_str(gnu_get_libc_version());
    putchar(',');

    void *handle = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        put_error("dlopen", -1, dlerror());
        puts("}");
        return 2;
    }
    fputs("\"libc\":", stdout);
    put_str(loaded_libc(handle));
    putchar(',');
    for (size_t i = 0; i < sizeof entry_points / sizeof entry_points[0]; i++) {
        dlerror();
        *entry_points[i].slot = dlsym(handle, entry_points[i].name);
        if (*entry_points[i].slot == NULL) {
            char call[64];
            snprintf(call, sizeof call, "dlsym %s", entry_points[i].name);
            put_error(call, -1, dlerror());
            puts("}");
            return 2;
        }
    }

    int version = 0;
    if (cu.driver_get_version(&version) == 0)
        printf("\"driverVersion\":%d,", version);
    else
        fputs("\"driverVersion\":null,", stdout);

    CUresult r = cu.init(0);
    if (r != 0) {
        put_error("cuInit", r, NULL);
        puts("}");
        return 1;
    }
    int count = 0;
    if ((r = cu.device_get_count(&count)) != 0) {
        put_error("cuDeviceGetCount", r, NULL);
        puts("}");
        return 1;
    }
    printf("\"deviceCount\":%d,\"devices\":[", count);
    int failed = 0;
    for (int i = 0; i < count; i++) {
        printf("%s{\"index\":%d", i ? "," : "", i);
        failed |= check_device(i);
        putchar('}');
    }
    puts("]}");
    return failed;
}
