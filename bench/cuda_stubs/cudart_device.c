/* libcudart.so.13 stand-in, part 1: one fake SM 9.0 device of 80 GB whose memory is host memory */
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
static char dummy[4096];
cudaError_t cudaGetDeviceCount(int*c){*c=1;return 0;}
cudaError_t cudaGetDevice(int*d){*d=0;return 0;}
cudaError_t cudaSetDevice(int d){return 0;}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp*p,int d){memset(p,0,sizeof(*p));strcpy(p->name,"FakeH100");p->major=9;p->minor=0;p->totalGlobalMem=80ull<<30;p->multiProcessorCount=132;p->sharedMemPerBlock=49152;p->sharedMemPerBlockOptin=232448;p->sharedMemPerMultiprocessor=233472;p->maxThreadsPerBlock=1024;p->warpSize=32;p->regsPerBlock=65536;p->maxThreadsPerMultiProcessor=2048;p->maxGridSize[0]=2147483647;p->maxGridSize[1]=65535;p->maxGridSize[2]=65535;p->maxThreadsDim[0]=1024;p->maxThreadsDim[1]=1024;p->maxThreadsDim[2]=64;return 0;}
cudaError_t cudaDeviceGetAttribute(int*v,enum cudaDeviceAttr a,int d){*v=0; if(a==cudaDevAttrComputeCapabilityMajor)*v=9; if(a==cudaDevAttrMultiProcessorCount)*v=132; if(a==cudaDevAttrMaxSharedMemoryPerBlockOptin)*v=232448; return 0;}
cudaError_t cudaDriverGetVersion(int*v){*v=13000;return 0;}
cudaError_t cudaRuntimeGetVersion(int*v){*v=13000;return 0;}
cudaError_t cudaMemGetInfo(size_t*f,size_t*t){*f=79ull<<30;*t=80ull<<30;return 0;}
cudaError_t cudaMalloc(void**p,size_t n){*p=malloc(n?n:1);return 0;}
cudaError_t cudaMallocHost(void**p,size_t n){*p=malloc(n?n:1);return 0;}
cudaError_t cudaHostAlloc(void**p,size_t n,unsigned f){*p=malloc(n?n:1);return 0;}
cudaError_t cudaMallocFromPoolAsync(void**p,size_t n,cudaMemPool_t m,cudaStream_t s){*p=malloc(n?n:1);return 0;}
cudaError_t cudaFree(void*p){free(p);return 0;}
cudaError_t cudaFreeHost(void*p){free(p);return 0;}
cudaError_t cudaFreeAsync(void*p,cudaStream_t s){free(p);return 0;}
cudaError_t cudaMemcpy(void*d,const void*s,size_t n,enum cudaMemcpyKind k){if(d&&s&&n)memmove(d,s,n);return 0;}
cudaError_t cudaMemcpyAsync(void*d,const void*s,size_t n,enum cudaMemcpyKind k,cudaStream_t st){if(d&&s&&n)memmove(d,s,n);return 0;}
cudaError_t cudaMemset(void*d,int v,size_t n){if(d&&n)memset(d,v,n);return 0;}
cudaError_t cudaMemsetAsync(void*d,int v,size_t n,cudaStream_t s){if(d&&n)memset(d,v,n);return 0;}
cudaError_t cudaStreamCreate(cudaStream_t*s){*s=(cudaStream_t)(dummy+8);return 0;}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t*s,unsigned f){*s=(cudaStream_t)(dummy+8);return 0;}
cudaError_t cudaEventCreate(cudaEvent_t*e){*e=(cudaEvent_t)(dummy+16);return 0;}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t*e,unsigned f){*e=(cudaEvent_t)(dummy+16);return 0;}
cudaError_t cudaMemPoolCreate(cudaMemPool_t*m,const struct cudaMemPoolProps*p){*m=(cudaMemPool_t)(dummy+24);return 0;}
cudaError_t cudaStreamIsCapturing(cudaStream_t s,enum cudaStreamCaptureStatus*st){*st=cudaStreamCaptureStatusNone;return 0;}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes*a,const void*p){memset(a,0,sizeof(*a));a->type=cudaMemoryTypeDevice;return 0;}
const char* cudaGetErrorName(cudaError_t e){return "cudaStub";}
const char* cudaGetErrorString(cudaError_t e){return "cudaStub";}
void** __cudaRegisterFatBinary(void*f){return (void**)dummy;}
