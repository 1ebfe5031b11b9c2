/*
 * A stand-in libnvidia-ml.so.1 for testing Tessera's NVML backend without a GPU.
 *
 * Built by tests/nvml_fake_driver.rs into a temporary directory (one copy per test, so
 * each test gets its own driver state). It models three GPUs:
 *   0: A100-SXM4-80GB, MIG enabled, a 3g.40gb (with compute instance) at slot 0 and a
 *      1g.10gb without compute instance at slot 4; NVLink: 2 links to GPU 1, 1 to a switch
 *   1: A100-SXM4-80GB, MIG capable but disabled; NVLink mirror of GPU 0
 *   2: L4, no MIG, no NVLink, no events, no attributes, no NUMA id (sysfs fallback)
 * MIG profile IDs, sizes and placements follow `nvidia-smi mig -lgip/-lgipp` on an
 * A100 80GB.
 *
 * Files next to the library (found with dladdr) steer it:
 *   fake_nvml.conf  "mig_needs_reset" -> enabling MIG mode stays pending (reset needed)
 *                   "broken_name <gpu>" -> nvmlDeviceGetName fails (GPU lost) for it
 *                   "gpm <gpu> <gi id> <percent>" -> the GPU has GPM (as Hopper does:
 *                   nvmlGpmQueryDeviceSupport says yes) and its GPU instance <gi id> was
 *                   active <percent> % (NVML_GPM_METRIC_GRAPHICS_UTIL) between any two
 *                   samples; without such a line a GPU has no GPM (as an A100)
 *                   "proc <gpu> <pid> <MiB>" -> a compute process on the GPU using
 *                   <MiB> (nvmlDeviceGetComputeRunningProcesses_v3 lists it, in file
 *                   order; the GPU's used memory is the sum of its processes')
 *   events          one command per line, consumed in order by nvmlEventSetWait_v2:
 *                   "xid <gpu> <xid>", "migxid <gpu> <xid>" (on its first MIG device),
 *                   "dbe <gpu>" (events), "remap <gpu> <0|1>" (row
 *                   remapping pending), "lost <gpu> <0|1>" (GPU fell off the bus)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
    OK = 0, INVALID_ARG = 2, NOT_SUPPORTED = 3, NOT_FOUND = 6, INSUFFICIENT_SIZE = 7,
    TIMEOUT = 10, GPU_LOST = 15, IN_USE = 19, INSUFFICIENT_RESOURCES = 23
};

#define NGPU 3
#define MAXGI 8
#define NPROF 17
#define NLINK 18
#define MIB (1024ULL * 1024ULL)

typedef struct { unsigned start, size; } placement_t;
typedef struct {
    unsigned version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount,
        copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} gi_profile_v2_t;
typedef struct {
    unsigned id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount,
        copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} gi_profile_v1_t;
typedef struct {
    unsigned id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
} ci_profile_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } memory_v2_t;
typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} pci_t;
typedef struct {
    unsigned multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount,
        sharedEncoderCount, sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount,
        computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} attributes_t;

struct gi;
typedef struct dev { int is_mig, gpu; struct gi *gi; } dev_t_;
typedef struct ci { struct gi *gi; } ci_t;
typedef struct gi {
    int used, gpu;
    unsigned id, prof, start, size;
    int has_ci;
    unsigned ci_prof;
    ci_t ci;
    dev_t_ mig;
} gi_t;
typedef struct { void *device; unsigned id, profileId; placement_t placement; } gi_info_t;
typedef struct { void *device; void *gpuInstance; unsigned id, profileId; placement_t placement; } ci_info_t;
typedef struct {
    void *device;
    unsigned long long eventType, eventData;
    unsigned gpuInstanceId, computeInstanceId;
} event_data_t;
typedef struct { int registered[NGPU]; long cursor; } event_set_t;

typedef struct {
    int supported;
    unsigned id, slices, inst, sms;
    unsigned long long mem;
    const char *name;
    unsigned nplace;
    unsigned starts[8];
    unsigned size;
} prof_t;

static const prof_t PROFS[NPROF] = {
    [0] = {1, 19, 1, 7, 14, 9728, "MIG 1g.10gb", 7, {0, 1, 2, 3, 4, 5, 6}, 1},
    [1] = {1, 14, 2, 3, 28, 19968, "MIG 2g.20gb", 3, {0, 2, 4}, 2},
    [2] = {1, 9, 3, 2, 42, 40192, "MIG 3g.40gb", 2, {0, 4}, 4},
    [3] = {1, 5, 4, 1, 56, 40192, "MIG 4g.40gb", 1, {0}, 4},
    [4] = {1, 0, 7, 1, 98, 80896, "MIG 7g.80gb", 1, {0}, 8},
    [7] = {1, 20, 1, 1, 14, 9728, "MIG 1g.10gb+me", 7, {0, 1, 2, 3, 4, 5, 6}, 1},
    [9] = {1, 15, 1, 4, 14, 19968, "MIG 1g.20gb", 4, {0, 2, 4, 6}, 2},
};
static const unsigned CI_SLICES[5] = {1, 2, 3, 4, 7};

typedef struct {
    const char *uuid, *name, *bus_id;
    unsigned bus, minor, arch, sms;
    int cc_major, cc_minor;
    unsigned long long mem_mib;
    int mig_capable, attrs, numa, events;
    unsigned mig_current, mig_pending;
    gi_t gis[MAXGI];
    unsigned next_gi_id;
    int remap_pending, lost;
    unsigned long long dbe;
} gpu_t;

static gpu_t G[NGPU];
static dev_t_ H[NGPU];
#define NGPM 8
static struct { int gpu; unsigned gi; double util; } GPM[NGPM];
static int ngpm;
#define NPROC 32
static struct { int gpu; unsigned pid; unsigned long long mib; } PROCS[NPROC];
static int nproc;
static int mig_needs_reset;
static int broken_name = -1;
static char dir[4096];

static void init_state(void) {
    memset(G, 0, sizeof G);
    gpu_t a = {"GPU-11111111-1111-1111-1111-111111111111", "NVIDIA A100-SXM4-80GB",
               "00000000:07:00.0", 0x07, 0, 7, 108, 8, 0, 81920, 1, 1, 0, 1, 1, 1};
    gpu_t b = {"GPU-22222222-2222-2222-2222-222222222222", "NVIDIA A100-SXM4-80GB",
               "00000000:0F:00.0", 0x0F, 1, 7, 108, 8, 0, 81920, 1, 1, 1, 1, 0, 0};
    gpu_t c = {"GPU-33333333-3333-3333-3333-333333333333", "NVIDIA L4",
               "00000000:3B:00.0", 0x3B, 2, 8, 58, 8, 9, 23034, 0, 0, -1, 0, 0, 0};
    G[0] = a; G[1] = b; G[2] = c;
    for (int i = 0; i < NGPU; i++) {
        H[i].is_mig = 0; H[i].gpu = i; H[i].gi = NULL;
        G[i].next_gi_id = 1;
    }
    /* GPU 0: 3g.40gb at 0 with its compute instance, 1g.10gb at 4 without. */
    G[0].gis[0] = (gi_t){1, 0, 1, 2, 0, 4, 1, 2};
    G[0].gis[1] = (gi_t){1, 0, 2, 0, 4, 1, 0, 0};
    G[0].next_gi_id = 3;

    Dl_info info;
    dir[0] = 0;
    if (dladdr((void *)&init_state, &info) && info.dli_fname) {
        snprintf(dir, sizeof dir, "%s", info.dli_fname);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0; else dir[0] = 0;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/fake_nvml.conf", dir);
    FILE *f = fopen(path, "r");
    mig_needs_reset = 0;
    broken_name = -1;
    ngpm = 0;
    nproc = 0;
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "mig_needs_reset", 15) == 0) mig_needs_reset = 1;
            else if (strncmp(line, "broken_name ", 12) == 0) broken_name = atoi(line + 12);
            else if (strncmp(line, "gpm ", 4) == 0 && ngpm < NGPM &&
                     sscanf(line + 4, "%d %u %lf", &GPM[ngpm].gpu, &GPM[ngpm].gi, &GPM[ngpm].util) == 3)
                ngpm++;
            else if (strncmp(line, "proc ", 5) == 0 && nproc < NPROC &&
                     sscanf(line + 5, "%d %u %llu", &PROCS[nproc].gpu, &PROCS[nproc].pid,
                            &PROCS[nproc].mib) == 3)
                nproc++;
        fclose(f);
    }
}

