/* Minimal CUDA driver / NVML ABI used by the fake driver and the probe programs. */
#ifndef FAKECUDA_H
#define FAKECUDA_H
#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct fake_ctx *CUcontext;
typedef struct fake_fn *CUfunction;
typedef void *CUmodule;
typedef void *CUstream;
typedef void *CUmemoryPool;
typedef struct fake_array *CUarray;
typedef struct fake_array *CUmipmappedArray;
typedef void *CUgraphExec;
typedef unsigned long long CUmemGenericAllocationHandle;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_PERMITTED 800
#define CUDA_ERROR_NOT_SUPPORTED 801

typedef struct {
  size_t Width, Height;
  unsigned int Format, NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct {
  size_t Width, Height, Depth;
  unsigned int Format, NumChannels, Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

typedef struct {
  unsigned int type;
  unsigned int requestedHandleTypes;
  struct { unsigned int type; int id; } location;
  void *win32HandleMetaData;
  unsigned char allocFlags[8];
} CUmemAllocationProp;

typedef struct {
  unsigned int allocType, handleTypes;
  struct { unsigned int type; int id; } location;
  void *win32SecurityAttributes;
  size_t maxSize;
  unsigned short usage;
  unsigned char reserved[54];
} CUmemPoolProps;

typedef struct {
  CUmemPoolProps poolProps;
  const void *accessDescs;
  size_t accessDescCount;
  size_t bytesize;
  CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS;

/* CUgraphNodeParams (CUDA 12.2+, 256 bytes): only the child-graph member is modelled;
   ownership (CUDA 12.9/13): 0 = clone, 1 = move to the parent. */
typedef struct {
  int type;
  int reserved0[3];
  union {
    long long reserved1[29];
    struct { void *graph; int ownership; } graph;
  };
  long long reserved2;
} CUgraphNodeParams;

typedef struct {
  unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
  CUstream hStream;
  void *attrs;
  unsigned int numAttrs;
} CUlaunchConfig;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef void *nvmlDevice_t;
#endif
