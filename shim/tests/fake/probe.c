/*
 * Probe program run under the shim (LD_PRELOAD) against the fake driver. It reaches the
 * driver in the way named by its first argument and runs one scenario:
 *   probe <direct|dlsym|dlvsym|rtldnext|procaddr|procaddr11|ptsz> <command> [args...]
 * and prints key=value lines the tests parse.
 */
#define _GNU_SOURCE
#include "fakecuda.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Declarations for direct binding (resolved at link time against the fake). */
CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
CUresult cuArrayDestroy(CUarray);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuDeviceTotalMem_v2(size_t *, CUdevice);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuStreamSynchronize(CUstream);
CUresult cuMemAlloc(unsigned *, unsigned);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *, CUdevice);
CUresult cuMemPoolSetAttribute(CUmemoryPool, int, void *);
CUresult cuMemPoolTrimTo(CUmemoryPool, size_t);
CUresult cuGraphCreate(void **, unsigned);
CUresult cuGraphAddMemAllocNode(void **, void *, const void **, size_t, CUDA_MEM_ALLOC_NODE_PARAMS *);
CUresult cuGraphAddMemFreeNode(void **, void *, const void **, size_t, CUdeviceptr);
CUresult cuGraphInstantiateWithFlags(void **, void *, unsigned long long);
CUresult cuGraphExecDestroy(void *);
CUresult cuDeviceGraphMemTrim(CUdevice);
CUresult cuDeviceGetGraphMemAttribute(CUdevice, int, void *);
CUresult cuStreamBeginCapture(CUstream, int);
CUresult cuMemPoolCreate(CUmemoryPool *, const CUmemPoolProps *);
CUresult cuStreamEndCapture(CUstream, void **);
CUresult cuGraphAddNode_v2(void **, void *, const void **, const void *, size_t, CUgraphNodeParams *);

#define FNS(X) \
  X(cuInit) X(cuDeviceGet) X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent) X(cuMemAlloc_v2) X(cuMemFree_v2) \
  X(cuMemAllocManaged) X(cuMemAllocPitch_v2) X(cuMemAllocAsync) X(cuMemAllocFromPoolAsync) X(cuMemFreeAsync) \
  X(cuMemCreate) X(cuMemRelease) X(cuArrayCreate_v2) X(cuArray3DCreate_v2) X(cuArrayDestroy) \
  X(cuMipmappedArrayCreate) X(cuMipmappedArrayDestroy) X(cuMemGetInfo_v2) X(cuDeviceTotalMem_v2) \
  X(cuModuleLoadData) X(cuModuleGetFunction) X(cuLaunchKernel) X(cuLaunchKernelEx) X(cuLaunchCooperativeKernel) \
  X(cuGraphLaunch) X(cuStreamSynchronize) X(cuMemAlloc) X(cuGetProcAddress_v2) \
  X(cuDeviceGetDefaultMemPool) X(cuMemPoolSetAttribute) X(cuMemPoolTrimTo) X(cuGraphCreate) \
  X(cuGraphAddMemAllocNode) X(cuGraphAddMemFreeNode) X(cuGraphInstantiateWithFlags) X(cuGraphExecDestroy) \
  X(cuDeviceGraphMemTrim) X(cuDeviceGetGraphMemAttribute) X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuMemPoolCreate) \
  X(cuGraphAddNode_v2)

static struct {
#define FIELD(f) __typeof__(&f) f;
  FNS(FIELD)
} T;

/* The name cuGetProcAddress is asked for: the base name, without _v2/_ptsz. */
static void base_name(const char *full, char *out, size_t n) {
  snprintf(out, n, "%s", full);
  char *p = strstr(out, "_v2");
  if (p && p[3] == 0) *p = 0;
  if (!strcmp(out, "cuMemAlloc") && !strcmp(full, "cuMemAlloc")) return;
}

