"""`specrt export-drafter`: a drafter checkpoint rewritten in the layout a serving engine reads, so that a drafter
trained or converted with specrt moves unchanged to vLLM, SGLang or the speculators format.

What each engine reads was taken from its code (docs/handoff.md cites files and lines: vLLM 0.32, SGLang 0.5.23,
speculators 0.9.0):

- EAGLE-3, vllm and sglang: one layout serves both: `LlamaForCausalLMEagle3`, `draft_vocab_size`, the layer ids
  twice (top-level as vLLM reads them, hidden_states[k]; eagle_config as SGLang reads them, the output of layer k;
  models/layer_ids.py), `layers.0.*` names without a `model.` prefix, lm_head [V_draft, H] and d2t offsets, no
  t2d. SGLang has no `norm_before_residual`: such a head is refused for sglang.
- DFlash, vllm: `DFlashDraftModel` with dflash_config {target_layer_ids (outputs), block_size, mask_token_id}
  and no EAGLE ids (vLLM would read those first). With a draft vocabulary: `draft_vocab_size`, d2t, and the
  target's lm_head rows of the draft vocabulary as the drafter's own `lm_head.weight` (vLLM shares the target's
  full head otherwise, whose first rows d2t would then map to unrelated tokens).
- DFlash, sglang: SGLang always drafts over the target's whole vocabulary (it ignores lm_head and d2t), so the
  draft vocabulary is dropped, with a note: its drafts can differ from specrt's.
- speculators: `speculators_model_type` eagle3 / dflash with transformer_layer_config, ids as hidden_states
  indices (EAGLE-3: eagle_aux_hidden_state_layer_ids; DFlash: aux_hidden_state_layer_ids), and the verifier
  named by --verifier (vLLM loads that model when given the speculator's folder alone).
- EAGLE-3, openvino: the folder optimum-intel's exporter (2.2) turns into an OpenVINO draft model: EAGLE's own
  names (`midlayer.*`, its LlamaEagle3Model), the target's `embed_tokens.weight` (the exported graph embeds the
  tokens itself), d2t offsets and t2d. OpenVINO GenAI takes the outputs of the target layers named by the draft
  IR's rt_info `hidden_layers_list`, else {2, L//2, L-3}: SET_HIDDEN_LAYERS (below) writes it into the IR
  after the export. It has no norm_before_residual either. DFlash is not exported for it (its DFlash is Qwen3-only).

specrt reads every one of these back (models/eagle3.py, models/dflash.py). The output folder is written under a
temporary name and renamed when complete.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specrt import drafter_kinds
from specrt.errors import SourceError, SpecrtError
from specrt.models.layer_ids import write_eagle3_layers

ENGINES = ("vllm", "sglang", "speculators", "openvino")
SPECULATORS_VERSION = "0.9.0"  # the format version written (the one read from its code)


class NotForEngine(SpecrtError):
    """This drafter kind has no layout in that engine (a bundle's export skips it with a note)."""


@dataclass
class Exported:
    kind: str
    folder: Path
    notes: list[str]
    run: str  # how to run it in that engine (one line)


def export(source: Path, engine: str, out: Path, target: str | None = None, verifier: str | None = None,
           force: bool = False, log=print) -> list[Exported]:
    """Export the drafter(s) of `source` (a bundle: each of its EAGLE-3 / DFlash drafters into out/KIND; or one
    checkpoint folder: into out) for `engine`. target: the target model (catalog name, GGUF or HF folder),
    needed for a checkpoint folder and for a DFlash draft vocabulary (its lm_head rows)."""
    from specrt.bundle import MANIFEST

    if engine not in ENGINES:
        raise SpecrtError(f"unknown engine {engine!r} for --for (known: {', '.join(ENGINES)})")
    source = Path(source).expanduser()
    out = Path(out).expanduser()
    if out.exists() and not force:
        raise SpecrtError(f"{out} exists (use --force to replace it)")
    if (source / MANIFEST).is_file():
        jobs, loaded_target = _bundle_jobs(source, target, log)
        nested = True
    elif (source / "config.json").is_file():
        if target is None:
            raise SpecrtError(f"{source} is a checkpoint folder: name its target with --target (catalog name, GGUF "
                              f"file or HF folder)")
        jobs, loaded_target, nested = [(_kind_of(source), source)], _Target(target, log), False
    else:
        raise SpecrtError(f"{source}: neither a bundle (no {MANIFEST}) nor a checkpoint folder (no config.json)")
    if not jobs:
        raise SpecrtError(f"{source}: the bundle has no drafter of a kind the engines take "
                          f"({', '.join(drafter_kinds.exportable_kinds())})")
    out.parent.mkdir(parents=True, exist_ok=True)
    done = []
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.partial-") as tmp:
        root = Path(tmp) / "out"
        root.mkdir()
        for kind, folder in jobs:
            dest = root / kind if nested else root
            dest.mkdir(exist_ok=True)
            writer = drafter_kinds.load_object(drafter_kinds.KINDS[kind].engine_writer)
            final = out / kind if nested else out
            try:
                notes, run = writer(folder, engine, dest, loaded_target, verifier, final)
            except NotForEngine as exc:
                if not nested:
                    raise
                log(f"{kind}: not exported: {exc}")
                dest.rmdir()
                continue
            (dest / "README.md").write_text(_readme(kind, engine, folder, notes, run))
            done.append(Exported(kind, final, notes, run))
        if not done:
            raise SpecrtError(f"{source}: none of its drafters can be exported for {engine}")
        if out.exists():
            shutil.rmtree(out)
        root.rename(out)
    return done


class _Target:
    """The target model, loaded only when its config or weights are first needed."""

    def __init__(self, spec: str, log, config=None):
        self.spec, self.log, self._config, self._loaded = spec, log, config, None

    def loaded(self):
        if self._loaded is None:
            from specrt.convert import sources

            self._loaded = sources.load(sources.resolve(self.spec, log=self.log))
        return self._loaded

    @property
    def config(self):
        return self._config if self._config is not None else self.loaded().config

    def embedding_rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows of the target's input embedding table [len(ids), H], float32."""
        from specrt.models.tensor_source import rows_of

        return np.asarray(rows_of(self.loaded().weights, "model.embed_tokens.weight", ids), dtype=np.float32)

    def head_rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows of the target's lm_head (its embedding table where tied) [len(ids), H], float32."""
        from specrt.models.tensor_source import head_name, rows_of

        loaded = self.loaded()
        name = head_name(loaded.weights, loaded.config.tie_word_embeddings)
        return np.asarray(rows_of(loaded.weights, name, ids), dtype=np.float32)


def _bundle_jobs(bundle: Path, target: str | None, log) -> tuple[list[tuple[str, Path]], _Target]:
    from specrt.bundle import checkpoint_sha256, load_bundle
    from specrt.models.config import ModelConfig

    manifest = load_bundle(bundle, check_hashes=False)
    jobs = []
    for entry in manifest.drafters:
        spec = drafter_kinds.KINDS.get(entry.kind)
        if spec is None or spec.engine_writer is None:
            log(f"{entry.name}: not exported: {spec.not_exported if spec else 'a kind this specrt does not know'}")
            continue
        folder = Path(entry.source)
        if not (folder / "config.json").is_file():
            raise SpecrtError(f"the bundle's {entry.name} drafter was converted from {folder}, which is not on this "
                              f"machine: export that checkpoint folder itself (specrt export-drafter FOLDER --target "
                              f"MODEL)")
        if entry.raw.get("source_sha256") and checkpoint_sha256(folder) != entry.raw["source_sha256"]:
            raise SpecrtError(f"{folder} changed since the bundle's {entry.name} drafter was converted from it: "
                              f"export the folder itself, or convert the bundle again")
        jobs.append((entry.kind, folder))
    spec = target or manifest.provenance.get("source") or manifest.model_name
    return jobs, _Target(spec, log, ModelConfig.from_dict(manifest.model_config))


def _kind_of(folder: Path) -> str:
    try:
        hf = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise SourceError(f"{folder}/config.json: not readable JSON ({exc})") from None
    if not isinstance(hf, dict):
        raise SourceError(f"{folder}/config.json: not a JSON object")
    words = " ".join([str(hf.get("speculators_model_type", ""))] + [str(a) for a in hf.get("architectures") or []])
    for spec in drafter_kinds.KINDS.values():
        if spec.engine_writer and any(name in words.lower() for name in spec.checkpoint_names):
            return spec.name
    raise SourceError(f"{folder}: not a checkpoint of a kind the engines take ({', '.join(drafter_kinds.exportable_kinds())}; "
                      f"architectures {hf.get('architectures')})")


def _save(dest: Path, config: dict, tensors: dict[str, np.ndarray]) -> None:
    from safetensors.numpy import save_file

    (dest / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: np.ascontiguousarray(v) for k, v in sorted(tensors.items())}, str(dest / "model.safetensors"))
    (dest / "model.safetensors").chmod(0o644)  # readable by the serving engine's user too


