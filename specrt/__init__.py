"""specrt: a local runtime for speculative decoding on ONNX Runtime.

The import name `specrt` holds the subpackages convert, models, runtime, drafters and kernels
(top-level folders in the repository). Importing this package imports nothing heavy.
"""

__version__ = "0.1.0"
