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
static int physical[16]; /* CUDA ordinal -> physical GPU (CUDA_VISIBLE_DEVICES) */
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
  if (ndev > 16) ndev = 16;
  for (int i = 0; i < 16; i++) physical[i] = i;
  const char *vis = getenv("CUDA_VISIBLE_DEVICES");
  if (vis) {
    int n = 0;
    for (const char *p = vis; *p && n < 16;) {
      char *end;
      long v = strtol(p, &end, 10);
      if (end == p || v < 0 || v >= ndev) break; /* like CUDA: stop at the first invalid entry */
      physical[n++] = (int)v;
      p = *end == ',' ? end + 1 : end;
      if (*end != ',') break;
    }
    ndev = n;
  }
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
/* UUID of physical GPU i: a0 a1 ... ae i (the fake NVML reports the same). */
EXPORT CUresult cuDeviceGetUuid(unsigned char *u, CUdevice d) {
  init();
  if (!u || d < 0 || d >= ndev) return CUDA_ERROR_INVALID_VALUE;
  for (int i = 0; i < 15; i++) u[i] = (unsigned char)(0xa0 + i);
  u[15] = (unsigned char)physical[d];
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid_v2(unsigned char *u, CUdevice d) { return cuDeviceGetUuid(u, d); }
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
static CUresult pool_free(CUdeviceptr d);
EXPORT CUresult cuMemFree_v2(CUdeviceptr d) { return pool_free(d); }
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *d, size_t bytes, unsigned flags) { (void)flags; return alloc_ptr(d, bytes); }
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *d, size_t *pitch, size_t w, size_t h, unsigned elem) {
  (void)elem;
  if (!pitch) return CUDA_ERROR_INVALID_VALUE;
  size_t p = (w + 511) / 512 * 512;
  CUresult rc = alloc_ptr(d, (unsigned long long)p * h);
  if (rc == CUDA_SUCCESS) *pitch = p;
  return rc;
}
/* Stream-ordered pools: a pool holds (reserved) what it ever needed at once; frees return
   memory to the pool, which releases what it holds beyond its release threshold at the
   next synchronisation, or on cuMemPoolTrimTo. One default pool per device plus created
   pools. The pool of a pointer is remembered under key|POOLKEY in the pointer table. */
#define POOLKEY (1ull << 63)
struct fake_pool { int dev, host; unsigned long long reserved, in_use, threshold; }; /* host: pinned host memory, no device charge */
static struct fake_pool default_pool[16];
static struct fake_pool *created_pool[64];
static int ncreated;
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;