static void resolve(const char *mode) {
  if (!strcmp(mode, "direct")) {
#define DIRECT(f) T.f = f;
    FNS(DIRECT)
    return;
  }
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); exit(3); }
  if (!strcmp(mode, "dlvsym")) {
    /* Needs the versioned copy of the fake: dlvsym finds no unversioned symbol. */
#define VIA_DLVSYM(f) T.f = (__typeof__(T.f))dlvsym(h, #f, "FAKECUDA_1");
    FNS(VIA_DLVSYM)
    return;
  }
  if (!strcmp(mode, "rtldnext")) {
#define VIA_NEXT(f) T.f = (__typeof__(T.f))dlsym(RTLD_NEXT, #f);
    FNS(VIA_NEXT)
    return;
  }
  if (!strcmp(mode, "dlsym")) {
#define VIA_DLSYM(f) T.f = (__typeof__(T.f))dlsym(h, #f);
    FNS(VIA_DLSYM)
    return;
  }
  int ver = 12080;
  unsigned long long flags = 0;
  CUresult (*gpa)(const char *, void **, int, unsigned long long, int *) = dlsym(h, "cuGetProcAddress_v2");
  CUresult (*gpa1)(const char *, void **, int, unsigned long long) = NULL;
  if (!strcmp(mode, "procaddr11")) { gpa1 = dlsym(h, "cuGetProcAddress"); ver = 11030; }
  else if (!strcmp(mode, "ptsz")) flags = 2;
  else if (strcmp(mode, "procaddr")) { fprintf(stderr, "unknown mode %s\n", mode); exit(2); }
  char base[128];
#define VIA_GPA(f) \
  base_name(#f, base, sizeof base); \
  if (gpa1) gpa1(base, (void **)&T.f, ver, flags); else gpa(base, (void **)&T.f, ver, flags, NULL);
  FNS(VIA_GPA)
  /* cuMemAlloc v1 is only reachable by an old version number. */
  if (gpa1) gpa1("cuMemAlloc", (void **)&T.cuMemAlloc, 2000, 0); else gpa("cuMemAlloc", (void **)&T.cuMemAlloc, 2000, 0, NULL);
}

static CUcontext ctx;

static void setup(void) {
  CUdevice dev;
  if (T.cuInit(0)) { printf("init_rc=%d\n", T.cuInit(0)); exit(4); }
  T.cuDeviceGet(&dev, 0);
  CUresult rc = T.cuDevicePrimaryCtxRetain(&ctx, dev);
  if (rc) { printf("ctx_rc=%d\n", rc); exit(5); }
  T.cuCtxSetCurrent(ctx);
}

struct handle { int kind; CUdeviceptr p; void *a; };
static const char *kinds[] = { "alloc", "managed", "pitch", "async", "pool", "vmm", "array", "array3d", "mipmap" };

static CUresult alloc_kind(int kind, unsigned long long bytes, struct handle *h) {
  h->kind = kind;
  size_t pitch;
  CUmemAllocationProp prop = { 1, 0, { 1, 0 }, NULL, { 0 } };
  CUDA_ARRAY_DESCRIPTOR d2 = { (size_t)(bytes / 4096 / 4), 4096, 0x20, 1 };
  CUDA_ARRAY3D_DESCRIPTOR d3 = { 1024, (size_t)(bytes / 1024 / 16 / 4), 16, 0x20, 1, 0 };
  CUDA_ARRAY3D_DESCRIPTOR dm = { 4096, (size_t)(bytes / 4096 / 4), 0, 0x01, 4, 0 };
  switch (kind) {
  case 0: return T.cuMemAlloc_v2(&h->p, bytes);
  case 1: return T.cuMemAllocManaged(&h->p, bytes, 1);
  case 2: return T.cuMemAllocPitch_v2(&h->p, &pitch, 1000, bytes / 1000, 4); /* pitch pads to 1024 */
  case 3: return T.cuMemAllocAsync(&h->p, bytes, NULL);
  case 4: {
    CUmemoryPool pool = NULL;
    T.cuDeviceGetDefaultMemPool(&pool, 0);
    return T.cuMemAllocFromPoolAsync(&h->p, bytes, pool, NULL);
  }
  case 5: return T.cuMemCreate(&h->p, (bytes + (2 << 20) - 1) / (2 << 20) * (2 << 20), &prop, 0);
  case 6: return T.cuArrayCreate_v2((CUarray *)&h->a, &d2);
  case 7: return T.cuArray3DCreate_v2((CUarray *)&h->a, &d3);
  case 8: return T.cuMipmappedArrayCreate((CUmipmappedArray *)&h->a, &dm, 1);
  }
  return CUDA_ERROR_INVALID_VALUE;
}

