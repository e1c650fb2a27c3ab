"""EAGLE-3 draft head (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of LLMs via Training-Time
Test"): torch definition and the checkpoint layout that vLLM and SGLang load.

The head reads the target's residual stream after three layers (EAGLE's default 2, N // 2, N - 3),
concatenated [.., 3 * H_target], and fuses it with `fc` to H. One decoder layer then attends over its own KV
cache; its input is the concatenation of the normed token embedding (`input_layernorm`) and the normed
hidden state (`hidden_norm`), [.., 2H], so q/k/v project from 2H. The residual stream continues from the
un-normed hidden state (or the normed one with `norm_before_residual`). `norm` + `lm_head` give logits over a
reduced draft vocabulary; draft id d is target id d + d2t[d]. The pre-norm output is the hidden state fed
back for the next draft step. The token embedding is the target's own unless the checkpoint brings one.

Checkpoint (a folder): config.json (hidden_size, num_attention_heads, num_key_value_heads, intermediate_size,
rms_norm_eps, rope_theta, vocab_size, draft_vocab_size, optional target_hidden_size, eagle_config with
eagle_aux_hidden_state_layer_ids) and safetensors with fc.weight, midlayer.* (or layers.0.*), norm.weight,
lm_head.weight, d2t, optional t2d and embed_tokens.weight.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from specrt.errors import SourceError
from specrt.models.checkpoint_folder import check_tensors, open_checkpoint, read_tensors
from specrt.models.config import ModelConfig, config_from_hf
from specrt.models.layer_ids import EAGLE_TOP, eagle3_layers, write_eagle3_layers
from specrt.models.transformer import MLP, Attention, RMSNorm, causal_mask

ARCHITECTURE = "LlamaForCausalLMEagle3"


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """The layers specrt's trainers read (low, middle, high): the outputs of layers 2, N // 2 and N - 3. (A
    config without ids means EAGLE's default, one layer lower: models/layer_ids.py.)"""
    return (min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0))


@dataclass(frozen=True)
class Eagle3Config:
    layer: ModelConfig  # shape of the one decoder layer (llama family, num_layers = 1)
    target_hidden_size: int
    draft_vocab_size: int
    aux_layers: tuple[int, ...]
    norm_before_residual: bool = False

    @property
    def feature_width(self) -> int:  # what it reads from the target per position: three layers' hidden states
        return len(self.aux_layers) * self.target_hidden_size

    @property
    def vocab_size(self) -> int:  # the target's vocabulary
        return self.layer.vocab_size

    def to_hf(self) -> dict:
        c = self.layer
        return {
            "architectures": [ARCHITECTURE], "model_type": "llama", "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_heads,
            "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "num_hidden_layers": 1,
            "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope.theta, "max_position_embeddings": c.max_position,
            "vocab_size": c.vocab_size, "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size, "hidden_act": c.hidden_act, "tie_word_embeddings": False,
            "norm_before_residual": self.norm_before_residual,
        } | _layer_fields(self.aux_layers)


def _layer_fields(aux_layers: tuple[int, ...]) -> dict:
    """The layer ids as both vLLM and SGLang read them (models/layer_ids.py)."""
    written = write_eagle3_layers({}, aux_layers)
    return {EAGLE_TOP: written[EAGLE_TOP], "eagle_config": written["eagle_config"]}


def eagle3_config_from_hf(hf: dict, target: ModelConfig, where: str = "EAGLE-3 config") -> Eagle3Config:
    """Read an EAGLE-3 config.json (specrt's and the engines' layout, or the speculators format) against the
    target it must draft for (mismatches and ambiguous layer ids are SourceErrors)."""
    if "speculators_config" in hf:  # the layer's shape is in transformer_layer_config
        inner = hf.get("transformer_layer_config")
        if not isinstance(inner, dict):
            raise SourceError(f"{where}: a speculators config needs a transformer_layer_config object")
        for flag in ("norm_before_fc", "fc_norm", "norm_output"):
            if hf.get(flag):
                raise SourceError(f"{where}: {flag} is not supported by specrt's EAGLE-3 graph")
        # vLLM reads an absent norm_before_residual in this format as true
        hf = {**inner, **{k: hf[k] for k in ("draft_vocab_size", "target_hidden_size", EAGLE_TOP,
                                              "speculators_config") if hf.get(k) is not None},
              "norm_before_residual": hf.get("norm_before_residual", True)}
    layer = config_from_hf({**hf, "model_type": "llama", "num_hidden_layers": 1, "tie_word_embeddings": False})
    aux = eagle3_layers(hf, target.num_layers, where)
    cfg = Eagle3Config(layer, int(hf.get("target_hidden_size") or layer.hidden_size),
                       int(hf.get("draft_vocab_size") or layer.vocab_size), aux, bool(hf.get("norm_before_residual")))
    if cfg.target_hidden_size != target.hidden_size:
        raise SourceError(f"EAGLE-3 head reads hidden size {cfg.target_hidden_size}, the target has {target.hidden_size}")
    if cfg.vocab_size != target.vocab_size:
        raise SourceError(f"EAGLE-3 head has vocabulary {cfg.vocab_size}, the target has {target.vocab_size}")
    if len(aux) != 3:
        raise SourceError(f"{where}: the EAGLE-3 head reads {len(aux)} layers {list(aux)}; specrt's graph fuses 3")
    return cfg


