"""Source -> bundle: read sources, build the ONNX graph, quantize, validate, write atomically."""