static CUresult free_handle(struct handle *h) {
  switch (h->kind) {
  case 3: case 4: return T.cuMemFreeAsync(h->p, NULL);
  case 5: return T.cuMemRelease(h->p);
  case 6: case 7: return T.cuArrayDestroy(h->a);
  case 8: return T.cuMipmappedArrayDestroy(h->a);
  default: return T.cuMemFree_v2(h->p);
  }
}

static int kind_index(const char *k) {
  for (int i = 0; i < (int)(sizeof kinds / sizeof kinds[0]); i++)
    if (!strcmp(k, kinds[i])) return i;
  fprintf(stderr, "unknown kind %s\n", k);
  exit(2);
}

static void print_info(const char *prefix) {
  size_t f = 0, t = 0, dt = 0;
  CUresult rc = T.cuMemGetInfo_v2(&f, &t);
  T.cuDeviceTotalMem_v2(&dt, 0);
  void (*mem)(unsigned long long *, unsigned long long *, unsigned long long *) =
      dlsym(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD), "fakecuda_mem");
  unsigned long long used = 0, total = 0;
  if (mem) mem(&used, &total, NULL);
  printf("%sinfo_rc=%d %sfree=%zu %stotal=%zu %sdevice_total=%zu %sfake_used=%llu\n", prefix, rc, prefix, f, prefix, t,
         prefix, dt, prefix, used);
}

/* fill <chunk_mib> <kind>: allocate until refused, report, free everything. */
static int cmd_fill(int argc, char **argv) {
  unsigned long long chunk = (argc > 0 ? strtoull(argv[0], NULL, 10) : 64) << 20;
  int kind = kind_index(argc > 1 ? argv[1] : "alloc");
  static struct handle hs[100000];
  int n = 0;
  CUresult rc = 0;
  while (n < 100000 && (rc = alloc_kind(kind, chunk, &hs[n])) == CUDA_SUCCESS) n++;
  printf("count=%d rc=%d\n", n, rc);
  print_info("");
  for (int i = 0; i < n; i++) {
    CUresult r = free_handle(&hs[i]);
    if (r) printf("free_rc=%d\n", r);
  }
  T.cuStreamSynchronize(NULL); /* stream-ordered pools release at synchronisation */
  print_info("after_");
  return 0;
}

/* hold <mib>: allocate, announce, wait to be killed. */
static int cmd_hold(int argc, char **argv) {
  unsigned long long mib = argc > 0 ? strtoull(argv[0], NULL, 10) : 64;
  CUdeviceptr p;
  CUresult rc = T.cuMemAlloc_v2(&p, mib << 20);
  printf("hold_rc=%d\n", rc);
  fflush(stdout);
  sleep(600);
  return 0;
}

struct stress { int iters; unsigned long long bytes; int ok, refused, errors; };
static pthread_barrier_t start_line;
static void stress_alloc(struct stress *s, CUdeviceptr *slot, unsigned *seed) {
  unsigned long long b = s->bytes / 2 + rand_r(seed) % (s->bytes ? s->bytes : 1);
  CUresult rc = T.cuMemAlloc_v2(slot, b);
  if (rc == CUDA_SUCCESS) s->ok++;
  else if (rc == CUDA_ERROR_OUT_OF_MEMORY) { *slot = 0; s->refused++; }
  else { *slot = 0; s->errors++; }
}

static void *stress_thread(void *arg) {
  struct stress *s = arg;
  CUdeviceptr live[4] = { 0 };
  unsigned seed = (unsigned)(size_t)arg ^ (unsigned)getpid();
  T.cuCtxSetCurrent(ctx); /* contexts are per thread */
  /* Every thread fills its four slots, then all churn at once: the threads really
     overlap even when the scheduler runs them one after another. */
  pthread_barrier_wait(&start_line);
  for (int i = 0; i < 4; i++) stress_alloc(s, &live[i], &seed);
  pthread_barrier_wait(&start_line);
  for (int i = 0; i < s->iters; i++) {
    int slot = i % 4;
    if (live[slot]) { T.cuMemFree_v2(live[slot]); live[slot] = 0; }
    stress_alloc(s, &live[slot], &seed);
  }
  pthread_barrier_wait(&start_line);
  for (int i = 0; i < 4; i++) if (live[i]) T.cuMemFree_v2(live[i]);
  return NULL;
}

