/*
 * Fake libcuda.so.1 for the shim's tests. Models what the shim depends on:
 *  - device memory with a 2 MiB granularity, tracked per allocation, shared between the
 *    processes of a test through an mmap'd state file (FAKE_GPU_STATE) that also records
 *    the peak so tests can check the limit was never passed;
 *  - contexts that cost FAKE_CUDA_CTX_OVERHEAD_MIB of device memory;
 *  - stream-ordered pools, VMM handles, arrays and mipmapped arrays;
 *  - kernels that take simulated time: a function named "spin_<us>" costs <us> per wave
 *    of FAKE_CUDA_SMS blocks; launches queue on one timeline and synchronisation sleeps
 *    until it drains; busy time feeds the fake NVML's utilization;
 *  - cuGetProcAddress(_v2) with the driver's version/ptsz rules, from a static table (not
 *    dlsym, so the shim's dlsym hook cannot make tests pass by accident).
 * Built with -Bsymbolic so its own table holds its own addresses, like the real driver.
 * Environment: FAKE_CUDA_MEM_MIB (81920), FAKE_CUDA_SMS (132), FAKE_CUDA_DEVICES (1),
 * FAKE_CUDA_CTX_OVERHEAD_MIB (300), FAKE_GPU_STATE (path, optional).
 */
#define _GNU_SOURCE
#include "fakecuda.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#define GRAN (2ull << 20)
#define EXPORT __attribute__((visibility("default")))

struct gpu_state {
  _Atomic unsigned long long used;
  _Atomic unsigned long long peak;
};

struct fake_ctx { int dev; };
struct fake_fn { unsigned long long wave_ns; };
struct fake_array { unsigned long long bytes; };

static struct gpu_state local_state;
static struct gpu_state *gs = &local_state;
static unsigned long long total_mem = 81920ull << 20;
static unsigned long long ctx_overhead = 300ull << 20;
static int sms = 132, ndev = 1;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static __thread CUcontext current;
static struct fake_ctx primary[16];
static int primary_refs[16];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static unsigned long long env_ull(const char *k, unsigned long long d) {
  const char *v = getenv(k);
  return v ? strtoull(v, NULL, 10) : d;
}

static void setup(void) {
  total_mem = env_ull("FAKE_CUDA_MEM_MIB", 81920) << 20;
  ctx_overhead = env_ull("FAKE_CUDA_CTX_OVERHEAD_MIB", 300) << 20;
  sms = (int)env_ull("FAKE_CUDA_SMS", 132);
  ndev = (int)env_ull("FAKE_CUDA_DEVICES", 1);
  const char *path = getenv("FAKE_GPU_STATE");
  if (path) {
    int fd = open(path, O_RDWR | O_CREAT, 0666);
    if (fd >= 0 && ftruncate(fd, 4096) == 0) {
      void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) gs = p;
    }
    if (fd >= 0) close(fd);
  }
}
static void init(void) { pthread_once(&once, setup); }

static unsigned long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (unsigned long long)t.tv_sec * 1000000000ull + t.tv_nsec;
}

static unsigned long long round_gran(unsigned long long b) { return (b + GRAN - 1) / GRAN * GRAN; }

/* Device memory: charge `bytes` (rounded) or fail. */
static int charge(unsigned long long bytes) {
  unsigned long long cur = atomic_load(&gs->used);
  do {
    if (cur + bytes > total_mem) return 0;
  } while (!atomic_compare_exchange_weak(&gs->used, &cur, cur + bytes));
  unsigned long long now = cur + bytes, peak = atomic_load(&gs->peak);
  while (now > peak && !atomic_compare_exchange_weak(&gs->peak, &peak, now)) {}
  return 1;
}
static void uncharge(unsigned long long bytes) { atomic_fetch_sub(&gs->used, bytes); }

/* Allocation table: pointer -> size (chained hash). */
#define BUCKETS 65536
struct node { unsigned long long key, size; struct node *next; };
static struct node *table[BUCKETS];
static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic unsigned long long next_va = 0x7f0000000000ull;

