"""ModelConfig: the architecture facts the torch definition and the ONNX builder need.

One frozen dataclass covers every architecture specrt reads; the differences are explicit fields, never branches on
an architecture's name. Each architecture's module (specrt/archs/) reads its config.json (or the HF-style dict a
GGUF's metadata becomes, models/gguf_loader.py) over the shared readers here: dense_config (the fields most configs
share), rope_from_hf (the older `rope_theta`/`rope_scaling` keys and the newer `rope_parameters`), moe_fields,
text_config (a multimodal layout's language model); check_ranges bounds every count.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from specrt.errors import SourceError

LINEAR_ATTENTION, FULL_ATTENTION = "linear_attention", "full_attention"
SHORT_CONV = "conv"  # LFM2's gated short convolution (models/short_conv.py): a conv state, no KV cache


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding: base frequency plus the optional scaling HF configs describe."""

    theta: float = 10000.0
    scaling_type: str = "default"  # default | linear | llama3 | yarn | proportional | longrope | none
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    # yarn (gpt-oss): the ramp between extrapolated and interpolated frequencies, and the factor cos and sin are
    # multiplied by (HF's attention_scaling)
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float = 1.0
    # proportional (Gemma 4's full layers): the first partial * D / 2 frequencies over the whole head size D, the rest
    # zero (those channel pairs pass through)
    partial: float = 1.0
    # longrope (Phi-3.5 / Phi-4-mini): each frequency divided by its factor, the short ones within
    # original_max_position, the long ones beyond it; attention_factor scales cos and sin
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    use_long: bool = False

    def inv_freq(self, head_dim: int) -> list[float]:
        """Inverse frequencies [head_dim // 2] after scaling (HF's rope_init functions). "none": a layer without
        rotary embeddings (every angle 0: cos 1, sin 0 turn nothing)."""
        if self.scaling_type == "none":
            return [0.0] * (head_dim // 2)
        inv = [1.0 / self.theta ** (2 * i / head_dim) for i in range(head_dim // 2)]
        if self.scaling_type == "longrope":
            factors = self.long_factor if self.use_long else self.short_factor
            return [f / factor for f, factor in zip(inv, factors)]
        if self.scaling_type == "proportional":
            turned = int(self.partial * head_dim // 2)
            return [f if i < turned else 0.0 for i, f in enumerate(inv)]
        if self.scaling_type == "linear":
            return [f / self.factor for f in inv]
        if self.scaling_type == "yarn":
            def correction_dim(rotations: float) -> float:
                return head_dim * math.log(self.original_max_position / (rotations * 2 * math.pi)) / (
                    2 * math.log(self.theta))
            low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
            if self.truncate:
                low, high = math.floor(low), math.ceil(high)
            low, high = max(low, 0), min(high, head_dim - 1)
            high = high + 0.001 if low == high else high
            out = []
            for i, f in enumerate(inv):
                extrapolate = 1 - min(max((i - low) / (high - low), 0.0), 1.0)  # 1: the frequency is kept
                out.append(f / self.factor * (1 - extrapolate) + f * extrapolate)
            return out
        if self.scaling_type == "llama3":
            low_wavelen = self.original_max_position / self.low_freq_factor
            high_wavelen = self.original_max_position / self.high_freq_factor
            out = []
            for f in inv:
                wavelen = 2 * math.pi / f
                if wavelen < high_wavelen:
                    out.append(f)
                elif wavelen > low_wavelen:
                    out.append(f / self.factor)
                else:
                    smooth = (self.original_max_position / wavelen - self.low_freq_factor) / (
                        self.high_freq_factor - self.low_freq_factor
                    )
                    out.append((1 - smooth) * f / self.factor + smooth * f)
            return out
        return inv

    def for_context(self, tokens: int) -> "RopeConfig":
        """The rope a bundle of `tokens` positions uses: longrope's long factors where the context passes the
        original one (llama.cpp's choice, made once per context; transformers switches per call, which a KV cache
        written under the short factors cannot follow)."""
        if self.scaling_type != "longrope":
            return self
        return dataclasses.replace(self, use_long=tokens > self.original_max_position)

    @staticmethod
    def from_dict(d: dict) -> "RopeConfig":
        known = {f.name for f in dataclasses.fields(RopeConfig)}
        d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in known}
        return RopeConfig(**d)


NO_ROPE = RopeConfig(scaling_type="none")  # a layer whose queries and keys are not turned (SmolLM3's every 4th)


@dataclass(frozen=True)
class ModelConfig:
    model_type: str  # HF model_type (llama, qwen2, qwen3, mistral, gemma3_text, ...)
    family: str  # "llama" or "gemma3": which block layout
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position: int
    rope: RopeConfig
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2: bias on q/k/v projections
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm over head_dim on q and k
    norm_offset: float = 0.0  # Gemma: norms multiply by (1 + weight)
    hidden_act: str = "silu"  # silu | gelu_tanh
    embed_scale: float = 1.0  # Gemma: embeddings times sqrt(hidden_size)
    attn_scale: float = 0.0  # 0 means head_dim ** -0.5
    sliding_window: int = 0  # 0: no sliding window
    sliding_layers: tuple[bool, ...] = ()  # per layer: True when the layer uses the sliding window
    local_rope: RopeConfig | None = None  # Gemma 3: rope of the sliding-window layers
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # Qwen3.5 hybrids: per layer "linear_attention" (Gated DeltaNet) or "full_attention" (empty: all full attention)
    layer_types: tuple[str, ...] = ()
    attn_output_gate: bool = False  # q_proj emits a sigmoid gate beside each query head (Qwen3.5)
    partial_rotary: float = 1.0  # share of head_dim that rotary embeddings turn (Qwen3.5: 0.25)
    linear_key_heads: int = 0  # Gated DeltaNet: query/key heads, value heads, their sizes, the conv kernel
    linear_value_heads: int = 0
    linear_key_dim: int = 0
    linear_value_dim: int = 0
    linear_conv_kernel: int = 0
    # mixture-of-experts MLPs (Qwen3-MoE): the experts, how many route each token, each expert's width, whether the
    # top-k routing weights are divided by their sum, and which layers keep a dense MLP
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1  # every n-th layer is sparse (HF's convention: layer i when (i + 1) % n == 0)
    mlp_only_layers: tuple[int, ...] = ()
    shared_expert_size: int = 0  # Qwen3.5-MoE: a dense expert every token runs, scaled by a sigmoid gate
    # gpt-oss: biases on the router and every expert, and the experts' SwiGLU
    # min(g, limit) * sigmoid(alpha * min(g, limit)) * (clamp(u, -limit, limit) + beta) (limit 0: none)
    moe_bias: bool = False
    swiglu_alpha: float = 1.0
    swiglu_limit: float = 0.0
    swiglu_beta: float = 0.0
    o_bias: bool = False  # a bias on the attention's output projection (gpt-oss)
    attention_sinks: bool = False  # gpt-oss: a learned logit per head joins every softmax's denominator
    # Gemma 4: full (global) layers with their own head size and KV heads (0: as the sliding ones), keys that are
    # also the values there (no v_proj), values RMS-normalized without a weight (a learned scalar after each layer
    # is a weight the layer has), soft-capped logits, per-layer input embeddings of width ple_size, the last kv_shared_layers layers reading
    # the KV of the last earlier layer of their type, those layers' MLPs twice as wide (double_wide_mlp), and MoE
    # layers that keep their dense MLP beside the experts (moe_with_dense, gelu-tanh experts, a scaled router)
    full_head_dim: int = 0
    full_kv_heads: int = 0
    full_k_eq_v: bool = False
    v_norm: bool = False
    final_softcap: float = 0.0
    ple_size: int = 0
    ple_vocab: int = 0
    kv_shared_layers: int = 0
    double_wide_mlp: bool = False
    moe_with_dense: bool = False
    nope_layers: tuple[bool, ...] = ()  # per layer: True where it has no rotary embeddings (SmolLM3)

    @property
    def scale(self) -> float:
        return self.attn_scale or self.head_dim**-0.5

    def scale_of(self, layer: int) -> float:
        return self.attn_scale or self.head_dim_of(layer) ** -0.5

    def head_dim_of(self, layer: int) -> int:
        """The layer's head size (Gemma 4's full layers have their own)."""
        return self.full_head_dim if self.full_head_dim and not self.is_sliding(layer) else self.head_dim

    def kv_heads_of(self, layer: int) -> int:
        return self.full_kv_heads if self.full_kv_heads and not self.is_sliding(layer) else self.num_kv_heads

    def k_eq_v(self, layer: int) -> bool:
        """The layer's values are its keys' projection (no v_proj)."""
        return self.full_k_eq_v and not self.is_sliding(layer)

    def kv_source(self, layer: int) -> int:
        """The layer whose keys and values this one attends over: itself, or for the last kv_shared_layers layers
        the last earlier layer of the same kind (sliding or full) that keeps its own."""
        first_shared = self.num_layers - self.kv_shared_layers
        if not self.kv_shared_layers or layer < first_shared:
            return layer
        kind = self.is_sliding(layer)
        earlier = [i for i in range(first_shared) if self.is_sliding(i) == kind]
        return earlier[-1] if earlier else -1  # -1: it reads a cache from outside (Gemma 4's assistant)

    def intermediate_of(self, layer: int) -> int:
        """The layer's dense MLP width."""
        shared = self.kv_source(layer) != layer
        return 2 * self.intermediate_size if self.double_wide_mlp and shared else self.intermediate_size

    def kv_shape_of(self, layer: int) -> tuple[int, int]:
        """(KV heads, head size) of the layer's cache."""
        return self.kv_heads_of(layer), self.head_dim_of(layer)

    @property
    def uniform_kv(self) -> bool:
        """Every cached layer has the same KV heads and head size."""
        return len({self.kv_shape_of(i) for i in self.attention_layers}) <= 1

    @property
    def kv_layer_ids(self) -> tuple[int, ...]:
        """The manifest's kv.layer_ids: the cached layers where some layer has none of its own (else empty: all)."""
        return self.attention_layers if len(self.attention_layers) < self.num_layers else ()

    @property
    def kv_layer_shapes(self) -> tuple[tuple[int, int], ...]:
        """The manifest's kv.layer_shapes: (KV heads, head size) per cached layer where they differ (else empty)."""
        return () if self.uniform_kv else tuple(self.kv_shape_of(i) for i in self.attention_layers)

    def is_sliding(self, layer: int) -> bool:
        return bool(self.sliding_window) and bool(self.sliding_layers) and self.sliding_layers[layer]

    @property
    def active_sliding_window(self) -> int:
        """The sliding window when any layer uses one, else 0."""
        return self.sliding_window if any(self.is_sliding(i) for i in range(self.num_layers)) else 0

    @property
    def rotary_dim(self) -> int:
        """Channels of each head that rotary embeddings turn (the first rotary_dim; the rest pass through)."""
        return int(self.head_dim * self.partial_rotary)

    def rotary_dim_of(self, layer: int) -> int:
        return int(self.head_dim_of(layer) * self.partial_rotary)

    def is_linear(self, layer: int) -> bool:
        """The layer is Gated DeltaNet linear attention (a recurrent and a conv state, no KV cache)."""
        return bool(self.layer_types) and self.layer_types[layer] == LINEAR_ATTENTION

    def is_short_conv(self, layer: int) -> bool:
        """The layer's token mixer is a gated short convolution (a conv state, no KV cache)."""
        return bool(self.layer_types) and self.layer_types[layer] == SHORT_CONV

    def has_state(self, layer: int) -> bool:
        """The layer carries a state instead of a KV cache (runtime/recurrent_state.py)."""
        return self.is_linear(layer) or self.is_short_conv(layer)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers with a KV cache of their own, in order (not layers with a state, not layers reading
        another's cache)."""
        return tuple(i for i in range(self.num_layers) if not self.has_state(i) and self.kv_source(i) == i)

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_layers) if self.is_linear(i))

    @property
    def state_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_layers) if self.has_state(i))

    @property
    def conv_channels(self) -> int:
        """Channels of a state layer's causal conv: its conv state is [kernel - 1, conv_channels]. Gated DeltaNet
        convolves its query, key and value; a short convolution the hidden size."""
        if not self.linear_key_heads:
            return self.hidden_size
        return 2 * self.linear_key_heads * self.linear_key_dim + self.linear_value_heads * self.linear_value_dim

    def is_moe(self, layer: int) -> bool:
        """The layer's MLP is a sparse mixture of experts (models/moe.py)."""
        return (self.num_experts > 0 and layer not in self.mlp_only_layers
                and (layer + 1) % self.decoder_sparse_step == 0)

    @property
    def moe_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_layers) if self.is_moe(i))

    def for_context(self, tokens: int) -> "ModelConfig":
        """This config as a bundle of `tokens` positions runs it (RopeConfig.for_context)."""
        local = self.local_rope.for_context(tokens) if self.local_rope else None
        return dataclasses.replace(self, rope=self.rope.for_context(tokens), local_rope=local)

    def rope_for(self, layer: int) -> RopeConfig:
        if self.nope_layers and self.nope_layers[layer]:
            return NO_ROPE
        return self.local_rope if (self.local_rope and self.is_sliding(layer)) else self.rope

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(ModelConfig)}
        d = {k: v for k, v in d.items() if k in known}  # a field an older or newer specrt wrote is left out
        d["rope"] = RopeConfig.from_dict(d["rope"])
        d["local_rope"] = RopeConfig.from_dict(d["local_rope"]) if d.get("local_rope") else None
        d["sliding_layers"] = tuple(d.get("sliding_layers", ()))
        d["eos_token_ids"] = tuple(d.get("eos_token_ids", ()))
        d["layer_types"] = tuple(d.get("layer_types", ()))
        d["mlp_only_layers"] = tuple(d.get("mlp_only_layers", ()))
        d["nope_layers"] = tuple(d.get("nope_layers", ()))
        return ModelConfig(**d)