/* stress <threads> <iters> <mib>: threads allocate and free at once. */
static int cmd_stress(int argc, char **argv) {
  int threads = argc > 0 ? atoi(argv[0]) : 8, iters = argc > 1 ? atoi(argv[1]) : 1000;
  unsigned long long bytes = (argc > 2 ? strtoull(argv[2], NULL, 10) : 8) << 20;
  pthread_t th[256];
  struct stress st[256];
  if (threads > 256) threads = 256;
  pthread_barrier_init(&start_line, NULL, (unsigned)threads);
  for (int i = 0; i < threads; i++) { st[i] = (struct stress){ iters, bytes, 0, 0, 0 }; pthread_create(&th[i], NULL, stress_thread, &st[i]); }
  int ok = 0, refused = 0, errors = 0;
  for (int i = 0; i < threads; i++) { pthread_join(th[i], NULL); ok += st[i].ok; refused += st[i].refused; errors += st[i].errors; }
  printf("ok=%d refused=%d errors=%d\n", ok, refused, errors);
  print_info("");
  return 0;
}

static unsigned long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (unsigned long long)t.tv_sec * 1000000000ull + t.tv_nsec;
}

/* spin <ms> <wave_us> <blocks> <kernel|ex|coop|graph>: launch+sync loop; report the GPU
   busy share over the last three quarters of the run. */
static int cmd_spin(int argc, char **argv) {
  unsigned long long ms = argc > 0 ? strtoull(argv[0], NULL, 10) : 2000;
  char name[64];
  snprintf(name, sizeof name, "spin_%s", argc > 1 ? argv[1] : "500");
  unsigned blocks = argc > 2 ? (unsigned)atoi(argv[2]) : 132;
  const char *api = argc > 3 ? argv[3] : "kernel";
  CUmodule m;
  CUfunction f;
  T.cuModuleLoadData(&m, "");
  if (T.cuModuleGetFunction(&f, m, name)) { printf("no function\n"); return 1; }
  unsigned long long (*busy)(void) = dlsym(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD), "fakecuda_busy_ns");
  unsigned long long start = now_ns(), warm = start + ms * 1000000ull / 4, end = start + ms * 1000000ull;
  unsigned long long b0 = 0, t0 = 0;
  long launches = 0;
  CUlaunchConfig cfg = { blocks, 1, 1, 128, 1, 1, 0, NULL, NULL, 0 };
  for (;;) {
    unsigned long long now = now_ns();
    if (!t0 && now >= warm) { T.cuStreamSynchronize(NULL); t0 = now_ns(); b0 = busy(); }
    if (now >= end) break;
    CUresult rc;
    if (!strcmp(api, "ex")) rc = T.cuLaunchKernelEx(&cfg, f, NULL, NULL);
    else if (!strcmp(api, "coop")) rc = T.cuLaunchCooperativeKernel(f, blocks, 1, 1, 128, 1, 1, 0, NULL, NULL);
    else if (!strcmp(api, "graph")) rc = T.cuGraphLaunch((CUgraphExec)f, NULL);
    else rc = T.cuLaunchKernel(f, blocks, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
    if (rc) { printf("launch_rc=%d\n", rc); return 1; }
    launches++;
    T.cuStreamSynchronize(NULL);
  }
  T.cuStreamSynchronize(NULL);
  unsigned long long t1 = now_ns(), b1 = busy();
  printf("launches=%ld share=%.2f\n", launches, 100.0 * (double)(b1 - b0) / (double)(t1 - t0));
  return 0;
}