class Eagle3Layer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h = cfg.hidden_size
        self.self_attn = Attention(cfg, 0)
        for name, out in (("q_proj", cfg.num_heads), ("k_proj", cfg.num_kv_heads), ("v_proj", cfg.num_kv_heads)):
            setattr(self.self_attn, name, nn.Linear(2 * h, out * cfg.head_dim, bias=False))  # input: [emb; hidden]
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps, 0.0)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps, 0.0)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps, 0.0)


class Eagle3Draft(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        c = cfg.layer
        self.cfg = cfg
        self.fc = nn.Linear(3 * cfg.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, 0.0)
        self.lm_head = nn.Linear(c.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [B, S, 3 * H_target] -> hidden [B, S, H]."""
        return self.fc(features)

    def forward(self, embeds, hidden, position_ids, past_k, past_v, attention_bias=None):
        """embeds [B, S, H] (token embeddings), hidden [B, S, H] (fused target features, or the previous
        step's pre-norm output); past_k/v [B, KV, P, D]. Returns draft logits [B, S, V_draft], pre-norm
        hidden [B, S, H] and the new keys/values [B, KV, S, D]."""
        layer = self.midlayer
        mask = causal_mask(self.cfg.layer, 0, position_ids, past_k.shape[2])
        if attention_bias is not None:
            mask = mask + attention_bias
        normed_hidden = layer.hidden_norm(hidden)
        residual = normed_hidden if self.cfg.norm_before_residual else hidden
        x = torch.cat((layer.input_layernorm(embeds), normed_hidden), dim=-1)
        a, k, v = layer.self_attn(x, position_ids, past_k, past_v, mask)
        h = residual + a
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.lm_head(self.norm(h)), h, k, v

    def target_ids(self) -> torch.Tensor:
        """Target token id of every draft id [V_draft]."""
        return torch.arange(self.cfg.draft_vocab_size, device=self.d2t.device) + self.d2t


def expected_shapes(cfg: Eagle3Config) -> dict[str, tuple[int, ...]]:
    c = cfg.layer
    h, d = c.hidden_size, c.head_dim
    return {
        "fc.weight": (h, 3 * cfg.target_hidden_size),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (c.num_heads * d, 2 * h),
        "midlayer.self_attn.k_proj.weight": (c.num_kv_heads * d, 2 * h),
        "midlayer.self_attn.v_proj.weight": (c.num_kv_heads * d, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, c.num_heads * d),
        "midlayer.mlp.gate_proj.weight": (c.intermediate_size, h),
        "midlayer.mlp.up_proj.weight": (c.intermediate_size, h),
        "midlayer.mlp.down_proj.weight": (h, c.intermediate_size),
        "norm.weight": (h,),
        "lm_head.weight": (cfg.draft_vocab_size, h),
        "d2t": (cfg.draft_vocab_size,),
    }


OPTIONAL = {"t2d", "embed_tokens.weight"}


def _canonical(name: str) -> str:
    for prefix in ("model.",):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name.replace("layers.0.", "midlayer.", 1) if name.startswith("layers.0.") else name


def load_eagle3_checkpoint(folder: Path, target: ModelConfig) -> tuple[Eagle3Config, dict[str, np.ndarray]]:
    """Config and tensors (canonical names: midlayer.*) of an EAGLE-3 checkpoint folder; SourceError names the
    first problem (missing file, pickle-only weights, missing/extra/misshaped tensor, d2t out of range)."""
    folder = Path(folder)
    hf, files = open_checkpoint(folder, "an EAGLE-3 checkpoint folder")
    cfg = eagle3_config_from_hf(hf, target, f"{folder}/config.json")
    tensors = read_tensors(files, _canonical)
    check_tensors(folder, tensors, expected_shapes(cfg), "EAGLE-3 checkpoint", OPTIONAL)
    targets = np.arange(cfg.draft_vocab_size) + tensors["d2t"].astype(np.int64)
    bad = np.nonzero((targets < 0) | (targets >= cfg.vocab_size))[0]
    if len(bad):
        raise SourceError(f"{folder}: d2t maps draft id {bad[0]} to target id {targets[bad[0]]}, outside the "
                          f"target vocabulary of {cfg.vocab_size}")
    return cfg, tensors


def save_eagle3_checkpoint(folder: Path, cfg: Eagle3Config, tensors: dict[str, np.ndarray], half: bool = False) -> None:
    """Write the vLLM/SGLang layout: config.json + model.safetensors (midlayer.* names, d2t, t2d); half: float
    tensors as float16 (how trained heads are published)."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = {k: np.ascontiguousarray(v.astype(np.float16) if half and v.dtype.kind == "f" else v)
           for k, v in tensors.items() if k in expected_shapes(cfg) or k in OPTIONAL}
    if "t2d" not in out:
        t2d = np.zeros(cfg.vocab_size, dtype=bool)
        t2d[np.arange(cfg.draft_vocab_size) + out["d2t"].astype(np.int64)] = True
        out["t2d"] = t2d
    save_file(out, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2))


def state_dict_of(model: Eagle3Draft) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


def model_from_tensors(cfg: Eagle3Config, tensors: dict[str, np.ndarray]) -> Eagle3Draft:
    model = Eagle3Draft(cfg).eval()
    state = {k: torch.from_numpy(np.array(v)) for k, v in tensors.items() if k in expected_shapes(cfg)}
    model.load_state_dict(state, strict=True)
    return model

