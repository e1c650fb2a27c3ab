"""Which target layers a drafter checkpoint reads, in the conventions the serving engines use.

A drafter reads the target's hidden states "at layer k", and engines disagree about what k means. specrt's own
meaning, everywhere inside specrt (manifests, graphs, TargetTaps): layer k is the residual stream after decoder
layer k, HF's `hidden_states[k + 1]`. In config files (read from the engines' code; docs/handoff.md cites it):

| field | read by | k means |
| --- | --- | --- |
| top-level `eagle_aux_hidden_state_layer_ids` | vLLM (wins over the others) | HF hidden_states[k] (input of layer k) |
| `eagle_config.eagle_aux_hidden_state_layer_ids` | vLLM when there is no top-level list | HF hidden_states[k] |
| `eagle_config.eagle_aux_hidden_state_layer_ids` | SGLang (adds 1) | HF hidden_states[k + 1] (output of layer k) |
| no ids at all (EAGLE-3) | vLLM, SGLang, the EAGLE reference | HF hidden_states[2, L // 2, L - 3] |
| `dflash_config.target_layer_ids` | vLLM, SGLang, z-lab's DFlash | HF hidden_states[k + 1] |
| speculators `eagle_aux_hidden_state_layer_ids`, `aux_hidden_state_layer_ids` | vLLM | HF hidden_states[k] |

So an EAGLE-3 config whose only ids are in `eagle_config` means different layers to vLLM and to SGLang. specrt
writes both lists (top-level as vLLM reads it, eagle_config as SGLang reads it: one file, the same layers in
both engines) and refuses to guess when it reads a config with the eagle_config list alone.
"""

from __future__ import annotations

from specrt.errors import SourceError

EAGLE_TOP = "eagle_aux_hidden_state_layer_ids"  # top level, and inside eagle_config


def _ints(value, where: str, field: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not value or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise SourceError(f"{where}: {field} must be a non-empty list of integers, got {value!r}")
    return tuple(value)


def _check_range(outputs: tuple[int, ...], num_layers: int, where: str, field: str, shown) -> tuple[int, ...]:
    bad = [i for i in outputs if not 0 <= i < num_layers]
    if bad:
        raise SourceError(f"{where}: {field} {list(shown)} names layers outside the target's {num_layers} "
                          f"(in specrt's terms: outputs of layers {list(outputs)})")
    return outputs


def default_eagle3_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's default (HF hidden_states 2, L // 2, L - 3, as vLLM, SGLang and the reference read a config
    without ids), as layer outputs: 1, L // 2 - 1, L - 4."""
    return tuple(min(max(j, 1), num_layers) - 1 for j in (2, num_layers // 2, num_layers - 3))


def eagle3_layers(hf: dict, num_layers: int, where: str) -> tuple[int, ...]:
    """The layer outputs (specrt's meaning) an EAGLE-3 config.json names; SourceError when it is ambiguous."""
    nested = hf.get("eagle_config")
    if nested is not None and not isinstance(nested, dict):
        raise SourceError(f"{where}: eagle_config must be an object, got {type(nested).__name__}")
    inner = (nested or {}).get(EAGLE_TOP)
    top = hf.get(EAGLE_TOP)
    if "speculators_config" in hf:  # speculators: HF indices, top level only
        if not top:
            return default_eagle3_layers(num_layers)
        ids = _ints(top, where, EAGLE_TOP)
        return _check_range(tuple(j - 1 for j in ids), num_layers, where, EAGLE_TOP, ids)
    if top:
        ids = _ints(top, where, EAGLE_TOP)
        outputs = tuple(j - 1 for j in ids)
        if inner and tuple(_ints(inner, where, f"eagle_config.{EAGLE_TOP}")) != outputs:
            raise SourceError(f"{where}: top-level {EAGLE_TOP} {list(ids)} (vLLM: hidden_states[k]) and "
                              f"eagle_config.{EAGLE_TOP} {list(inner)} (SGLang: output of layer k) name different "
                              f"layers; they must differ by exactly 1")
        return _check_range(outputs, num_layers, where, EAGLE_TOP, ids)
    if inner:
        ids = _ints(inner, where, f"eagle_config.{EAGLE_TOP}")
        raise SourceError(
            f"{where}: eagle_config.{EAGLE_TOP} {list(ids)} alone is ambiguous (vLLM reads hidden_states[k], the "
            f"input of layer k; SGLang and specrt before 0.2 the output of layer k) and specrt assumes neither: add "
            f"\"{EAGLE_TOP}\": {[i + 1 for i in ids]} at the top level if they are layer outputs (SGLang, SpecForge, "
            f"older specrt), or {list(ids)} if they are hidden_states indices (vLLM, the EAGLE reference)")
    return default_eagle3_layers(num_layers)


def write_eagle3_layers(config: dict, outputs: tuple[int, ...]) -> dict:
    """config with the layers written for both engines: top level as vLLM reads it (hidden_states index = output
    + 1), eagle_config as SGLang reads it (the output index)."""
    nested = dict(config.get("eagle_config") or {})
    nested[EAGLE_TOP] = list(outputs)
    nested.setdefault("use_aux_hidden_state", True)
    return {**config, EAGLE_TOP: [k + 1 for k in outputs], "eagle_config": nested}


def dflash_layers(hf: dict, num_layers: int, where: str) -> tuple[int, ...]:
    """The layer outputs a DFlash config.json names (dflash_config.target_layer_ids, or the speculators
    format's aux_hidden_state_layer_ids); a top-level EAGLE list, which vLLM would read instead, must agree."""
    if "speculators_config" in hf:
        ids = _ints(hf.get("aux_hidden_state_layer_ids"), where, "aux_hidden_state_layer_ids")
        return _check_range(tuple(j - 1 for j in ids), num_layers, where, "aux_hidden_state_layer_ids", ids)
    extra = hf.get("dflash_config")
    if extra is not None and not isinstance(extra, dict):
        raise SourceError(f"{where}: dflash_config must be an object, got {type(extra).__name__}")
    raw = (extra or {}).get("target_layer_ids", hf.get("target_layer_ids"))
    if raw is None:
        raise SourceError(f"{where}: DFlash config lacks dflash_config.target_layer_ids")
    outputs = _ints(raw, where, "dflash_config.target_layer_ids")
    top = hf.get(EAGLE_TOP)
    if top and tuple(_ints(top, where, EAGLE_TOP)) != tuple(k + 1 for k in outputs):
        raise SourceError(f"{where}: top-level {EAGLE_TOP} {list(top)} (which vLLM reads first, as hidden_states[k]) "
                          f"and dflash_config.target_layer_ids {list(outputs)} (outputs of layer k) name different "
                          f"layers")
    return _check_range(outputs, num_layers, where, "dflash_config.target_layer_ids", outputs)
