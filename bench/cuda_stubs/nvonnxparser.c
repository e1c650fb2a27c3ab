/* libnvonnxparser: the symbols ONNX Runtime's CUDA provider imports, as no-ops (bench/cuda_partition.py) */
long createNvOnnxParserRefitter_INTERNAL(void){return 0;}
long createNvOnnxParser_INTERNAL(void){return 0;}
int __stub_dummy_libnvonnxparser_so_10(void){return 0;}
