/* libcudnn: the symbols ONNX Runtime's CUDA provider imports, as no-ops (bench/cuda_partition.py) */
long cudnnCreate(void){return 0;}
long cudnnDestroy(void){return 0;}
long cudnnSetStream(void){return 0;}
int __stub_dummy_libcudnn_so_9(void){return 0;}
