/* libcurand: the symbols ONNX Runtime's CUDA provider imports, as no-ops (bench/cuda_partition.py) */
int __stub_dummy_libcurand_so_10(void){return 0;}
