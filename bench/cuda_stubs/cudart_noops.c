/* libcudart.so.13 stand-in, part 2: the rest of what ONNX Runtime's CUDA provider imports, as no-ops (counted) */
long __cudaGetKernel(void){return 0;}
long __cudaLaunchKernel(void){return 0;}
long __cudaPopCallConfiguration(void){return 0;}
long __cudaPushCallConfiguration(void){return 0;}
long __cudaRegisterFatBinaryEnd(void){return 0;}
long __cudaRegisterFunction(void){return 0;}
long __cudaRegisterVar(void){return 0;}
long __cudaUnregisterFatBinary(void){return 0;}
long cudaDeviceSynchronize(void){return 0;}
long cudaEventDestroy(void){return 0;}

long cudaEventRecord(void){return 0;}
long cudaEventRecordWithFlags(void){return 0;}
long cudaEventSynchronize(void){return 0;}
long cudaFuncGetAttributes(void){return 0;}

long cudaGetDriverEntryPointByVersion(void){return 0;}
long cudaGetLastError(void){return 0;}
long cudaGraphDestroy(void){return 0;}
long cudaGraphExecDestroy(void){return 0;}
long cudaGraphInstantiate(void){return 0;}
long cudaGraphLaunch(void){return 0;}
long cudaKernelSetAttributeForDevice(void){return 0;}
long cudaLaunchCooperativeKernel(void){return 0;}
long cudaLaunchHostFunc(void){return 0;}

long cudaLaunchKernelExC(void){return 0;}
long cudaLibraryGetKernel(void){return 0;}
long cudaLibraryLoadData(void){return 0;}
long cudaLibraryUnload(void){return 0;}
long cudaMemPoolDestroy(void){return 0;}
long cudaMemPoolGetAttribute(void){return 0;}
long cudaMemPoolSetAttribute(void){return 0;}
long cudaMemPoolTrimTo(void){return 0;}
long cudaMemcpy2DAsync(void){return 0;}
long cudaMemcpyFromSymbol(void){return 0;}
long cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(void){return 0;}
long cudaPeekAtLastError(void){return 0;}
long cudaStreamBeginCapture(void){return 0;}
long cudaStreamDestroy(void){return 0;}
long cudaStreamEndCapture(void){return 0;}
long cudaStreamSynchronize(void){return 0;}
long cudaStreamWaitEvent(void){return 0;}

#include <stdio.h>
#include <stdlib.h>
static long n_launch=0,n_elapsed=0,n_fsa=0;
long cudaLaunchKernel(void){n_launch++;return 0;}
long cudaFuncSetAttribute(void){n_fsa++;return 0;}
int cudaEventElapsedTime(float*ms,void*a,void*b){if(ms)*ms=1.0f;n_elapsed++;return 0;}
__attribute__((destructor)) static void dump(void){ if(getenv("STUB_COUNT")) fprintf(stderr,"STUBCOUNT launch=%ld elapsed=%ld funcsetattr=%ld\n",n_launch,n_elapsed,n_fsa);}