static struct fake_pool *pool_of(CUmemoryPool p) {
  struct fake_pool *fp = p;
  for (int i = 0; i < 16; i++) if (fp == &default_pool[i]) return fp;
  for (int i = 0; i < ncreated; i++) if (fp == created_pool[i]) return fp;
  return NULL;
}
static CUresult pool_alloc(CUdeviceptr *d, size_t bytes, struct fake_pool *p) {
  init();
  if (!current) return CUDA_ERROR_INVALID_CONTEXT;
  if (!d || bytes == 0 || !p) return CUDA_ERROR_INVALID_VALUE;
  unsigned long long r = round_gran(bytes);
  pthread_mutex_lock(&pool_mu);
  if (p->in_use + r > p->reserved) {
    if (!p->host && !charge(p->in_use + r - p->reserved)) { pthread_mutex_unlock(&pool_mu); return CUDA_ERROR_OUT_OF_MEMORY; }
    p->reserved = p->in_use + r;
  }
  p->in_use += r;
  pthread_mutex_unlock(&pool_mu);
  *d = atomic_fetch_add(&next_va, r);
  put(*d, r);
  put(*d | POOLKEY, (unsigned long long)(size_t)p);
  return CUDA_SUCCESS;
}
static CUresult pool_free(CUdeviceptr d) {
  long long s = take(d);
  if (s < 0) return CUDA_ERROR_INVALID_VALUE;
  long long p = take(d | POOLKEY);
  if (p < 0) { uncharge((unsigned long long)s); return CUDA_SUCCESS; }
  pthread_mutex_lock(&pool_mu);
  ((struct fake_pool *)(size_t)p)->in_use -= (unsigned long long)s;
  pthread_mutex_unlock(&pool_mu);
  return CUDA_SUCCESS;
}
static void pool_trim(struct fake_pool *p, unsigned long long keep) {
  unsigned long long floor = p->in_use > keep ? p->in_use : keep;
  if (p->reserved > floor) { if (!p->host) uncharge(p->reserved - floor); p->reserved = floor; }
}
static void pools_sync(void) {
  pthread_mutex_lock(&pool_mu);
  for (int i = 0; i < 16; i++) if (default_pool[i].reserved > default_pool[i].threshold) pool_trim(&default_pool[i], default_pool[i].threshold);
  for (int i = 0; i < ncreated; i++) if (created_pool[i]->reserved > created_pool[i]->threshold) pool_trim(created_pool[i], created_pool[i]->threshold);
  pthread_mutex_unlock(&pool_mu);
}
EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *p, CUdevice dev) {
  init();
  if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_VALUE;
  default_pool[dev].dev = dev;
  *p = &default_pool[dev];
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *p, CUdevice dev) { return cuDeviceGetDefaultMemPool(p, dev); }
EXPORT CUresult cuMemPoolCreate(CUmemoryPool *p, const CUmemPoolProps *props) {
  if (!p || !props) return CUDA_ERROR_INVALID_VALUE;
  int host = props->location.type != 1;
  if (!host && (props->location.id < 0 || props->location.id >= ndev)) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&pool_mu);
  if (ncreated == 64) { pthread_mutex_unlock(&pool_mu); return CUDA_ERROR_OUT_OF_MEMORY; }
  struct fake_pool *fp = calloc(1, sizeof *fp);
  fp->host = host;
  fp->dev = host ? 0 : props->location.id;
  created_pool[ncreated++] = fp;
  pthread_mutex_unlock(&pool_mu);
  *p = fp;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool p) {
  struct fake_pool *fp = pool_of(p);
  if (!fp || (fp >= &default_pool[0] && fp < &default_pool[0] + 16)) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&pool_mu);
  pool_trim(fp, 0);
  pthread_mutex_unlock(&pool_mu);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool p, size_t keep) {
  struct fake_pool *fp = pool_of(p);
  if (!fp) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&pool_mu);
  pool_trim(fp, keep);
  pthread_mutex_unlock(&pool_mu);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool p, int attr, void *v) {
  struct fake_pool *fp = pool_of(p);
  if (!fp || !v) return CUDA_ERROR_INVALID_VALUE;
  if (attr != 4) return CUDA_ERROR_NOT_SUPPORTED;
  fp->threshold = *(unsigned long long *)v;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool p, int attr, void *v) {
  struct fake_pool *fp = pool_of(p);
  if (!fp || !v) return CUDA_ERROR_INVALID_VALUE;
  unsigned long long *out = v;
  pthread_mutex_lock(&pool_mu);
  switch (attr) {
  case 4: *out = fp->threshold; break;
  case 5: case 6: *out = fp->reserved; break;
  case 7: case 8: *out = fp->in_use; break;
  default: pthread_mutex_unlock(&pool_mu); return CUDA_ERROR_NOT_SUPPORTED;
  }
  pthread_mutex_unlock(&pool_mu);
  return CUDA_SUCCESS;
}
/* Stream capture: while a stream is captured, stream-ordered allocations and frees on it
   become graph memory nodes instead of happening. */
