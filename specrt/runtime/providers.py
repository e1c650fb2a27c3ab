"""Execution providers: which ONNX Runtime provider serves each --device, and what is installed."""

from __future__ import annotations

from specrt.errors import SpecrtError

# device -> providers to try in order (the CPU provider is always appended as fallback for unsupported ops). AMD GPUs
# run through MIGraphX: ONNX Runtime removed its ROCm provider in 1.23.
DEVICE_PROVIDERS = {
    "cpu": ("CPUExecutionProvider",),
    "cuda": ("CUDAExecutionProvider",),
    "rocm": ("MIGraphXExecutionProvider",),
}
INSTALL_HINT = {
    "cuda": "pip install 'specrt[nvidia]' (onnxruntime-gpu)",
    "rocm": "pip install 'specrt[amd]' (onnxruntime-migraphx)",
}


class ProviderError(SpecrtError):
    """The requested device has no installed ONNX Runtime provider."""


def available_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


def best_device() -> str:
    have = available_providers()
    for device in ("cuda", "rocm"):
        if any(p in have for p in DEVICE_PROVIDERS[device]):
            return device
    return "cpu"


def profile_of(providers) -> str:
    """The device whose graphs these providers run (convert --device): cuda, rocm (MIGraphX) or cpu."""
    first = list(providers)[0] if providers else "CPUExecutionProvider"
    return next((d for d, names in DEVICE_PROVIDERS.items() if first in names), "cpu")


def providers_for(device: str | None) -> list[str]:
    """Provider list for a device name ("auto"/None picks the best available)."""
    if device in (None, "auto"):
        device = best_device()
    if device not in DEVICE_PROVIDERS:
        raise ProviderError(f"unknown device {device!r} (choose from auto, {', '.join(DEVICE_PROVIDERS)})")
    have = available_providers()
    chosen = [p for p in DEVICE_PROVIDERS[device] if p in have]
    if not chosen:
        raise ProviderError(
            f"device {device!r} needs {' or '.join(DEVICE_PROVIDERS[device])}, which this onnxruntime lacks; {INSTALL_HINT[device]}"
        )
    if "CPUExecutionProvider" not in chosen:
        chosen.append("CPUExecutionProvider")
    return chosen