/* nvml: what nvidia-smi would print. */
static int cmd_nvml(void) {
  void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (!h) { printf("nvml=missing\n"); return 1; }
  int (*init)(void) = dlsym(h, "nvmlInit_v2");
  int (*get)(unsigned, nvmlDevice_t *) = dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
  int (*info)(nvmlDevice_t, nvmlMemory_t *) = dlsym(h, "nvmlDeviceGetMemoryInfo");
  int (*info2)(nvmlDevice_t, nvmlMemory_v2_t *) = dlsym(h, "nvmlDeviceGetMemoryInfo_v2");
  nvmlDevice_t d;
  nvmlMemory_t m = { 0 };
  nvmlMemory_v2_t m2 = { 0 };
  init();
  get(0, &d);
  int rc1 = info(d, &m), rc2 = info2(d, &m2);
  printf("nvml_rc=%d nvml_total=%llu nvml_used=%llu nvml_free=%llu\n", rc1, m.total, m.used, m.free);
  printf("nvml2_rc=%d nvml2_total=%llu nvml2_used=%llu nvml2_free=%llu\n", rc2, m2.total, m2.used, m2.free);
  /* Every NVML device: which one the slice is reported on. */
  for (unsigned i = 0; i < 4; i++) {
    if (get(i, &d)) break;
    nvmlMemory_t mi = { 0 };
    if (info(d, &mi) == 0) printf("dev%u_total=%llu\n", i, mi.total);
  }
  return 0;
}

/* procaddr-future: symbols the shim has no name rule for. */
static int cmd_future(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW);
  CUresult (*gpa)(const char *, void **, int, unsigned long long, int *) = dlsym(h, "cuGetProcAddress_v2");
  CUresult (*alias)(CUdeviceptr *, size_t) = NULL;
  void *future = NULL;
  int st = -1;
  CUresult rc_alias = gpa("cuMemAllocAlias", (void **)&alias, 12080, 0, NULL);
  CUresult rc_future = gpa("cuMemAllocFuture", &future, 12080, 0, &st);
  printf("alias_rc=%d future_rc=%d future_null=%d future_status=%d\n", rc_alias, rc_future, future == NULL, st);
  CUdeviceptr p;
  CUresult rc = alias ? alias(&p, 64 << 20) : -1;
  printf("alias_alloc_rc=%d\n", rc);
  print_info("");
  return 0;
}

/* fork: allocations in parent and child are accounted separately, the child's credited at exit. */
static int cmd_fork(int argc, char **argv) {
  unsigned long long mib = argc > 0 ? strtoull(argv[0], NULL, 10) : 64;
  CUdeviceptr p;
  printf("parent_rc=%d\n", T.cuMemAlloc_v2(&p, mib << 20));
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    setup();
    CUdeviceptr q;
    printf("child_rc=%d\n", T.cuMemAlloc_v2(&q, mib << 20));
    print_info("child_");
    fflush(stdout);
    _exit(0);
  }
  int status;
  waitpid(pid, &status, 0);
  print_info("parent_");
  return 0;
}

/* bench <iters> [warm_ms]: ns per alloc+free pair and per launch (after warm_ms of
   launches, so an SM limiter has learned that these kernels cost nothing). Timed in batches
   of BATCH calls; the median batch is reported (pair_ns, launch_ns) next to the plain mean
   (pair_mean_ns, launch_mean_ns): on a shared machine a preempted batch is an outlier the
   median ignores, while a cost paid on every call (a cache miss) moves every batch. */
#define BATCH 1000
static int cmp_ull(const void *a, const void *b) {
  unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
  return x < y ? -1 : x > y;
}
static double median_batch(unsigned long long *t, long n) {
  qsort(t, (size_t)n, sizeof *t, cmp_ull);
  return (double)t[n / 2] / BATCH;
}
static int cmd_bench(int argc, char **argv) {
  long iters = argc > 0 ? atol(argv[0]) : 200000;
  unsigned long long warm_ms = argc > 1 ? strtoull(argv[1], NULL, 10) : 0;
  long batches = iters / BATCH > 0 ? iters / BATCH : 1;
  unsigned long long *tp = calloc((size_t)batches, sizeof *tp), *tl = calloc((size_t)batches, sizeof *tl);
  if (!tp || !tl) return 1;
  CUdeviceptr p;
  CUmodule m;
  CUfunction f;
  T.cuModuleLoadData(&m, "");
  T.cuModuleGetFunction(&f, m, "spin_0");
  for (long i = 0; i < iters / 10; i++) { T.cuMemAlloc_v2(&p, 1 << 20); T.cuMemFree_v2(p); }
  for (unsigned long long end = now_ns() + warm_ms * 1000000ull; now_ns() < end;)
    for (int i = 0; i < 1000; i++) T.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
  unsigned long long t0 = now_ns();
  for (long b = 0; b < batches; b++) {
    unsigned long long s = now_ns();
    for (int i = 0; i < BATCH; i++) { T.cuMemAlloc_v2(&p, 1 << 20); T.cuMemFree_v2(p); }
    tp[b] = now_ns() - s;
  }
  unsigned long long t1 = now_ns();
  for (long b = 0; b < batches; b++) {
    unsigned long long s = now_ns();
    for (int i = 0; i < BATCH; i++) T.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    tl[b] = now_ns() - s;
  }
  unsigned long long t2 = now_ns();
  double lm = median_batch(tl, batches);
  /* Stream-ordered pairs on the default pool (release threshold 0, no sync in between). */
  for (long b = 0; b < batches; b++) {
    unsigned long long st = now_ns();
    for (int i = 0; i < BATCH; i++) { T.cuMemAllocAsync(&p, 1 << 20, NULL); T.cuMemFreeAsync(p, NULL); }
    tl[b] = now_ns() - st;
  }
  double am = median_batch(tl, batches);
  double n = (double)batches * BATCH;
  double pm = median_batch(tp, batches); /* sorts: [0] is the fastest */
  printf("pair_ns=%.1f launch_ns=%.1f pair_mean_ns=%.1f launch_mean_ns=%.1f pair_min_ns=%.1f async_ns=%.1f\n", pm, lm,
         (double)(t1 - t0) / n, (double)(t2 - t1) / n, (double)tp[0] / BATCH, am);
  free(tp);
  free(tl);
  return 0;
}