static gpu_t *gpu_of(void *d) {
    dev_t_ *h = d;
    if (!h || h->gpu < 0 || h->gpu >= NGPU) return NULL;
    return &G[h->gpu];
}
static gpu_t *whole(void *d) {
    dev_t_ *h = d;
    return (h && !h->is_mig) ? gpu_of(d) : NULL;
}
static int copy_str(char *dst, unsigned len, const char *src) {
    if (strlen(src) + 1 > len) return INSUFFICIENT_SIZE;
    strcpy(dst, src);
    return OK;
}
static int prof_by_id(unsigned id) {
    for (int i = 0; i < NPROF; i++)
        if (PROFS[i].supported && PROFS[i].id == id) return i;
    return -1;
}
static void mig_uuid(char *out, size_t n, const gi_t *gi) {
    snprintf(out, n, "MIG-%08d-0000-0000-0000-%012u", gi->gpu + 1, gi->id);
}

nvmlReturn_t nvmlInit_v2(void) { init_state(); return OK; }
nvmlReturn_t nvmlShutdown(void) { return OK; }
const char *nvmlErrorString(nvmlReturn_t r) { (void)r; return "fake"; }

nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned len) { return copy_str(v, len, "570.86.15"); }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = 12080; return OK; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) { *n = NGPU; return OK; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, void **d) {
    if (i >= NGPU) return INVALID_ARG;
    *d = &H[i];
    return OK;
}
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, void **d) {
    for (int i = 0; i < NGPU; i++) {
        if (strcmp(uuid, G[i].uuid) == 0) { *d = &H[i]; return OK; }
        for (int k = 0; k < MAXGI; k++) {
            gi_t *gi = &G[i].gis[k];
            char m[96];
            if (!gi->used || !gi->has_ci) continue;
            mig_uuid(m, sizeof m, gi);
            if (strcmp(uuid, m) == 0) {
                gi->mig = (dev_t_){1, gi->gpu, gi};
                *d = &gi->mig;
                return OK;
            }
        }
    }
    return NOT_FOUND;
}
nvmlReturn_t nvmlDeviceGetIndex(void *d, unsigned *i) {
    if (!whole(d)) return INVALID_ARG;
    *i = ((dev_t_ *)d)->gpu;
    return OK;
}
nvmlReturn_t nvmlDeviceGetUUID(void *d, char *out, unsigned len) {
    dev_t_ *h = d;
    if (h->is_mig) {
        char m[96];
        mig_uuid(m, sizeof m, h->gi);
        return copy_str(out, len, m);
    }
    return copy_str(out, len, gpu_of(d)->uuid);
}
nvmlReturn_t nvmlDeviceGetName(void *d, char *out, unsigned len) {
    if (((dev_t_ *)d)->gpu == broken_name) return GPU_LOST;
    return copy_str(out, len, gpu_of(d)->name);
}
nvmlReturn_t nvmlDeviceGetMinorNumber(void *d, unsigned *m) { *m = gpu_of(d)->minor; return OK; }
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *d, memory_v2_t *m) {
    gpu_t *g = gpu_of(d);
    if (g->lost) return GPU_LOST;
    m->total = g->mem_mib * MIB;
    m->reserved = 0;
    m->used = 0;
    if (!((dev_t_ *)d)->is_mig)
        for (int i = 0; i < nproc; i++)
            if (PROCS[i].gpu == ((dev_t_ *)d)->gpu) m->used += PROCS[i].mib * MIB;
    m->free = m->total - m->used;
    return OK;
}
/* nvmlProcessInfo_v2_t, which the _v3 call fills. */
typedef struct { unsigned pid; unsigned long long usedGpuMemory; unsigned gpuInstanceId, computeInstanceId; } process_info_t;
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *d, unsigned *count, process_info_t *out) {
    if (!whole(d) || !count) return INVALID_ARG;
    int gpu = ((dev_t_ *)d)->gpu;
    unsigned n = 0;
    for (int i = 0; i < nproc; i++)
        if (PROCS[i].gpu == gpu) n++;
    if (*count < n || (!out && n > 0)) { *count = n; return INSUFFICIENT_SIZE; }
    n = 0;
    for (int i = 0; i < nproc; i++)
        if (PROCS[i].gpu == gpu)
            out[n++] = (process_info_t){PROCS[i].pid, PROCS[i].mib * MIB, 0xFFFFFFFFu, 0xFFFFFFFFu};
    *count = n;
    return OK;
}
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(void *d, int *ma, int *mi) {
    *ma = gpu_of(d)->cc_major;
    *mi = gpu_of(d)->cc_minor;
    return OK;
}
nvmlReturn_t nvmlDeviceGetArchitecture(void *d, unsigned *a) { *a = gpu_of(d)->arch; return OK; }
nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *d, pci_t *p) {
    gpu_t *g = gpu_of(d);
    memset(p, 0, sizeof *p);
    p->bus = g->bus;
    p->pciDeviceId = 0x20b210de;
    snprintf(p->busId, sizeof p->busId, "%s", g->bus_id);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%s", g->bus_id + 4);
    return OK;
}
nvmlReturn_t nvmlDeviceGetNumaNodeId(void *d, unsigned *n) {
    gpu_t *g = gpu_of(d);
    if (g->numa < 0) return NOT_SUPPORTED;
    *n = (unsigned)g->numa;
    return OK;
}
nvmlReturn_t nvmlDeviceGetAttributes_v2(void *d, attributes_t *a) {
    dev_t_ *h = d;
    gpu_t *g = gpu_of(d);
    memset(a, 0, sizeof *a);
    if (h->is_mig) {
        const prof_t *p = &PROFS[h->gi->prof];
        a->multiprocessorCount = p->sms;
        a->gpuInstanceSliceCount = p->slices;
        a->computeInstanceSliceCount = CI_SLICES[h->gi->ci_prof];
        a->memorySizeMB = p->mem;
        return OK;
    }
    if (!g->attrs) return NOT_SUPPORTED;
    a->multiprocessorCount = g->sms;
    a->memorySizeMB = g->mem_mib;
    return OK;
}