struct fake_graph;
static struct fake_graph *capture_graph;
static CUstream capture_stream;
static CUresult capture_alloc(CUdeviceptr *d, size_t b);
static CUresult capture_free(CUdeviceptr d);
static int captured(CUstream s) { return capture_graph && s == capture_stream; }
EXPORT CUresult cuStreamIsCapturing(CUstream s, int *status) { *status = captured(s); return CUDA_SUCCESS; }
EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream s, int *status) { return cuStreamIsCapturing(s, status); }
static struct fake_pool *cur_pool(void) {
  CUmemoryPool p = NULL;
  return cuDeviceGetMemPool(&p, current ? current->dev : 0) == CUDA_SUCCESS ? p : NULL;
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *d, size_t b, CUstream s) { init(); return captured(s) ? capture_alloc(d, b) : pool_alloc(d, b, cur_pool()); }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t b, CUstream s) { return cuMemAllocAsync(d, b, s); }
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *d, size_t b, CUmemoryPool p, CUstream s) { return captured(s) ? capture_alloc(d, b) : pool_alloc(d, b, pool_of(p)); }
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *d, size_t b, CUmemoryPool p, CUstream s) { return cuMemAllocFromPoolAsync(d, b, p, s); }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr d, CUstream s) { return captured(s) ? capture_free(d) : pool_free(d); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr d, CUstream s) { return cuMemFreeAsync(d, s); }
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
/* Graphs with memory nodes: allocation nodes get their address when added; a launch grows
   the device's graph memory pool to what the graph's allocations need (the fake never
   reuses memory inside a graph); the pool keeps it until cuDeviceGraphMemTrim.
   A "graph exec" without the magic is a CUfunction launched with one wave (SM tests). */
#define GRAPH_MAGIC 0xfa4e6ec5fa4e6ec5ull
struct fake_graph;
struct fake_node { int type; int dev; unsigned long long bytes, dptr; struct fake_graph *child; };
struct fake_graph { unsigned long long magic; int n; int moved; struct fake_node nodes[64]; };
struct fake_exec { unsigned long long magic; int dev; unsigned long long need; };
static unsigned long long graph_reserved[16], graph_reserved_high[16];

