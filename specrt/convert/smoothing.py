"""SmoothQuant-style rescaling of the MLP's down projection before int4 (Xiao et al., 2023).

MatMulNBits at accuracy level 4 quantizes its input activations to int8 per block. The down
projection's input (act(gate) * up) has a few channels with large values that make those blocks
coarse. Dividing channel k of that input by s_k and multiplying column k of down_proj by s_k leaves
the product unchanged in exact arithmetic; the division is folded into up_proj's row k (the input is
elementwise act(gate) * up). s_k = sqrt(max|x_k| / max|W[:, k]|), from a few calibration prompts (their
largest inputs come from models/layerwise.py's run).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from specrt.models.tensor_source import WeightSource, rows_of, shape_of

CALIBRATION_TEXTS = (
    "The history of science is full of surprising discoveries, from the structure of DNA to the expansion of the universe.",
    "import numpy as np\n\ndef mean(values):\n    return sum(values) / len(values)\n",
    "User: Can you recommend a good book for a long flight?\nAssistant: Sure! A classic choice is",
    "In 2020 the company reported revenue of 4.2 billion dollars, up 12 percent from the year before.",
)


class Smoothed(WeightSource):
    """The weights with every smoothed layer's up_proj rows divided by s and down_proj columns multiplied by s,
    computed when read (a view: nothing is copied, a LazyWeights source stays on disk)."""

    def __init__(self, weights: Mapping, scales: dict[int, np.ndarray]):
        self.base, self.scales = weights, scales

    def __getitem__(self, name: str) -> np.ndarray:
        w = self.base[name]
        layer, kind = _smoothed_part(name)
        if layer in self.scales:
            s = self.scales[layer]
            return w / s[:, None] if kind == "up" else w * s[None, :]
        return w

    def rows(self, name: str, ids) -> np.ndarray:
        return rows_of(self.base, name, ids) if _smoothed_part(name)[0] is None else self[name][ids]

    def shape(self, name: str) -> tuple[int, ...]:
        # the base's (from a file's header), never a read: WeightSource's default reads the whole tensor, which for
        # a large table (Gemma 4's 262144 x 10752 per-layer embeddings: 11 GB as float32) was the conversion's peak
        return shape_of(self.base, name)

    def __iter__(self):
        return iter(self.base)

    def __len__(self) -> int:
        return len(self.base)

    def __contains__(self, name) -> bool:
        return name in self.base


def _smoothed_part(name: str) -> tuple[int | None, str]:
    """(layer, "up" | "down") for a layer's up_proj / down_proj weight, else (None, "")."""
    if name.startswith("model.layers.") and name.endswith(("mlp.up_proj.weight", "mlp.down_proj.weight")):
        return int(name.split(".")[2]), "up" if name.endswith("up_proj.weight") else "down"
    return None, ""


def smooth_down_proj(weights: Mapping, act_max: dict[int, np.ndarray], alpha: float = 0.5) -> Smoothed:
    """The weights with up_proj rows / s and down_proj columns * s for every layer in act_max (a view)."""
    scales = {}
    for i, amax in act_max.items():
        w_max = np.abs(weights[f"model.layers.{i}.mlp.down_proj.weight"]).max(0)  # [intermediate]
        s = np.power(np.maximum(amax, 1e-5), alpha) / np.power(np.maximum(w_max, 1e-5), 1 - alpha)
        scales[i] = np.clip(s, 1e-2, 1e2).astype(np.float32)
    return Smoothed(weights, scales)
