/* libcuda: the symbols ONNX Runtime's CUDA provider imports, as no-ops (bench/cuda_partition.py) */
long cuTensorMapEncodeTiled(void){return 0;}
int __stub_dummy_libcuda_so_1(void){return 0;}