/* poolkeep <threshold_mib>: memory freed into the default pool stays held (and counted)
   up to the release threshold until trimmed. Limit 1 GiB, context 300 MiB expected. */
static int cmd_poolkeep(int argc, char **argv) {
  unsigned long long thr = (argc > 0 ? strtoull(argv[0], NULL, 10) : 0) << 20;
  CUmemoryPool pool = NULL;
  CUdeviceptr p[4], q;
  printf("pool_rc=%d\n", T.cuDeviceGetDefaultMemPool(&pool, 0));
  printf("thr_rc=%d\n", T.cuMemPoolSetAttribute(pool, 4, &thr));
  int ok = 0;
  for (int i = 0; i < 4; i++) ok += T.cuMemAllocFromPoolAsync(&p[i], 128 << 20, pool, NULL) == CUDA_SUCCESS;
  printf("pooled=%d\n", ok);
  for (int i = 0; i < ok; i++) T.cuMemFreeAsync(p[i], NULL);
  T.cuStreamSynchronize(NULL);
  print_info("kept_");
  CUresult rc = T.cuMemAlloc_v2(&q, 400 << 20);
  printf("plain_rc=%d\n", rc);
  if (rc == CUDA_SUCCESS) T.cuMemFree_v2(q);
  rc = T.cuMemAllocAsync(&q, 256 << 20, NULL);
  printf("reuse_rc=%d\n", rc);
  print_info("reuse_");
  if (rc == CUDA_SUCCESS) T.cuMemFreeAsync(q, NULL);
  printf("trim_rc=%d\n", T.cuMemPoolTrimTo(pool, 0));
  print_info("trim_");
  rc = T.cuMemAlloc_v2(&q, 400 << 20);
  printf("after_trim_rc=%d\n", rc);
  return 0;
}

static CUresult graph_of(void **exec, const unsigned long long *mib, int n) {
  void *g = NULL, *node = NULL;
  T.cuGraphCreate(&g, 0);
  for (int i = 0; i < n; i++) {
    CUDA_MEM_ALLOC_NODE_PARAMS prm;
    memset(&prm, 0, sizeof prm);
    prm.poolProps.allocType = 1;
    prm.poolProps.location.type = 1;
    prm.poolProps.location.id = 0;
    prm.bytesize = mib[i] << 20;
    CUresult rc = T.cuGraphAddMemAllocNode(&node, g, NULL, 0, &prm);
    if (rc) return rc;
    T.cuGraphAddMemFreeNode(&node, g, (const void **)&node, 1, prm.dptr);
  }
  return T.cuGraphInstantiateWithFlags(exec, g, 0);
}

