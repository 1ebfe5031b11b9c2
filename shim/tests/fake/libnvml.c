/*
 * Fake libnvidia-ml.so.1: memory info and utilization from the fake libcuda (loaded on
 * demand, so a probe that only uses NVML, like nvidia-smi, still sees the shared state).
 */
#define _GNU_SOURCE
#include "fakecuda.h"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
typedef void (*mem_fn)(unsigned long long *, unsigned long long *, unsigned long long *);
typedef unsigned (*util_fn)(unsigned long long);
static int devs[16];

static void *cuda(const char *sym) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h) h = dlopen("libcuda.so.1", RTLD_NOW);
  return h ? dlsym(h, sym) : NULL;
}
EXPORT int nvmlInit_v2(void) { return 0; }
EXPORT int nvmlInit(void) { return 0; }
EXPORT int nvmlShutdown(void) { return 0; }
EXPORT int nvmlDeviceGetCount_v2(unsigned *n) { const char *v = getenv("FAKE_CUDA_DEVICES"); *n = v ? (unsigned)atoi(v) : 1; return 0; }
static unsigned count(void);
EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d) {
  if (i >= 16 || i >= count()) return 2;
  *d = &devs[i];
  return 0;
}
static unsigned count(void) { const char *v = getenv("FAKE_CUDA_DEVICES"); return v ? (unsigned)atoi(v) : 1; }
/* FAKE_NVML_MIG=1: CUDA sees MIG instances, NVML's GPUs carry other (parent) UUIDs. */
static void uuid_of(unsigned i, char *buf, unsigned len) {
  const char *mig = getenv("FAKE_NVML_MIG");
  snprintf(buf, len, "GPU-%s-a4a5-a6a7-a8a9-aaabacadae%02x", mig && *mig == '1' ? "b0b1b2b3" : "a0a1a2a3", i);
}
EXPORT int nvmlDeviceGetUUID(nvmlDevice_t d, char *buf, unsigned len) {
  unsigned i = (unsigned)((int *)d - devs);
  if (i >= 16 || !buf || len < 41) return 2;
  uuid_of(i, buf, len);
  return 0;
}
EXPORT int nvmlDeviceGetHandleByUUID(const char *u, nvmlDevice_t *d) {
  char buf[96];
  for (unsigned i = 0; i < count() && i < 16; i++) {
    uuid_of(i, buf, sizeof buf);
    if (!strcmp(buf, u)) { *d = &devs[i]; return 0; }
  }
  return 6; /* NVML_ERROR_NOT_FOUND */
}
EXPORT int nvmlDeviceGetIndex(nvmlDevice_t d, unsigned *i) {
  *i = (unsigned)((int *)d - devs);
  return *i < 16 ? 0 : 2;
}
EXPORT int nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
  (void)d;
  mem_fn f = (mem_fn)cuda("fakecuda_mem");
  if (!f) return 999;
  unsigned long long used, total;
  f(&used, &total, NULL);
  m->total = total; m->used = used; m->free = total - used;
  return 0;
}
EXPORT int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
  nvmlMemory_t v1;
  int rc = nvmlDeviceGetMemoryInfo(d, &v1);
  if (rc) return rc;
  m->total = v1.total; m->used = v1.used; m->free = v1.free; m->reserved = 0;
  return 0;
}
/* Utilization over the last 100 ms, like NVML's sample period. */
EXPORT int nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
  (void)d;
  util_fn f = (util_fn)cuda("fakecuda_util_percent");
  if (!f) return 999;
  u->gpu = f(100000000ull);
  u->memory = 0;
  return 0;
}
