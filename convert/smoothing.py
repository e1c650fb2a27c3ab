"""SmoothQuant-style rescaling of the MLP's down projection before int4 (Xiao et al., 2023).

MatMulNBits at accuracy level 4 quantizes its input activations to int8 per block. The down
projection's input (act(gate) * up) has a few channels with large values that make those blocks
coarse. Dividing channel k of that input by s_k and multiplying column k of down_proj by s_k leaves
the product unchanged in exact arithmetic; the division is folded into up_proj's row k (the input is
elementwise act(gate) * up). s_k = sqrt(max|x_k| / max|W[:, k]|), from a few calibration prompts.
"""

from __future__ import annotations

import numpy as np

CALIBRATION_TEXTS = (
    "The history of science is full of surprising discoveries, from the structure of DNA to the expansion of the universe.",
    "import numpy as np\n\ndef mean(values):\n    return sum(values) / len(values)\n",
    "User: Can you recommend a good book for a long flight?\nAssistant: Sure! A classic choice is",
    "In 2020 the company reported revenue of 4.2 billion dollars, up 12 percent from the year before.",
)


def down_proj_input_max(torch_model, prompts: list[list[int]]) -> dict[int, np.ndarray]:
    """Per layer, max |input| per channel of mlp.down_proj over the prompts: {layer: [intermediate]}."""
    import torch

    stats: dict[int, np.ndarray] = {}
    hooks = []
    for i, layer in enumerate(torch_model.model.layers):
        def hook(_module, inputs, _output, i=i):
            m = inputs[0].detach().abs().reshape(-1, inputs[0].shape[-1]).amax(0).numpy()
            stats[i] = np.maximum(stats[i], m) if i in stats else m

        hooks.append(layer.mlp.down_proj.register_forward_hook(hook))
    try:
        with torch.no_grad():
            for ids in prompts:
                torch_model(torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    return stats


def smooth_down_proj(weights: dict[str, np.ndarray], act_max: dict[int, np.ndarray], alpha: float = 0.5) -> dict:
    """New weights dict with up_proj rows / s and down_proj columns * s for every layer in act_max."""
    out = dict(weights)
    for i, amax in act_max.items():
        up, down = f"model.layers.{i}.mlp.up_proj.weight", f"model.layers.{i}.mlp.down_proj.weight"
        w_max = np.abs(weights[down]).max(0)  # [intermediate]
        s = np.power(np.maximum(amax, 1e-5), alpha) / np.power(np.maximum(w_max, 1e-5), 1 - alpha)
        s = np.clip(s, 1e-2, 1e2).astype(np.float32)
        out[up] = weights[up] / s[:, None]
        out[down] = weights[down] * s[None, :]
    return out