/* graph: graph memory nodes under a 2 GiB limit (context 300 MiB). */
static int cmd_graph(void) {
  void *a = NULL, *b = NULL, *c = NULL;
  CUdeviceptr q;
  unsigned long long one[] = { 1000 }, two[] = { 1200, 1200 }, huge[] = { 3072 };
  printf("a_inst_rc=%d\n", graph_of(&a, one, 1));
  printf("a_rc=%d\n", T.cuGraphLaunch(a, NULL));
  print_info("a_");
  printf("a2_rc=%d\n", T.cuGraphLaunch(a, NULL));
  print_info("a2_");
  CUresult rc = T.cuMemAlloc_v2(&q, 1000 << 20);
  printf("plain_rc=%d\n", rc);
  if (rc == CUDA_SUCCESS) T.cuMemFree_v2(q);
  printf("big_add_rc=%d\n", graph_of(&c, huge, 1));
  printf("big_inst_rc=%d\n", graph_of(&b, two, 2));
  printf("trim_rc=%d\n", T.cuDeviceGraphMemTrim(0));
  print_info("trim_");
  rc = T.cuMemAlloc_v2(&q, 1000 << 20);
  printf("plain2_rc=%d\n", rc);
  printf("a3_rc=%d\n", T.cuGraphLaunch(a, NULL));
  print_info("a3_");
  if (rc == CUDA_SUCCESS) T.cuMemFree_v2(q);
  printf("a4_rc=%d\n", T.cuGraphLaunch(a, NULL));
  unsigned long long v = 0;
  T.cuDeviceGetGraphMemAttribute(0, 2, &v);
  printf("graph_reserved=%llu\n", v);
  print_info("a4_");
  printf("destroy_rc=%d\n", T.cuGraphExecDestroy(a));
  return 0;
}

/* One allocation node of `mib` MiB on device 0 and its free node, added to g. */
static CUresult add_alloc(void *g, unsigned long long mib) {
  void *node = NULL;
  CUDA_MEM_ALLOC_NODE_PARAMS prm;
  memset(&prm, 0, sizeof prm);
  prm.poolProps.allocType = 1;
  prm.poolProps.location.type = 1;
  prm.poolProps.location.id = 0;
  prm.bytesize = mib << 20;
  CUresult rc = T.cuGraphAddMemAllocNode(&node, g, NULL, 0, &prm);
  if (rc) return rc;
  return T.cuGraphAddMemFreeNode(&node, g, (const void **)&node, 1, prm.dptr);
}

/* nested <levels> <mib per level> <extra>: graph memory nodes inside child graphs (CUDA
   12.9/13: cuGraphAddNode with CU_GRAPH_NODE_TYPE_GRAPH, ownership moved to the parent).
   The innermost graph and every child level hold one allocation of <mib> MiB (0: none);
   the top-level graph holds none of its own. <extra> adds a node to the top graph:
   "cond" (a conditional node), "unknown" (node type 99), "-" (nothing). Then instantiate,
   launch, and try a plain 1000 MiB allocation (2 GiB limit, 300 MiB context). */
static int cmd_nested(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "nested LEVELS MIB EXTRA\n"); return 2; }
  int levels = atoi(argv[0]);
  unsigned long long mib = strtoull(argv[1], NULL, 10);
  const char *extra = argv[2];
  void *inner = NULL, *node = NULL;
  CUresult rc = T.cuGraphCreate(&inner, 0);
  if (!rc && mib) rc = add_alloc(inner, mib);
  for (int i = 1; !rc && i <= levels; i++) {
    void *outer = NULL;
    T.cuGraphCreate(&outer, 0);
    CUgraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = 4;
    p.graph.graph = inner;
    p.graph.ownership = 1;
    rc = T.cuGraphAddNode_v2(&node, outer, NULL, NULL, 0, &p);
    if (!rc && mib && i < levels) rc = add_alloc(outer, mib);
    inner = outer;
  }
  if (!rc && strcmp(extra, "-")) {
    CUgraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = !strcmp(extra, "cond") ? 13 : 99;
    rc = T.cuGraphAddNode_v2(&node, inner, NULL, NULL, 0, &p);
  }
  printf("build_rc=%d\n", rc);
  if (rc) return 0;
  void *exec = NULL;
  rc = T.cuGraphInstantiateWithFlags(&exec, inner, 0);
  printf("inst_rc=%d\n", rc);
  if (rc) return 0;
  printf("launch_rc=%d\n", T.cuGraphLaunch(exec, NULL));
  print_info("launched_");
  CUdeviceptr q;
  rc = T.cuMemAlloc_v2(&q, 1000 << 20);
  printf("plain_rc=%d\n", rc);
  print_info("plain_");
  if (rc == CUDA_SUCCESS) T.cuMemFree_v2(q);
  return 0;
}