EXPORT CUresult cuGraphCreate(void **g, unsigned flags) {
  (void)flags;
  struct fake_graph *fg = calloc(1, sizeof *fg);
  fg->magic = GRAPH_MAGIC;
  *g = fg;
  return CUDA_SUCCESS;
}
static void graph_free(struct fake_graph *g) {
  for (int i = 0; i < g->n; i++) if (g->nodes[i].child) graph_free(g->nodes[i].child);
  free(g);
}
EXPORT CUresult cuGraphDestroy(void *g) {
  struct fake_graph *fg = g;
  if (!fg || fg->magic != GRAPH_MAGIC || fg->moved) return CUDA_ERROR_INVALID_VALUE;
  graph_free(fg);
  return CUDA_SUCCESS;
}
/* Does g (or a graph nested in it) hold memory nodes? */
static int has_mem_nodes(const struct fake_graph *g) {
  for (int i = 0; i < g->n; i++)
    if (g->nodes[i].type == 10 || g->nodes[i].type == 11 || (g->nodes[i].child && has_mem_nodes(g->nodes[i].child))) return 1;
  return 0;
}
/* Bytes per launch of g's allocation nodes, nested graphs included (device of the last). */
static unsigned long long graph_need(const struct fake_graph *g, int *dev) {
  unsigned long long need = 0;
  for (int i = 0; i < g->n; i++) {
    if (g->nodes[i].type == 10) { *dev = g->nodes[i].dev; need += g->nodes[i].bytes; }
    if (g->nodes[i].child) need += graph_need(g->nodes[i].child, dev);
  }
  return need;
}
static CUresult add_node(void **node, struct fake_graph *g, int type, int dev, unsigned long long bytes, unsigned long long dptr) {
  if (!g || g->magic != GRAPH_MAGIC || g->n == 64) return CUDA_ERROR_INVALID_VALUE;
  struct fake_node *n = &g->nodes[g->n++];
  n->type = type; n->dev = dev; n->bytes = bytes; n->dptr = dptr; n->child = NULL;
  *node = n;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphAddMemAllocNode(void **node, void *g, const void **deps, size_t nd, CUDA_MEM_ALLOC_NODE_PARAMS *p) {
  (void)deps; (void)nd;
  if (!p || p->bytesize == 0 || p->poolProps.location.id < 0 || p->poolProps.location.id >= ndev) return CUDA_ERROR_INVALID_VALUE;
  unsigned long long r = round_gran(p->bytesize);
  p->dptr = atomic_fetch_add(&next_va, r);
  return add_node(node, g, 10, p->poolProps.location.id, r, p->dptr);
}
EXPORT CUresult cuGraphAddMemFreeNode(void **node, void *g, const void **deps, size_t nd, CUdeviceptr d) {
  (void)deps; (void)nd;
  return add_node(node, g, 11, 0, 0, d);
}
/* cuGraphAddNode(_v2) with CUgraphNodeParams: a child graph node (CUDA 12.9/13 ownership
   semantics: CLONE refuses graphs with memory nodes, MOVE hands the graph to the parent),
   a conditional node (its body is created empty; bodies cannot hold memory nodes), or any
   other type number (a stand-in for node types newer than the shim). */
static CUresult add_generic(void **node, void *g, const CUgraphNodeParams *p) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  if (p->type == 4) {
    struct fake_graph *c = p->graph.graph;
    if (!c || c->magic != GRAPH_MAGIC || c->moved || c == g) return CUDA_ERROR_INVALID_VALUE;
    if (p->graph.ownership != 1) {
      /* The fake clones only flat graphs without memory nodes (enough for the tests). */
      if (has_mem_nodes(c)) return CUDA_ERROR_NOT_SUPPORTED;
      for (int i = 0; i < c->n; i++) if (c->nodes[i].child) return CUDA_ERROR_NOT_SUPPORTED;
      struct fake_graph *copy = malloc(sizeof *copy);
      memcpy(copy, c, sizeof *copy);
      c = copy;
    }
    CUresult rc = add_node(node, g, 4, 0, 0, 0);
    if (rc) return rc;
    c->moved = 1;
    ((struct fake_node *)*node)->child = c;
    return CUDA_SUCCESS;
  }
  if (p->type == 13) {
    void *body = NULL;
    cuGraphCreate(&body, 0);
    CUresult rc = add_node(node, g, 13, 0, 0, 0);
    if (rc) { free(body); return rc; }
    ((struct fake_graph *)body)->moved = 1;
    ((struct fake_node *)*node)->child = body;
    return CUDA_SUCCESS;
  }
  return add_node(node, g, p->type, 0, 0, 0);
}
EXPORT CUresult cuGraphAddNode(void **node, void *g, const void **deps, size_t nd, CUgraphNodeParams *p) {
  (void)deps; (void)nd;
  return add_generic(node, g, p);
}
EXPORT CUresult cuGraphAddNode_v2(void **node, void *g, const void **deps, const void *edges, size_t nd, CUgraphNodeParams *p) {
  (void)deps; (void)edges; (void)nd;
  return add_generic(node, g, p);
}
/* FAKE_CUDA_CHILD_QUERY_FAILS=1: the query fails (a driver in a bad state). */
EXPORT CUresult cuGraphChildGraphNodeGetGraph(void *node, void **g) {
  struct fake_node *n = node;
  if (!n || !g || n->type != 4 || !n->child) return CUDA_ERROR_INVALID_VALUE;
  const char *fail = getenv("FAKE_CUDA_CHILD_QUERY_FAILS");
  if (fail && *fail == '1') return CUDA_ERROR_NOT_SUPPORTED;
  *g = n->child;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphGetNodes(void *g, void **nodes, size_t *n) {
  struct fake_graph *fg = g;
  if (!fg || fg->magic != GRAPH_MAGIC || !n) return CUDA_ERROR_INVALID_VALUE;
  if (!nodes) { *n = (size_t)fg->n; return CUDA_SUCCESS; }
  size_t k = *n < (size_t)fg->n ? *n : (size_t)fg->n;
  for (size_t i = 0; i < k; i++) nodes[i] = &fg->nodes[i];
  *n = k;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphNodeGetType(void *node, int *t) { *t = ((struct fake_node *)node)->type; return CUDA_SUCCESS; }
EXPORT CUresult cuGraphMemAllocNodeGetParams(void *node, CUDA_MEM_ALLOC_NODE_PARAMS *p) {
  struct fake_node *n = node;
  if (n->type != 10) return CUDA_ERROR_INVALID_VALUE;
  memset(p, 0, sizeof *p);
  p->poolProps.allocType = 1;
  p->poolProps.location.type = 1;
  p->poolProps.location.id = n->dev;
  p->bytesize = n->bytes;
  p->dptr = n->dptr;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamBeginCapture(CUstream s, int mode) {
  (void)mode;
  if (capture_graph) return CUDA_ERROR_INVALID_VALUE;
  void *g = NULL;
  cuGraphCreate(&g, 0);
  capture_graph = g;
  capture_stream = s;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, int mode) { return cuStreamBeginCapture(s, mode); }
EXPORT CUresult cuStreamEndCapture(CUstream s, void **g) {
  if (!captured(s)) return CUDA_ERROR_INVALID_VALUE;
  *g = capture_graph;
  capture_graph = NULL;
  return CUDA_SUCCESS;
}
static CUresult capture_alloc(CUdeviceptr *d, size_t b) {
  if (!current || !d || b == 0) return CUDA_ERROR_INVALID_VALUE;
  void *node = NULL;
  unsigned long long r = round_gran(b);
  *d = atomic_fetch_add(&next_va, r);
  return add_node(&node, capture_graph, 10, current->dev, r, *d);
}
static CUresult capture_free(CUdeviceptr d) {
  void *node = NULL;
  return add_node(&node, capture_graph, 11, 0, 0, d);
}
EXPORT CUresult cuGraphInstantiateWithFlags(void **exec, void *g, unsigned long long flags) {
  (void)flags;
  struct fake_graph *fg = g;
  if (!fg || fg->magic != GRAPH_MAGIC || fg->moved) return CUDA_ERROR_INVALID_VALUE;
  struct fake_exec *e = calloc(1, sizeof *e);
  e->magic = GRAPH_MAGIC;
  e->need = graph_need(fg, &e->dev);
  *exec = e;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphInstantiate_v2(void **exec, void *g, void **err, char *log, size_t n) { (void)err; (void)log; (void)n; return cuGraphInstantiateWithFlags(exec, g, 0); }
EXPORT CUresult cuGraphInstantiate(void **exec, void *g, void **err, char *log, size_t n) { return cuGraphInstantiate_v2(exec, g, err, log, n); }
EXPORT CUresult cuGraphExecDestroy(void *exec) { free(exec); return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev) {
  if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&pool_mu);
  uncharge(graph_reserved[dev]);
  graph_reserved[dev] = 0;
  pthread_mutex_unlock(&pool_mu);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, int attr, void *v) {
  if (dev < 0 || dev >= ndev || !v) return CUDA_ERROR_INVALID_VALUE;
  unsigned long long *out = v;
  pthread_mutex_lock(&pool_mu);
  *out = attr == 1 || attr == 3 ? graph_reserved_high[dev] : graph_reserved[dev];
  pthread_mutex_unlock(&pool_mu);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) {
  (void)s;
  struct fake_exec *e = g;
  if (e && e->magic == GRAPH_MAGIC) {
    init();
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&pool_mu);
    if (e->need > graph_reserved[e->dev]) {
      if (!charge(e->need - graph_reserved[e->dev])) { pthread_mutex_unlock(&pool_mu); return CUDA_ERROR_OUT_OF_MEMORY; }
      graph_reserved[e->dev] = e->need;
      if (e->need > graph_reserved_high[e->dev]) graph_reserved_high[e->dev] = e->need;
    }
    pthread_mutex_unlock(&pool_mu);
    return CUDA_SUCCESS;
  }
  return launch((CUfunction)g, (unsigned long long)sms);
}
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
EXPORT CUresult cuStreamSynchronize(CUstream s) { (void)s; drain(); pools_sync(); return CUDA_SUCCESS; }
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { return cuStreamSynchronize(s); }
EXPORT CUresult cuCtxSynchronize(void) { drain(); pools_sync(); return CUDA_SUCCESS; }
EXPORT CUresult cuEventSynchronize(void *e) { (void)e; drain(); pools_sync(); return CUDA_SUCCESS; }

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
  E(cuDeviceTotalMem), E(cuDeviceTotalMem_v2), E(cuDeviceGetUuid), E(cuDeviceGetUuid_v2), E(cuCtxCreate), E(cuCtxCreate_v2), E(cuCtxDestroy), E(cuCtxDestroy_v2),
  E(cuDevicePrimaryCtxRetain), E(cuDevicePrimaryCtxRelease), E(cuDevicePrimaryCtxRelease_v2),
  E(cuCtxSetCurrent), E(cuCtxGetCurrent), E(cuCtxGetDevice), E(cuCtxSynchronize), E(cuStreamSynchronize),
  E(cuMemAlloc), E(cuMemAlloc_v2), E(cuMemFree_v2), E(cuMemAllocManaged), E(cuMemAllocPitch_v2),
  E(cuMemAllocAsync), E(cuMemAllocAsync_ptsz), E(cuMemAllocFromPoolAsync), E(cuMemAllocFromPoolAsync_ptsz),
  E(cuMemFreeAsync), E(cuMemFreeAsync_ptsz), E(cuMemGetInfo), E(cuMemGetInfo_v2), E(cuMemGetAllocationGranularity),
  E(cuMemCreate), E(cuMemRelease), E(cuMemAddressReserve), E(cuMemMap), E(cuMemUnmap),
  E(cuArrayCreate_v2), E(cuArray3DCreate_v2), E(cuArrayDestroy), E(cuMipmappedArrayCreate), E(cuMipmappedArrayDestroy),
  E(cuModuleLoadData), E(cuModuleGetFunction), E(cuLaunchKernel), E(cuLaunchKernel_ptsz), E(cuLaunchKernelEx),
  E(cuLaunchKernelEx_ptsz), E(cuLaunchCooperativeKernel), E(cuLaunchCooperativeKernel_ptsz), E(cuGraphLaunch),
  E(cuGraphLaunch_ptsz), E(cuStreamSynchronize_ptsz), E(cuEventSynchronize),
  E(cuDeviceGetDefaultMemPool), E(cuDeviceGetMemPool), E(cuMemPoolCreate), E(cuMemPoolDestroy), E(cuMemPoolTrimTo),
  E(cuMemPoolSetAttribute), E(cuMemPoolGetAttribute), E(cuGraphCreate), E(cuGraphDestroy), E(cuGraphAddMemAllocNode),
  E(cuGraphAddMemFreeNode), E(cuGraphAddNode), E(cuGraphAddNode_v2), E(cuGraphChildGraphNodeGetGraph), E(cuGraphGetNodes), E(cuGraphNodeGetType), E(cuGraphMemAllocNodeGetParams),
  E(cuGraphInstantiate), E(cuGraphInstantiate_v2), E(cuGraphInstantiateWithFlags), E(cuGraphExecDestroy),
  E(cuDeviceGraphMemTrim), E(cuDeviceGetGraphMemAttribute), E(cuStreamIsCapturing), E(cuStreamIsCapturing_ptsz),
  E(cuStreamBeginCapture), E(cuStreamBeginCapture_v2), E(cuStreamEndCapture),
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
    { "cuGetProcAddress", 12000, "cuGetProcAddress_v2" }, { "cuGraphInstantiate", 12000, "cuGraphInstantiateWithFlags" },
    { "cuGraphInstantiate", 11000, "cuGraphInstantiate_v2" }, { "cuGraphAddNode", 12030, "cuGraphAddNode_v2" },
  };
  for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
    if (!strcmp(sym, rules[i].base) && ver >= rules[i].v) return rules[i].name;
  return sym;
}

static CUresult procaddr(const char *sym, void **pfn, int ver, unsigned long long flags) {
  static const char *ptsz[] = { "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch",
                                "cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemFreeAsync", "cuStreamSynchronize" };
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