def rope_from_hf(hf: dict, params: dict | None) -> RopeConfig:
    """Read rope settings from a rope_parameters dict, or the older rope_theta + rope_scaling."""
    if params is None:
        params = dict(hf.get("rope_scaling") or {})
        params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    rtype = params.get("rope_type") or params.get("type") or "default"
    if rtype not in ("default", "linear", "llama3", "yarn", "proportional"):
        raise SourceError(f"unsupported rope scaling {rtype!r} (supported: default, linear, llama3, yarn, proportional)")
    if rtype == "proportional":
        partial = float(params.get("partial_rotary_factor", 1.0))
        if not 0 <= partial <= 1:
            raise SourceError(f"config: partial_rotary_factor = {partial} must be in [0, 1]")
        return RopeConfig(theta=float(params.get("rope_theta", 10000.0)), scaling_type="proportional", partial=partial)
    if rtype == "yarn":
        factor = float(params.get("factor") or 1.0)
        attention = params.get("attention_factor")
        if attention is None:
            def mscale(scale: float, m: float = 1.0) -> float:
                return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
            if params.get("mscale") and params.get("mscale_all_dim"):
                attention = mscale(factor, float(params["mscale"])) / mscale(factor, float(params["mscale_all_dim"]))
            else:
                attention = mscale(factor)
        return RopeConfig(
            theta=float(params.get("rope_theta", hf.get("rope_theta", 10000.0))), scaling_type="yarn", factor=factor,
            original_max_position=int(params.get("original_max_position_embeddings") or 4096),
            beta_fast=float(params.get("beta_fast") or 32), beta_slow=float(params.get("beta_slow") or 1),
            truncate=bool(params.get("truncate", True)), attention_factor=float(attention))
    return RopeConfig(
        theta=float(params.get("rope_theta", hf.get("rope_theta", 10000.0))),
        scaling_type=rtype,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position=int(params.get("original_max_position_embeddings", 8192)),
    )