static unsigned bucket(unsigned long long k) { return (unsigned)((k * 0x9E3779B97F4A7C15ull) >> 48) % BUCKETS; }
static void put(unsigned long long k, unsigned long long size) {
  struct node *n = malloc(sizeof *n);
  n->key = k; n->size = size;
  pthread_mutex_lock(&table_mu);
  n->next = table[bucket(k)]; table[bucket(k)] = n;
  pthread_mutex_unlock(&table_mu);
}
static long long take(unsigned long long k) {
  long long size = -1;
  pthread_mutex_lock(&table_mu);
  for (struct node **p = &table[bucket(k)]; *p; p = &(*p)->next) {
    if ((*p)->key == k) { struct node *n = *p; *p = n->next; size = (long long)n->size; free(n); break; }
  }
  pthread_mutex_unlock(&table_mu);
  return size;
}

static CUresult alloc_ptr(CUdeviceptr *d, unsigned long long bytes) {
  init();
  if (!current) return CUDA_ERROR_INVALID_CONTEXT;
  if (!d || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  unsigned long long r = round_gran(bytes);
  if (!charge(r)) return CUDA_ERROR_OUT_OF_MEMORY;
  *d = atomic_fetch_add(&next_va, r);
  put(*d, r);
  return CUDA_SUCCESS;
}
static CUresult free_ptr(CUdeviceptr d) {
  long long s = take(d);
  if (s < 0) return CUDA_ERROR_INVALID_VALUE;
  uncharge((unsigned long long)s);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuInit(unsigned flags) { (void)flags; init(); return CUDA_SUCCESS; }
EXPORT CUresult cuDriverGetVersion(int *v) { *v = 12080; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGetCount(int *n) { init(); *n = ndev; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGet(CUdevice *d, int ord) { init(); if (ord < 0 || ord >= ndev) return CUDA_ERROR_INVALID_VALUE; *d = ord; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
  init(); (void)d;
  *v = attr == 16 ? sms : 0;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) { init(); (void)d; *b = total_mem; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceTotalMem(unsigned *b, CUdevice d) { init(); (void)d; *b = (unsigned)total_mem; return CUDA_SUCCESS; }

static CUresult make_ctx(CUcontext *c, CUdevice dev) {
  init();
  if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_VALUE;
  if (!charge(ctx_overhead)) return CUDA_ERROR_OUT_OF_MEMORY;
  *c = calloc(1, sizeof **c);
  (*c)->dev = dev;
  current = *c;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice dev) { (void)flags; return make_ctx(c, dev); }
EXPORT CUresult cuCtxCreate(CUcontext *c, unsigned flags, CUdevice dev) { (void)flags; return make_ctx(c, dev); }
EXPORT CUresult cuCtxDestroy_v2(CUcontext c) {
  if (!c) return CUDA_ERROR_INVALID_VALUE;
  if (current == c) current = NULL;
  free(c);
  uncharge(ctx_overhead);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxDestroy(CUcontext c) { return cuCtxDestroy_v2(c); }
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice dev) {
  init();
  if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  CUresult rc = CUDA_SUCCESS;
  if (primary_refs[dev] == 0 && !charge(ctx_overhead)) rc = CUDA_ERROR_OUT_OF_MEMORY;
  if (rc == CUDA_SUCCESS) { primary_refs[dev]++; primary[dev].dev = dev; *c = &primary[dev]; }
  pthread_mutex_unlock(&mu);
  return rc;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  if (primary_refs[dev] > 0 && --primary_refs[dev] == 0) uncharge(ctx_overhead);
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }
EXPORT CUresult cuCtxSetCurrent(CUcontext c) { current = c; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxGetCurrent(CUcontext *c) { *c = current; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxGetDevice(CUdevice *d) {
  if (!current) return CUDA_ERROR_INVALID_CONTEXT;
  *d = current->dev;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *d, size_t bytes) { return alloc_ptr(d, bytes); }
EXPORT CUresult cuMemAlloc(unsigned *d, unsigned bytes) {
  CUdeviceptr p; CUresult rc = alloc_ptr(&p, bytes);
  if (rc == CUDA_SUCCESS) *d = (unsigned)p;
  return rc;
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr d) { return free_ptr(d); }
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *d, size_t bytes, unsigned flags) { (void)flags; return alloc_ptr(d, bytes); }
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *d, size_t *pitch, size_t w, size_t h, unsigned elem) {
  (void)elem;
  if (!pitch) return CUDA_ERROR_INVALID_VALUE;
  size_t p = (w + 511) / 512 * 512;
  CUresult rc = alloc_ptr(d, (unsigned long long)p * h);
  if (rc == CUDA_SUCCESS) *pitch = p;
  return rc;
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *d, size_t b, CUstream s) { (void)s; return alloc_ptr(d, b); }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t b, CUstream s) { (void)s; return alloc_ptr(d, b); }
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *d, size_t b, CUmemoryPool p, CUstream s) { (void)p; (void)s; return alloc_ptr(d, b); }
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *d, size_t b, CUmemoryPool p, CUstream s) { (void)p; (void)s; return alloc_ptr(d, b); }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr d, CUstream s) { (void)s; return free_ptr(d); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr d, CUstream s) { (void)s; return free_ptr(d); }
EXPORT CUresult cuMemGetInfo_v2(size_t *f, size_t *t) {
  init();
  if (!current) return CUDA_ERROR_INVALID_CONTEXT;
  *t = total_mem;
  *f = total_mem - atomic_load(&gs->used);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemGetInfo(unsigned *f, unsigned *t) { size_t a, b; CUresult rc = cuMemGetInfo_v2(&a, &b); *f = (unsigned)a; *t = (unsigned)b; return rc; }
EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *p, int opt) { (void)p; (void)opt; *g = GRAN; return CUDA_SUCCESS; }
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *p, unsigned long long flags) {
  (void)flags; init();
  if (!h || !p || size % GRAN) return CUDA_ERROR_INVALID_VALUE;
  if (!charge(size)) return CUDA_ERROR_OUT_OF_MEMORY;
  *h = atomic_fetch_add(&next_va, size) | 1;
  put(*h, size);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return free_ptr(h); }
EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long f) {
  (void)align; (void)addr; (void)f;
  *p = atomic_fetch_add(&next_va, round_gran(size));
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemMap(CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h, unsigned long long f) {
  (void)p; (void)size; (void)off; (void)h; (void)f;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t size) { (void)p; (void)size; return CUDA_SUCCESS; }

static unsigned long long elem(unsigned fmt, unsigned ch) {
  unsigned long long b = (fmt == 1 || fmt == 8) ? 1 : (fmt == 2 || fmt == 9 || fmt == 0x10) ? 2 : 4;
  return b * (ch ? ch : 1);
}
static CUresult make_array(CUarray *a, unsigned long long bytes) {
  init();
  if (!current) return CUDA_ERROR_INVALID_CONTEXT;
  unsigned long long r = round_gran(bytes);
  if (!charge(r)) return CUDA_ERROR_OUT_OF_MEMORY;
  *a = malloc(sizeof **a);
  (*a)->bytes = r;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d) {
  return make_array(a, (unsigned long long)d->Width * (d->Height ? d->Height : 1) * elem(d->Format, d->NumChannels));
}
EXPORT CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d) {
  return make_array(a, (unsigned long long)d->Width * (d->Height ? d->Height : 1) * (d->Depth ? d->Depth : 1) * elem(d->Format, d->NumChannels));
}
EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels) {
  unsigned long long w = d->Width, h = d->Height, z = d->Depth, sum = 0;
  for (unsigned i = 0; i < (levels ? levels : 1); i++) {
    sum += w * (h ? h : 1) * (z ? z : 1) * elem(d->Format, d->NumChannels);
    w = w / 2 ? w / 2 : 1; h = h ? (h / 2 ? h / 2 : 1) : 0; z = z ? (z / 2 ? z / 2 : 1) : 0;
  }
  return make_array(a, sum);
}
EXPORT CUresult cuArrayDestroy(CUarray a) { if (!a) return CUDA_ERROR_INVALID_VALUE; uncharge(a->bytes); free(a); return CUDA_SUCCESS; }
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) { return cuArrayDestroy(a); }

/* ---- kernels and the simulated timeline ---- */
#define RING 8192
static pthread_mutex_t tl_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long gpu_free_at, busy_total;
static unsigned long long ring_start[RING], ring_end[RING];
static unsigned ring_head;

EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *img) { (void)img; *m = (void *)1; return CUDA_SUCCESS; }
EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
  (void)m;
  unsigned long long us = 0;
  if (sscanf(name, "spin_%llu", &us) != 1) return CUDA_ERROR_NOT_FOUND;
  *f = malloc(sizeof **f);
  (*f)->wave_ns = us * 1000ull;
  return CUDA_SUCCESS;
}

