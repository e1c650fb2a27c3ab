"""specrt: a local runtime for speculative decoding on ONNX Runtime.

The import name `specrt` holds the subpackages runtime, drafters, kernels, convert, models, train and app
(top-level folders in the repository; docs/architecture.md draws the parts and what each may import).
Importing this package imports nothing heavy.
"""

__version__ = "0.1.0"


def load(model: str = "smollm2-135m-instruct", device: str = "auto", drafter: str | None = None, **kwargs):
    """An Engine for a bundle folder or catalog name (see specrt.app.api.load)."""
    from specrt.app.api import load as _load

    return _load(model, device=device, drafter=drafter, **kwargs)
