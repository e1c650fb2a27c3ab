"""Read an HF model folder: config.json plus safetensors shards (never pickle files)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from specrt.errors import SourceError


def read_hf_config(folder: Path) -> dict:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise SourceError(f"{folder}: no config.json (an HF model folder needs config.json and *.safetensors)")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SourceError(f"{path}: unreadable config ({exc})") from None


def safetensors_files(folder: Path) -> list[Path]:
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError) as exc:
            raise SourceError(f"{index}: unreadable index ({exc})") from None
        files = [folder / s for s in shards]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        if list(folder.glob("*.bin")) or list(folder.glob("*.pt")):
            raise SourceError(f"{folder}: only pickle weights (*.bin/*.pt); specrt loads safetensors only")
        raise SourceError(f"{folder}: no *.safetensors weights")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise SourceError(f"{folder}: missing weight shard {missing[0]}")
    return files


def load_hf_weights(folder: Path) -> dict[str, np.ndarray]:
    """All tensors as float32 numpy arrays, HF names ("model." prefix normalized)."""
    from safetensors import safe_open

    weights: dict[str, np.ndarray] = {}
    for f in safetensors_files(folder):
        try:
            with safe_open(str(f), framework="pt") as st:
                for name in st.keys():
                    key = name if name.startswith(("model.", "lm_head.")) else f"model.{name}"
                    if name.startswith("language_model."):
                        key = name[len("language_model."):]
                    weights[key] = st.get_tensor(name).float().numpy()
        except SourceError:
            raise
        except Exception as exc:
            raise SourceError(f"{f}: corrupt safetensors file ({type(exc).__name__}: {exc})") from None
    return weights


def load_hf_folder(folder: Path) -> tuple[dict, dict[str, np.ndarray]]:
    folder = Path(folder)
    if not folder.is_dir():
        raise SourceError(f"{folder}: no such folder")
    hf = read_hf_config(folder)
    return hf, load_hf_weights(folder)