static CUresult launch(CUfunction f, unsigned long long blocks) {
  init();
  if (!current) return CUDA_ERROR_INVALID_CONTEXT;
  unsigned long long waves = (blocks + sms - 1) / sms;
  unsigned long long dur = f ? waves * f->wave_ns : 0;
  if (dur == 0) return CUDA_SUCCESS;
  pthread_mutex_lock(&tl_mu);
  unsigned long long now = now_ns();
  unsigned long long start = gpu_free_at > now ? gpu_free_at : now;
  gpu_free_at = start + dur;
  busy_total += dur;
  ring_start[ring_head % RING] = start;
  ring_end[ring_head % RING] = start + dur;
  ring_head++;
  pthread_mutex_unlock(&tl_mu);
  return CUDA_SUCCESS;
}
#define GRID(gx, gy, gz) ((unsigned long long)(gx) * (gy) * (gz))
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sh, CUstream s, void **p, void **e) {
  (void)bx; (void)by; (void)bz; (void)sh; (void)s; (void)p; (void)e;
  return launch(f, GRID(gx, gy, gz));
}
EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sh, CUstream s, void **p, void **e) {
  return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, sh, s, p, e);
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **e) {
  (void)p; (void)e;
  return launch(f, GRID(c->gridDimX, c->gridDimY, c->gridDimZ));
}
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **p, void **e) { return cuLaunchKernelEx(c, f, p, e); }
EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sh, CUstream s, void **p) {
  (void)bx; (void)by; (void)bz; (void)sh; (void)s; (void)p;
  return launch(f, GRID(gx, gy, gz));
}
EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sh, CUstream s, void **p) {
  return cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, sh, s, p);
}
/* A "graph exec" in the fake is a CUfunction launched with one wave. */
EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { (void)s; return launch((CUfunction)g, (unsigned long long)sms); }
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { return cuGraphLaunch(g, s); }

static void drain(void) {
  pthread_mutex_lock(&tl_mu);
  unsigned long long until = gpu_free_at;
  pthread_mutex_unlock(&tl_mu);
  unsigned long long now = now_ns();
  if (until > now) {
    struct timespec t = { (time_t)((until - now) / 1000000000ull), (long)((until - now) % 1000000000ull) };
    nanosleep(&t, NULL);
  }
}
EXPORT CUresult cuStreamSynchronize(CUstream s) { (void)s; drain(); return CUDA_SUCCESS; }
EXPORT CUresult cuCtxSynchronize(void) { drain(); return CUDA_SUCCESS; }

/* Test hooks read by the fake NVML and the probes. */
EXPORT unsigned long long fakecuda_busy_ns(void) {
  pthread_mutex_lock(&tl_mu);
  unsigned long long now = now_ns(), b = busy_total;
  if (gpu_free_at > now) b -= gpu_free_at - now; /* not yet executed */
  pthread_mutex_unlock(&tl_mu);
  return b;
}
/* Percent of [now - window, now] during which a kernel ran. */
EXPORT unsigned fakecuda_util_percent(unsigned long long window_ns) {
  pthread_mutex_lock(&tl_mu);
  unsigned long long now = now_ns(), from = now - window_ns, busy = 0;
  unsigned n = ring_head < RING ? ring_head : RING;
  for (unsigned i = 0; i < n; i++) {
    unsigned long long s = ring_start[i], e = ring_end[i];
    if (s < from) s = from;
    if (e > now) e = now;
    if (e > s) busy += e - s;
  }
  pthread_mutex_unlock(&tl_mu);
  return (unsigned)(busy * 100 / window_ns);
}
EXPORT void fakecuda_mem(unsigned long long *used, unsigned long long *total, unsigned long long *peak) {
  init();
  *used = atomic_load(&gs->used);
  *total = total_mem;
  if (peak) *peak = atomic_load(&gs->peak);
}

/* ---- cuGetProcAddress ---- */
static CUresult future_alloc(CUdeviceptr *d, size_t b) { return alloc_ptr(d, b); }

