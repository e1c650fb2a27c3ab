"""Kernels beside their CPU twins: Triton kernels with numpy twins of the same semantics, and ggml_ops (specrt's
GGUF operators for ONNX Runtime, in C)."""