def _verifier(target: _Target, verifier: str | None) -> dict:
    from specrt import archs
    from specrt.models.config import ModelConfig

    cfg: ModelConfig = target.config
    arch = archs.hf_class(cfg.model_type)
    return {"name_or_path": verifier or target.spec, "architectures": [arch] if arch else []}


def _speculators(kind: str, architecture: str, layer_config: dict, tokens: int, target: _Target, verifier: str | None,
                 fields: dict) -> dict:
    return {"architectures": [architecture], "speculators_model_type": kind, "speculators_version": SPECULATORS_VERSION,
            "speculators_config": {"algorithm": kind, "default_proposal_method": "greedy",
                                   "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": tokens}],
                                   "verifier": _verifier(target, verifier)},
            "transformer_layer_config": layer_config, **fields}


def write_eagle3(folder: Path, engine: str, dest: Path, target: _Target, verifier: str | None,
                 final: Path) -> tuple[list[str], str]:
    """An EAGLE-3 head for ENGINE into dest (to be renamed to final); (notes, how to run it)."""
    from specrt.models.eagle3 import load_eagle3_checkpoint

    cfg, tensors = load_eagle3_checkpoint(folder, target.config)
    if engine in ("sglang", "openvino") and cfg.norm_before_residual:
        where = {"sglang": "sglang/srt/models/llama_eagle3.py",
                 "openvino": "optimum-intel's LlamaEagle3DecoderLayer"}[engine]
        raise SpecrtError(f"{folder}: the head uses norm_before_residual, which {engine}'s EAGLE-3 model does not "
                          f"have ({where}): it would draft differently there")
    names = {k.replace("midlayer.", "layers.0.", 1): v for k, v in tensors.items() if k != "t2d"}
    hf = cfg.to_hf()
    notes = [f"reads the outputs of target layers {list(cfg.aux_layers)} (HF hidden_states "
             f"{[k + 1 for k in cfg.aux_layers]})"]
    if engine == "openvino":
        return _write_eagle3_openvino(cfg, tensors, dest, target, final, notes)
    if engine == "speculators":
        layer = {k: v for k, v in hf.items() if k not in ("architectures", "draft_vocab_size", "target_hidden_size",
                                                          "norm_before_residual", "eagle_config",
                                                          "eagle_aux_hidden_state_layer_ids")}
        config = _speculators("eagle3", "Eagle3Speculator", {**layer, "model_type": "llama"}, 3, target, verifier, {
            "draft_vocab_size": cfg.draft_vocab_size, "target_hidden_size": cfg.target_hidden_size,
            "norm_before_residual": cfg.norm_before_residual, "norm_before_fc": False, "fc_norm": False,
            "norm_output": False, "eagle_aux_hidden_state_layer_ids": [k + 1 for k in cfg.aux_layers]})
    else:
        config = write_eagle3_layers(hf, cfg.aux_layers)
    _save(dest, config, names)
    return notes, _run_line("eagle3", "EAGLE3", engine, final, 3)