def eos_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (int(value),)


# what a real model can have; a file that declares more is refused before anything is allocated for it
LIMITS = {"vocab_size": 1 << 24, "hidden_size": 1 << 17, "intermediate_size": 1 << 20, "num_layers": 4096,
          "num_heads": 4096, "num_kv_heads": 4096, "head_dim": 4096, "max_position": 1 << 31}


def check_ranges(cfg: ModelConfig) -> ModelConfig:
    """Every count positive and within LIMITS, heads divisible into kv groups, eps/theta finite and positive:
    a SourceError naming the field otherwise (a zero would divide by zero later, an infinite eps makes every
    output NaN, a huge count allocates without end)."""
    for name, limit in LIMITS.items():
        value = getattr(cfg, name)
        if not 1 <= value <= limit:
            raise SourceError(f"config: {name} = {value} is out of range (1..{limit})")
    if cfg.num_heads % cfg.num_kv_heads:
        raise SourceError(f"config: num_attention_heads {cfg.num_heads} is not a multiple of num_key_value_heads "
                          f"{cfg.num_kv_heads}")
    if cfg.head_dim % 2:
        raise SourceError(f"config: head_dim {cfg.head_dim} is odd (rotary embeddings pair its channels)")
    if not (math.isfinite(cfg.rms_norm_eps) and 0 < cfg.rms_norm_eps < 1):
        raise SourceError(f"config: rms_norm_eps = {cfg.rms_norm_eps} must be finite, > 0 and < 1")
    for label, rope in (("rope_theta", cfg.rope), ("rope_local_base_freq", cfg.local_rope)):
        if rope is not None and not (math.isfinite(rope.theta) and rope.theta > 0):
            raise SourceError(f"config: {label} = {rope.theta} must be finite and > 0")
        if rope is not None and not (math.isfinite(rope.factor) and rope.factor > 0):
            raise SourceError(f"config: rope scaling factor = {rope.factor} must be finite and > 0")
    return cfg


