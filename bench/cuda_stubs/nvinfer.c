/* libnvinfer: the symbols ONNX Runtime's CUDA provider imports, as no-ops (bench/cuda_partition.py) */
long createInferBuilder_INTERNAL(void){return 0;}
long createInferRefitter_INTERNAL(void){return 0;}
long createInferRuntime_INTERNAL(void){return 0;}
long getInferLibVersion(void){return 0;}
long getPluginRegistry(void){return 0;}
int __stub_dummy_libnvinfer_so_10(void){return 0;}