/* ---- MIG ---- */
nvmlReturn_t nvmlDeviceGetMigMode(void *d, unsigned *cur, unsigned *pend) {
    gpu_t *g = whole(d);
    if (!g || !g->mig_capable) return NOT_SUPPORTED;
    *cur = g->mig_current;
    *pend = g->mig_pending;
    return OK;
}
nvmlReturn_t nvmlDeviceSetMigMode(void *d, unsigned mode, nvmlReturn_t *status) {
    gpu_t *g = whole(d);
    if (!g || !g->mig_capable) return NOT_SUPPORTED;
    g->mig_pending = mode;
    if (!mig_needs_reset) g->mig_current = mode;
    *status = OK;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void *d, unsigned *n) {
    gpu_t *g = whole(d);
    if (!g || !g->mig_capable) return NOT_SUPPORTED;
    *n = 7;
    return OK;
}
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(void *d, unsigned *is) { *is = ((dev_t_ *)d)->is_mig; return OK; }
nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(void *d, void **parent) {
    dev_t_ *h = d;
    if (!h->is_mig) return INVALID_ARG;
    *parent = &H[h->gpu];
    return OK;
}
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *d, unsigned index, void **out) {
    gpu_t *g = whole(d);
    if (!g || !g->mig_current) return NOT_SUPPORTED;
    unsigned seen = 0;
    for (int k = 0; k < MAXGI; k++) {
        gi_t *gi = &g->gis[k];
        if (!gi->used || !gi->has_ci) continue;
        if (seen++ == index) {
            gi->mig = (dev_t_){1, gi->gpu, gi};
            *out = &gi->mig;
            return OK;
        }
    }
    return NOT_FOUND;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceId(void *d, unsigned *id) {
    dev_t_ *h = d;
    if (!h->is_mig) return NOT_SUPPORTED;
    *id = h->gi->id;
    return OK;
}
nvmlReturn_t nvmlDeviceGetComputeInstanceId(void *d, unsigned *id) {
    dev_t_ *h = d;
    if (!h->is_mig) return NOT_SUPPORTED;
    *id = 0;
    return OK;
}
static nvmlReturn_t profile_common(void *d, unsigned idx) {
    gpu_t *g = whole(d);
    if (!g || !g->mig_capable) return NOT_SUPPORTED;
    if (idx >= NPROF) return INVALID_ARG;
    if (!PROFS[idx].supported) return NOT_SUPPORTED;
    return OK;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(void *d, unsigned idx, gi_profile_v2_t *p) {
    nvmlReturn_t r = profile_common(d, idx);
    if (r != OK) return r;
    if ((p->version >> 24) != 2 || (p->version & 0xffffff) != sizeof *p) return 25;
    const prof_t *s = &PROFS[idx];
    p->id = s->id; p->sliceCount = s->slices; p->instanceCount = s->inst;
    p->multiprocessorCount = s->sms; p->memorySizeMB = s->mem;
    snprintf(p->name, sizeof p->name, "%s", s->name);
    return OK;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(void *d, unsigned idx, gi_profile_v1_t *p) {
    nvmlReturn_t r = profile_common(d, idx);
    if (r != OK) return r;
    const prof_t *s = &PROFS[idx];
    memset(p, 0, sizeof *p);
    p->id = s->id; p->sliceCount = s->slices; p->instanceCount = s->inst;
    p->multiprocessorCount = s->sms; p->memorySizeMB = s->mem;
    return OK;
}
nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(void *d, unsigned id, placement_t *out, unsigned *count) {
    int i = prof_by_id(id);
    if (!whole(d) || i < 0) return INVALID_ARG;
    const prof_t *s = &PROFS[i];
    if (out) {
        if (*count < s->nplace) return INSUFFICIENT_SIZE;
        for (unsigned k = 0; k < s->nplace; k++) out[k] = (placement_t){s->starts[k], s->size};
    }
    *count = s->nplace;
    return OK;
}
nvmlReturn_t nvmlDeviceGetGpuInstances(void *d, unsigned id, gi_t **out, unsigned *count) {
    gpu_t *g = whole(d);
    int i = prof_by_id(id);
    if (!g || i < 0) return INVALID_ARG;
    if (!g->mig_current) return NOT_SUPPORTED;
    unsigned n = 0;
    for (int k = 0; k < MAXGI; k++)
        if (g->gis[k].used && g->gis[k].prof == (unsigned)i) {
            if (n >= PROFS[i].inst) return INSUFFICIENT_SIZE;
            out[n++] = &g->gis[k];
        }
    *count = n;
    return OK;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceById(void *d, unsigned id, gi_t **out) {
    gpu_t *g = whole(d);
    if (!g) return INVALID_ARG;
    for (int k = 0; k < MAXGI; k++)
        if (g->gis[k].used && g->gis[k].id == id) { *out = &g->gis[k]; return OK; }
    return NOT_FOUND;
}
nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(void *d, unsigned id, const placement_t *pl, gi_t **out) {
    gpu_t *g = whole(d);
    int i = prof_by_id(id);
    if (!g || i < 0 || !g->mig_current) return INVALID_ARG;
    const prof_t *s = &PROFS[i];
    int ok = 0;
    for (unsigned k = 0; k < s->nplace; k++) ok |= s->starts[k] == pl->start;
    if (!ok || pl->size != s->size) return INVALID_ARG;
    for (int k = 0; k < MAXGI; k++) {
        gi_t *o = &g->gis[k];
        if (o->used && pl->start < o->start + o->size && o->start < pl->start + pl->size)
            return INSUFFICIENT_RESOURCES;
    }
    for (int k = 0; k < MAXGI; k++)
        if (!g->gis[k].used) {
            g->gis[k] = (gi_t){1, (int)(g - G), g->next_gi_id++, (unsigned)i, pl->start, pl->size, 0, 0};
            *out = &g->gis[k];
            return OK;
        }
    return INSUFFICIENT_RESOURCES;
}
nvmlReturn_t nvmlGpuInstanceDestroy(gi_t *gi) {
    if (!gi->used) return INVALID_ARG;
    if (gi->has_ci) return IN_USE;
    gi->used = 0;
    return OK;
}
nvmlReturn_t nvmlGpuInstanceGetInfo(gi_t *gi, gi_info_t *info) {
    if (!gi->used) return INVALID_ARG;
    info->device = &H[gi->gpu];
    info->id = gi->id;
    info->profileId = PROFS[gi->prof].id;
    info->placement = (placement_t){gi->start, gi->size};
    return OK;
}
nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(gi_t *gi, unsigned idx, unsigned eng, ci_profile_t *p) {
    (void)eng;
    if (idx >= 8) return INVALID_ARG;
    if (idx >= 5 || CI_SLICES[idx] > PROFS[gi->prof].slices) return NOT_SUPPORTED;
    unsigned gs = PROFS[gi->prof].slices;
    if (gs == 4 && idx == 2) return NOT_SUPPORTED; /* no 3-slice CI in a 4-slice GI */
    memset(p, 0, sizeof *p);
    p->id = idx;
    p->sliceCount = CI_SLICES[idx];
    p->instanceCount = gs / CI_SLICES[idx];
    p->multiprocessorCount = 14 * CI_SLICES[idx];
    return OK;
}
nvmlReturn_t nvmlGpuInstanceGetComputeInstances(gi_t *gi, unsigned id, ci_t **out, unsigned *count) {
    *count = 0;
    if (gi->has_ci && gi->ci_prof == id) {
        gi->ci.gi = gi;
        out[0] = &gi->ci;
        *count = 1;
    }
    return OK;
}
nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(gi_t *gi, unsigned id, ci_t **out) {
    if (id >= 5 || CI_SLICES[id] > PROFS[gi->prof].slices) return INVALID_ARG;
    if (gi->has_ci) return INSUFFICIENT_RESOURCES;
    gi->has_ci = 1;
    gi->ci_prof = id;
    gi->ci.gi = gi;
    *out = &gi->ci;
    return OK;
}
nvmlReturn_t nvmlComputeInstanceDestroy(ci_t *ci) {
    if (!ci->gi->has_ci) return INVALID_ARG;
    ci->gi->has_ci = 0;
    return OK;
}
nvmlReturn_t nvmlComputeInstanceGetInfo_v2(ci_t *ci, ci_info_t *info) {
    memset(info, 0, sizeof *info);
    info->device = &H[ci->gi->gpu];
    info->gpuInstance = ci->gi;
    info->id = 0;
    info->profileId = ci->gi->ci_prof;
    return OK;
}

/* ---- NVLink: GPU 0 links 0,1 <-> GPU 1 links 0,1; link 2 of both to an NVSwitch ---- */
static int link_peer(int gpu, unsigned link) {
    if (gpu > 1 || link > 2) return -2; /* inactive */
    if (link == 2) return -1;           /* switch */
    return 1 - gpu;
}
nvmlReturn_t nvmlDeviceGetNvLinkState(void *d, unsigned link, unsigned *active) {
    dev_t_ *h = d;
    if (h->gpu == 2) return NOT_SUPPORTED;
    if (link >= NLINK) return INVALID_ARG;
    *active = link_peer(h->gpu, link) != -2;
    return OK;
}
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(void *d, unsigned link, pci_t *p) {
    int peer = link_peer(((dev_t_ *)d)->gpu, link);
    if (peer == -2) return INVALID_ARG;
    memset(p, 0, sizeof *p);
    snprintf(p->busId, sizeof p->busId, "%s", peer >= 0 ? G[peer].bus_id : "00000000:C0:00.0");
    return OK;
}
nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(void *d, unsigned link, unsigned *type) {
    int peer = link_peer(((dev_t_ *)d)->gpu, link);
    if (peer == -2) return INVALID_ARG;
    *type = peer >= 0 ? 0 /* GPU */ : 2 /* SWITCH */;
    return OK;
}

/* ---- health ---- */
nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(void *d, unsigned *p) { (void)d; (void)p; return NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetRemappedRows(void *d, unsigned *c, unsigned *u, unsigned *pending, unsigned *fail) {
    gpu_t *g = gpu_of(d);
    if (g->lost) return GPU_LOST;
    *c = 0; *u = 0; *fail = 0;
    *pending = g->remap_pending;
    return OK;
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(void *d, unsigned type, unsigned counter, unsigned long long *n) {
    (void)type; (void)counter;
    *n = gpu_of(d)->dbe;
    return OK;
}
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(void *d, unsigned long long *t) {
    gpu_t *g = gpu_of(d);
    if (!g->events) return NOT_SUPPORTED;
    *t = 1 | 2 | 4 | 8;
    return OK;
}
nvmlReturn_t nvmlEventSetCreate(event_set_t **set) {
    *set = calloc(1, sizeof **set);
    return *set ? OK : 20;
}
nvmlReturn_t nvmlEventSetFree(event_set_t *set) { free(set); return OK; }
nvmlReturn_t nvmlDeviceRegisterEvents(void *d, unsigned long long types, event_set_t *set) {
    gpu_t *g = whole(d);
    if (!g || !g->events) return NOT_SUPPORTED;
    (void)types;
    set->registered[g - G] = 1;
    return OK;
}
nvmlReturn_t nvmlEventSetWait_v2(event_set_t *set, event_data_t *data, unsigned timeout_ms) {
    char path[4200];
    snprintf(path, sizeof path, "%s/events", dir);
    FILE *f = fopen(path, "r");
    if (f) {
        char line[256];
        long n = 0;
        while (fgets(line, sizeof line, f)) {
            if (n++ < set->cursor) continue;
            set->cursor = n;
            int gpu = -1;
            unsigned long long v = 0;
            char cmd[16];
            if (sscanf(line, "%15s %d %llu", cmd, &gpu, &v) < 2 || gpu < 0 || gpu >= NGPU) continue;
            if (strcmp(cmd, "remap") == 0) { G[gpu].remap_pending = (int)v; continue; }
            if (strcmp(cmd, "lost") == 0) { G[gpu].lost = (int)v; continue; }
            if (!set->registered[gpu]) continue;
            memset(data, 0, sizeof *data);
            data->device = &H[gpu];
            if (strcmp(cmd, "xid") == 0) {
                data->eventType = 8;
                data->eventData = v;
            } else if (strcmp(cmd, "migxid") == 0) {
                /* Reported on the GPU's first MIG device handle. */
                void *mig = NULL;
                if (nvmlDeviceGetMigDeviceHandleByIndex(&H[gpu], 0, &mig) != OK) continue;
                data->device = mig;
                data->eventType = 8;
                data->eventData = v;
            } else if (strcmp(cmd, "dbe") == 0) {
                G[gpu].dbe += 1;
                data->eventType = 2;
            } else {
                continue;
            }
            fclose(f);
            return OK;
        }
        fclose(f);
    }
    usleep((timeout_ms < 20 ? timeout_ms : 20) * 1000);
    return TIMEOUT;
}

/* GPU Performance Monitoring (GPM): a sample records which GPU instance it measured and
 * when (a sequence number); the metric between two samples of one instance is the
 * instance's configured activity. */
typedef struct { unsigned version, isSupportedDevice; } gpm_support_t;
typedef struct { int filled, gpu; unsigned gi; unsigned long seq; } gpm_sample_t;
typedef struct {
    unsigned metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    struct { char *shortName, *longName, *unit; } metricInfo;
} gpm_metric_t;
typedef struct {
    unsigned version, numMetrics;
    gpm_sample_t *sample1, *sample2;
    gpm_metric_t metrics[210];
} gpm_metrics_get_t;
static unsigned long gpm_seq;

static int gpm_capable(int gpu) {
    for (int i = 0; i < ngpm; i++)
        if (GPM[i].gpu == gpu) return 1;
    return 0;
}
nvmlReturn_t nvmlGpmQueryDeviceSupport(void *d, gpm_support_t *s) {
    gpu_t *g = whole(d);
    if (!g || !s || s->version != 1) return INVALID_ARG;
    s->isSupportedDevice = (unsigned)gpm_capable(((dev_t_ *)d)->gpu);
    return OK;
}
nvmlReturn_t nvmlGpmSampleAlloc(gpm_sample_t **out) {
    *out = calloc(1, sizeof(gpm_sample_t));
    return *out ? OK : INSUFFICIENT_RESOURCES;
}
nvmlReturn_t nvmlGpmSampleFree(gpm_sample_t *s) { free(s); return OK; }
nvmlReturn_t nvmlGpmMigSampleGet(void *d, unsigned gi_id, gpm_sample_t *s) {
    gpu_t *g = whole(d);
    if (!g || !s) return INVALID_ARG;
    int gpu = ((dev_t_ *)d)->gpu;
    if (!gpm_capable(gpu)) return NOT_SUPPORTED;
    int found = 0;
    for (int k = 0; k < MAXGI; k++)
        if (g->gis[k].used && g->gis[k].id == gi_id) found = 1;
    if (!found) return INVALID_ARG;
    *s = (gpm_sample_t){1, gpu, gi_id, ++gpm_seq};
    return OK;
}
nvmlReturn_t nvmlGpmMetricsGet(gpm_metrics_get_t *m) {
    static char short_name[] = "GR_UTIL", long_name[] = "graphics utilization", unit[] = "%";
    if (!m || m->version != 1 || m->numMetrics > 210) return INVALID_ARG;
    gpm_sample_t *a = m->sample1, *b = m->sample2;
    if (!a || !b || !a->filled || !b->filled || a->gpu != b->gpu || a->gi != b->gi ||
        b->seq <= a->seq)
        return INVALID_ARG;
    for (unsigned i = 0; i < m->numMetrics; i++) {
        gpm_metric_t *r = &m->metrics[i];
        r->nvmlReturn = NOT_SUPPORTED;
        if (r->metricId != 1) continue; /* NVML_GPM_METRIC_GRAPHICS_UTIL */
        for (int k = 0; k < ngpm; k++)
            if (GPM[k].gpu == a->gpu && GPM[k].gi == a->gi) {
                r->value = GPM[k].util;
                r->nvmlReturn = OK;
                r->metricInfo.shortName = short_name;
                r->metricInfo.longName = long_name;
                r->metricInfo.unit = unit;
            }
    }
    return OK;
}