def moe_fields(hf: dict, layers: int) -> dict:
    """The mixture-of-experts fields of a config with routed experts (none for a dense model); a top-k larger than
    the expert count, or a count out of range, is a SourceError naming the field."""
    experts = int(hf.get("num_experts") or hf.get("num_local_experts") or 0)
    if not experts:
        return {}
    top_k = int(hf.get("num_experts_per_tok") or 0)
    if not 1 <= experts <= 1 << 16:
        raise SourceError(f"config: num_experts = {experts} is out of range (1..65536)")
    if not 1 <= top_k <= experts:
        raise SourceError(f"config: num_experts_per_tok = {top_k} must be between 1 and num_experts ({experts})")
    width = int(hf.get("moe_intermediate_size") or 0)
    if not 1 <= width <= LIMITS["intermediate_size"]:
        raise SourceError(f"config: moe_intermediate_size = {width} is out of range (1..{LIMITS['intermediate_size']})")
    step = int(hf.get("decoder_sparse_step") or 1)
    if not 1 <= step <= layers:
        raise SourceError(f"config: decoder_sparse_step = {step} is out of range (1..{layers})")
    dense = hf.get("mlp_only_layers") or []
    if not isinstance(dense, list) or any(not isinstance(i, int) or not 0 <= i < layers for i in dense):
        raise SourceError(f"config: mlp_only_layers must list layer numbers below {layers}")
    return {"num_experts": experts, "experts_per_token": top_k, "moe_intermediate_size": width,
            "norm_topk_prob": bool(hf.get("norm_topk_prob", False)), "decoder_sparse_step": step,
            "mlp_only_layers": tuple(sorted(set(dense)))}


