"""Bundle loading, ONNX Runtime sessions, KV cache and the decode loop (no torch, no transformers)."""