def _write_eagle3_openvino(cfg, tensors: dict[str, np.ndarray], dest: Path, target: _Target, final: Path,
                           notes: list[str]) -> tuple[list[str], str]:
    vocab = cfg.vocab_size
    out = {k: v for k, v in tensors.items() if k != "t2d"}
    out["embed_tokens.weight"] = target.embedding_rows(np.arange(vocab))  # [V, H]
    t2d = np.zeros(vocab, dtype=bool)
    t2d[np.arange(cfg.draft_vocab_size) + out["d2t"].astype(np.int64)] = True
    out["t2d"] = t2d
    out["d2t"] = out["d2t"].astype(np.int64)
    _save(dest, write_eagle3_layers(cfg.to_hf(), cfg.aux_layers), out)
    layers = list(cfg.aux_layers)
    default = default_openvino_layers(target.config.num_layers)
    if layers != default:
        notes.append(f"OpenVINO GenAI would read layers {default} unless told: after the export, write "
                     f"hidden_layers_list {layers} into the IR's rt_info (python -c \"$SCRIPT\" IR_FOLDER "
                     f"{','.join(map(str, layers))} with specrt.convert.export_drafter.SET_HIDDEN_LAYERS)")
    run = (f"optimum-cli export openvino --model {final} --task text-generation-with-past --trust-remote-code "
           f"IR_FOLDER; then openvino_genai.LLMPipeline(TARGET_IR, 'CPU', "
           f"draft_model=openvino_genai.draft_model('IR_FOLDER', 'CPU'))")
    return notes, run