def activation(hf: dict) -> str:
    """hidden_activation / hidden_act as the builders name it (silu | gelu_tanh); a SourceError for another."""
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "silu"
    known = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}.get(act)
    if known is None:
        raise SourceError(f"unsupported activation {act!r} (supported: silu, gelu_pytorch_tanh)")
    return known


def sizes(hf: dict) -> tuple[int, int, int, int]:
    """(hidden size, attention heads, layers, head size) of a config; the layer count is checked before any
    per-layer list is built from it."""
    hidden, heads, layers = int(hf["hidden_size"]), int(hf["num_attention_heads"]), int(hf["num_hidden_layers"])
    if not 1 <= layers <= LIMITS["num_layers"]:
        raise SourceError(f"config: num_layers = {layers} is out of range (1..{LIMITS['num_layers']})")
    return hidden, heads, layers, int(hf.get("head_dim") or hidden // heads)


def dense_config(hf: dict, family: str = "llama", sliding_default: bool = False, window_everywhere: bool = False,
                 **fields) -> ModelConfig:
    """The config of a pre-norm decoder read from the fields most HF configs share (sizes, rope, sliding layers,
    activation, tied head, special ids); `fields` set what an architecture fixes or reads its own way.
    Sliding windows: layers that layer_types marks sliding_attention when use_sliding_window (default
    sliding_default) says so; window_everywhere: a window without layer_types slides on every layer (Mistral)."""
    hidden, heads, layers, head_dim = sizes(hf)
    params = hf.get("rope_parameters")
    layer_types = hf.get("layer_types")
    sliding_layers = tuple(t == "sliding_attention" for t in layer_types) if layer_types else ()
    sliding_window = int(hf.get("sliding_window") or 0)
    if not hf.get("use_sliding_window", sliding_default) or not sliding_layers:
        if window_everywhere and sliding_window:
            sliding_layers = (True,) * layers
        else:
            sliding_window, sliding_layers = 0, ()
    base = dict(
        model_type=hf["model_type"], family=family, vocab_size=int(hf["vocab_size"]), hidden_size=hidden,
        intermediate_size=int(hf["intermediate_size"]), num_layers=layers, num_heads=heads,
        num_kv_heads=heads if hf.get("num_key_value_heads") is None else int(hf["num_key_value_heads"]),
        head_dim=head_dim, rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_position=int(hf.get("max_position_embeddings", 4096)),
        rope=fields["rope"] if "rope" in fields else rope_from_hf(hf, params if params and "rope_theta" in params else None),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)), qkv_bias=bool(hf.get("attention_bias", False)),
        hidden_act=activation(hf), sliding_window=sliding_window, sliding_layers=sliding_layers,
        bos_token_id=hf.get("bos_token_id"), eos_token_ids=eos_ids(hf.get("eos_token_id")))
    return ModelConfig(**{**base, **fields})