/* capture: stream-ordered allocations captured into a graph are counted when the graph
   runs, not at capture (2 GiB limit, 300 MiB context). */
static int cmd_capture(void) {
  CUstream s = (CUstream)0x51;
  CUdeviceptr p = 0, q;
  void *g = NULL, *exec = NULL;
  printf("begin_rc=%d\n", T.cuStreamBeginCapture(s, 0));
  printf("cap_alloc_rc=%d\n", T.cuMemAllocAsync(&p, 1000 << 20, s));
  print_info("capalloc_");
  printf("cap_free_rc=%d\n", T.cuMemFreeAsync(p, s));
  printf("end_rc=%d\n", T.cuStreamEndCapture(s, &g));
  print_info("cap_");
  printf("inst_rc=%d\n", T.cuGraphInstantiateWithFlags(&exec, g, 0));
  printf("launch_rc=%d\n", T.cuGraphLaunch(exec, NULL));
  print_info("launched_");
  CUresult rc = T.cuMemAlloc_v2(&q, 1000 << 20);
  printf("plain_rc=%d\n", rc);
  return 0;
}

/* pools <device_for_the_device_pool>: a pinned-host pool allocates no device memory; a
   device pool is counted on its own device, whatever the current one (1 GiB limits). */
static int cmd_pools(int argc, char **argv) {
  int pdev = argc > 0 ? atoi(argv[0]) : 0;
  CUmemPoolProps hp, dp;
  memset(&hp, 0, sizeof hp);
  memset(&dp, 0, sizeof dp);
  hp.allocType = dp.allocType = 1;
  hp.location.type = 2; /* CU_MEM_LOCATION_TYPE_HOST */
  dp.location.type = 1;
  dp.location.id = pdev;
  CUmemoryPool host = NULL, dev = NULL;
  CUdeviceptr a, b;
  printf("host_create_rc=%d dev_create_rc=%d\n", T.cuMemPoolCreate(&host, &hp), T.cuMemPoolCreate(&dev, &dp));
  printf("host_alloc_rc=%d\n", T.cuMemAllocFromPoolAsync(&a, 2000ull << 20, host, NULL));
  printf("dev_alloc_rc=%d\n", T.cuMemAllocFromPoolAsync(&b, 2000ull << 20, dev, NULL));
  print_info("");
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "usage: probe MODE COMMAND [ARGS]\n"); return 2; }
  setvbuf(stdout, NULL, _IOLBF, 0);
  resolve(argv[1]);
  const char *cmd = argv[2];
  if (!strcmp(cmd, "nvml")) return cmd_nvml();
  setup();
  if (!strcmp(cmd, "fill")) return cmd_fill(argc - 3, argv + 3);
  if (!strcmp(cmd, "hold")) return cmd_hold(argc - 3, argv + 3);
  if (!strcmp(cmd, "stress")) return cmd_stress(argc - 3, argv + 3);
  if (!strcmp(cmd, "spin")) return cmd_spin(argc - 3, argv + 3);
  if (!strcmp(cmd, "future")) return cmd_future();
  if (!strcmp(cmd, "fork")) return cmd_fork(argc - 3, argv + 3);
  if (!strcmp(cmd, "bench")) return cmd_bench(argc - 3, argv + 3);
  if (!strcmp(cmd, "poolkeep")) return cmd_poolkeep(argc - 3, argv + 3);
  if (!strcmp(cmd, "graph")) return cmd_graph();
  if (!strcmp(cmd, "capture")) return cmd_capture();
  if (!strcmp(cmd, "nested")) return cmd_nested(argc - 3, argv + 3);
  if (!strcmp(cmd, "pools")) return cmd_pools(argc - 3, argv + 3);
  if (!strcmp(cmd, "info")) { print_info(""); return 0; }
  if (!strcmp(cmd, "legacy")) { unsigned p; printf("legacy_rc=%d\n", T.cuMemAlloc(&p, 1 << 20)); return 0; }
  fprintf(stderr, "unknown command %s\n", cmd);
  return 2;
}