def default_openvino_layers(num_layers: int) -> list[int]:
    """The target layers (outputs) OpenVINO GenAI's EAGLE-3 reads when the draft IR names none
    (src/cpp/src/speculative_decoding/eagle3_model_transforms.cpp: {2, L / 2, L - 3})."""
    return [2, num_layers // 2, num_layers - 3]


# Writes `hidden_layers_list` (the target layers whose outputs the head reads) into an exported EAGLE-3 draft IR's
# rt_info, where OpenVINO GenAI looks for it. Run by the Python that has openvino: python -c SCRIPT IR_DIR 2,15,27
SET_HIDDEN_LAYERS = """
import os, sys
import openvino as ov
xml = os.path.join(sys.argv[1], "openvino_model.xml")
model = ov.Core().read_model(xml)
model.set_rt_info([int(k) for k in sys.argv[2].split(",")], "hidden_layers_list")
ov.save_model(model, xml + ".tmp.xml", compress_to_fp16=False)
del model
os.replace(xml + ".tmp.bin", xml[:-4] + ".bin")
os.replace(xml + ".tmp.xml", xml)
"""


def write_dflash(folder: Path, engine: str, dest: Path, target: _Target, verifier: str | None,
                 final: Path) -> tuple[list[str], str]:
    """A DFlash drafter for ENGINE into dest (to be renamed to final); (notes, how to run it)."""
    from specrt.models.dflash import D2T, LM_HEAD, open_dflash_checkpoint

    if engine == "openvino":
        raise NotForEngine("DFlash drafters are not exported for OpenVINO: its DFlash reads only Qwen3 DFlash "
                          "models (optimum-intel's Qwen3DFlashDraftModel), not specrt's layout")

    cfg, weights, d2t = open_dflash_checkpoint(folder, target.config)
    tensors = {k: np.asarray(weights[k]) for k in weights}
    hf = cfg.to_hf()
    notes = [f"reads the outputs of target layers {list(cfg.target_layer_ids)}; block of {cfg.block_size} "
             f"(num_speculative_tokens {cfg.block_size - 1} in vLLM drafts the same block)"]
    fields = {}
    if d2t is not None and engine == "sglang":
        tensors.pop(LM_HEAD, None)
        notes.append(f"SGLang drafts DFlash over the target's whole vocabulary (it ignores lm_head and d2t): the "
                     f"draft vocabulary of {len(d2t)} tokens is dropped, so its drafts can differ from specrt's")
        d2t = None
    if d2t is not None:
        if LM_HEAD not in tensors:
            tensors[LM_HEAD] = target.head_rows(np.arange(len(d2t)) + d2t)  # [V_draft, H]
        tensors[D2T] = d2t.astype(np.int64)
        fields["draft_vocab_size"] = len(d2t)
        notes.append(f"draft vocabulary of {len(d2t)} tokens: d2t plus the target's lm_head rows for them")
    if engine == "speculators":
        layer = {k: v for k, v in hf.items() if k not in ("architectures", "dflash_config", "target_hidden_size",
                                                          "num_target_layers")}
        config = _speculators("dflash", "DFlashSpeculator", {**layer, "model_type": "qwen3"}, cfg.block_size - 1,
                              target, verifier, {
            "draft_vocab_size": fields.get("draft_vocab_size", cfg.layers.vocab_size),
            "target_hidden_size": cfg.target_hidden_size, "block_size": cfg.block_size,
            "mask_token_id": cfg.mask_token_id, "sliding_window_non_causal": True,
            "aux_hidden_state_layer_ids": [k + 1 for k in cfg.target_layer_ids]})
    else:
        config = {**hf, **fields}
    _save(dest, config, tensors)
    return notes, _run_line("dflash", "DFLASH", engine, final, cfg.block_size - 1)


def _run_line(method: str, algo: str, engine: str, folder: Path, tokens: int) -> str:
    """method: vLLM's speculative method; algo: SGLang's speculative_algorithm."""
    if engine == "sglang":
        return (f"sglang.Engine(model_path=TARGET, speculative_algorithm=\"{algo}\", "
                f"speculative_draft_model_path=\"{folder}\")")
    if engine == "speculators":
        return f"vllm.LLM(model=\"{folder}\")  # loads the verifier named in its config"
    return (f"vllm.LLM(model=TARGET, speculative_config={{\"method\": \"{method}\", \"model\": \"{folder}\", "
            f"\"num_speculative_tokens\": {tokens}}})")


def _readme(kind: str, engine: str, source: Path, notes: list[str], run: str) -> str:
    lines = [f"# {kind} drafter exported for {engine}", "", f"Written by `specrt export-drafter` from {source}.", ""]
    lines += [f"- {n}" for n in notes]
    lines += ["", "Run it:", "", f"    {run}", ""]
    return "\n".join(lines)