def text_config(hf: dict, text_type: str, tie_default: bool) -> dict:
    """The language model's config of a published multimodal layout (its text_config), as a config of its own of
    model_type text_type; its tie_word_embeddings is the outer config's where the text config has none."""
    text = hf.get("text_config")
    if not isinstance(text, dict):
        raise SourceError(f"config: a {hf.get('model_type')} config needs a text_config object")
    tie = text.get("tie_word_embeddings", hf.get("tie_word_embeddings", tie_default))
    return {**text, "model_type": text_type, "tie_word_embeddings": tie}


def config_from_hf(hf: dict) -> ModelConfig:
    """ModelConfig from an HF config.json dict, read by its architecture's module (specrt/archs/); SourceError for
    unsupported architectures, missing or malformed fields and values out of range (check_ranges)."""
    from specrt import archs

    if not isinstance(hf, dict):
        raise SourceError(f"config: expected a JSON object, got {type(hf).__name__}")
    model_type = hf.get("model_type", "")
    if not isinstance(model_type, str):
        raise SourceError(f"config: model_type must be a string, not {model_type!r:.40}")
    arch = archs.for_model_type(model_type)
    try:
        return check_ranges(arch.module().config_from_hf(hf))
    except SourceError:
        raise  # already one line naming the field
    except KeyError as exc:
        raise SourceError(f"config.json lacks {exc.args[0]!r}") from None
    except (TypeError, ValueError, ZeroDivisionError, OverflowError) as exc:  # a field of the wrong type or zero
        raise SourceError(f"config: a malformed field ({type(exc).__name__}: {exc})") from None