struct entry { const char *name; void *fn; };
#define E(f) { #f, (void *)f }
static const struct entry entries[] = {
  E(cuInit), E(cuDriverGetVersion), E(cuDeviceGetCount), E(cuDeviceGet), E(cuDeviceGetAttribute),
  E(cuDeviceTotalMem), E(cuDeviceTotalMem_v2), E(cuCtxCreate), E(cuCtxCreate_v2), E(cuCtxDestroy), E(cuCtxDestroy_v2),
  E(cuDevicePrimaryCtxRetain), E(cuDevicePrimaryCtxRelease), E(cuDevicePrimaryCtxRelease_v2),
  E(cuCtxSetCurrent), E(cuCtxGetCurrent), E(cuCtxGetDevice), E(cuCtxSynchronize), E(cuStreamSynchronize),
  E(cuMemAlloc), E(cuMemAlloc_v2), E(cuMemFree_v2), E(cuMemAllocManaged), E(cuMemAllocPitch_v2),
  E(cuMemAllocAsync), E(cuMemAllocAsync_ptsz), E(cuMemAllocFromPoolAsync), E(cuMemAllocFromPoolAsync_ptsz),
  E(cuMemFreeAsync), E(cuMemFreeAsync_ptsz), E(cuMemGetInfo), E(cuMemGetInfo_v2), E(cuMemGetAllocationGranularity),
  E(cuMemCreate), E(cuMemRelease), E(cuMemAddressReserve), E(cuMemMap), E(cuMemUnmap),
  E(cuArrayCreate_v2), E(cuArray3DCreate_v2), E(cuArrayDestroy), E(cuMipmappedArrayCreate), E(cuMipmappedArrayDestroy),
  E(cuModuleLoadData), E(cuModuleGetFunction), E(cuLaunchKernel), E(cuLaunchKernel_ptsz), E(cuLaunchKernelEx),
  E(cuLaunchKernelEx_ptsz), E(cuLaunchCooperativeKernel), E(cuLaunchCooperativeKernel_ptsz), E(cuGraphLaunch),
  E(cuGraphLaunch_ptsz),
  /* A future alias of cuMemAlloc_v2 (same address: the shim must match it by pointer)
     and a future allocator with its own code (the shim must refuse it). */
  { "cuMemAllocAlias", (void *)cuMemAlloc_v2 },
  { "cuMemAllocFuture", (void *)future_alloc },
};
EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status);

static const char *versioned(const char *sym, int ver) {
  static const struct { const char *base; int v; const char *name; } rules[] = {
    { "cuMemAlloc", 3020, "cuMemAlloc_v2" }, { "cuMemFree", 3020, "cuMemFree_v2" },
    { "cuMemAllocPitch", 3020, "cuMemAllocPitch_v2" }, { "cuMemGetInfo", 3020, "cuMemGetInfo_v2" },
    { "cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2" }, { "cuArrayCreate", 3020, "cuArrayCreate_v2" },
    { "cuArray3DCreate", 3020, "cuArray3DCreate_v2" }, { "cuCtxCreate", 3020, "cuCtxCreate_v2" },
    { "cuCtxDestroy", 4000, "cuCtxDestroy_v2" }, { "cuDevicePrimaryCtxRelease", 11000, "cuDevicePrimaryCtxRelease_v2" },
    { "cuGetProcAddress", 12000, "cuGetProcAddress_v2" },
  };
  for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
    if (!strcmp(sym, rules[i].base) && ver >= rules[i].v) return rules[i].name;
  return sym;
}

static CUresult procaddr(const char *sym, void **pfn, int ver, unsigned long long flags) {
  static const char *ptsz[] = { "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch",
                                "cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemFreeAsync" };
  char name[128];
  snprintf(name, sizeof name, "%s", versioned(sym, ver));
  if (flags & 2)
    for (size_t i = 0; i < sizeof ptsz / sizeof ptsz[0]; i++)
      if (!strcmp(sym, ptsz[i])) { snprintf(name, sizeof name, "%s_ptsz", sym); break; }
  if (!strcmp(name, "cuGetProcAddress")) { *pfn = (void *)procaddr; return CUDA_SUCCESS; }
  if (!strcmp(name, "cuGetProcAddress_v2")) { *pfn = (void *)cuGetProcAddress_v2; return CUDA_SUCCESS; }
  for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++)
    if (!strcmp(name, entries[i].name)) { *pfn = entries[i].fn; return CUDA_SUCCESS; }
  *pfn = NULL;
  return CUDA_ERROR_NOT_FOUND;
}
EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags) {
  return procaddr(sym, pfn, ver, flags);
}
EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status) {
  CUresult rc = procaddr(sym, pfn, ver, flags);
  if (status) *status = rc == CUDA_SUCCESS ? 0 : 1;
  return rc;
}
