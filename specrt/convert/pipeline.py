"""`specrt convert`: source -> validated bundle, written to a temporary folder and renamed into place.

Stages: resolve and load the source, build the target graph, save it with external data, carry the
tokenizer and chat template, validate ONNX Runtime against the torch reference, write specrt.json
with every file's size and sha256, then one rename. Any failure (bad input, validation, a full disk,
Ctrl-C) removes the temporary folder, so nothing is ever left at the output path.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import functools
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specrt import __version__
from specrt.bundle import (ATTENTION_ROWS_INPUT, EXPERT_CALLS_INPUT, KVLayout, MANIFEST, PRECISIONS, Manifest,
                           TargetGraph, file_entry, weight_bits)
from specrt.convert import sources
from specrt.convert.gpu_profile import (activation_dtype, built_for, check_profile, refuse_off_migraphx,
                                        validation_providers)
from specrt.convert.drafter_bundle import (add_drafter, check_drafter_spec, drafter_specs, drafter_stages,
                                           hidden_layers_for, takes_draft_vocab)
from specrt.convert.memory import GIB, StagePeaks, check_fits, release_freed_memory
from specrt.convert.onnx_graph import float_activation_twin
from specrt.convert.linear_attention_graph import state_layout
from specrt.convert.smoothing import CALIBRATION_TEXTS, smooth_down_proj
from specrt.convert.quant_rows import QuantReadback
from specrt.convert.target_graph import GraphOptions, io_names, write_target_graph
from specrt.convert.tokenizer import write_tokenizer
from specrt.convert.validate import (VALIDATION_TEXTS, VALIDATION_TOKENS, SpilledOutputs, check, check_file_weights,
                                     check_routing, compare, run_graph)
from specrt.errors import OutputPathError, SpecrtError
from specrt.runtime.target_session import TargetSession, TargetSpec

DEFAULT_MAX_CONTEXT = 4096


@dataclass(frozen=True)
class ConvertOptions:
    precision: str = "fp32"
    max_context: int | None = None  # default: min(model's max positions, 4096)
    device: str = "cpu"
    force: bool = False
    hidden_layers: tuple[int, ...] = ()
    drafter: str | tuple[str, ...] | None = None  # "draft-model:PATH_OR_NAME", "eagle3:FOLDER", ... (or several)
    int4_block_size: int = 32  # weights per int4/int8 block (target and draft model): 32, 64 or 128
    draft_vocab: int = 0  # a draft model's output head cut to this many frequent tokens (0: its whole vocabulary)


class Stages:
    """Reports stage progress; the CLI passes a tqdm-backed one, the API a silent one."""

    names = ("load source", "tokenizer", "build target graph", "save target graph", "validate target", "write manifest")

    def expect(self, total: int) -> None:  # pragma: no cover - overridden
        pass

    def start(self, name: str) -> None:  # pragma: no cover - overridden
        pass

    def done(self) -> None:  # pragma: no cover - overridden
        pass

    def log(self, msg: str) -> None:  # pragma: no cover - overridden
        pass


def _check_output(out: Path, force: bool) -> None:
    if out.exists() and not force:
        raise OutputPathError(f"{out} already exists (use --force to replace it)")
    if not out.parent.exists():
        raise OutputPathError(f"{out.parent}: parent folder does not exist")
    if not os.access(out.parent, os.W_OK):
        raise OutputPathError(f"{out.parent}: not writable")


def _tokenize(bundle_dir: Path, texts, vocab: int, max_context: int) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(bundle_dir / "tokenizer.json"))
    prompts = []
    for text in texts:
        ids = [i % vocab for i in tok.encode(text).ids][:max_context]
        prompts.append(ids if len(ids) >= 3 else ids + [1, 2, 3])
    return prompts


def convert(source: str, out: Path, opts: ConvertOptions, stages: Stages | None = None) -> Manifest:
    measured = StagePeaks(stages or Stages())
    try:
        return _convert(source, out, opts, measured)
    except BaseException:
        if measured.peaks:
            measured.log(f"peak memory by stage: {measured.summary()}")
        raise
    finally:
        measured.close()


def _convert(source: str, out: Path, opts: ConvertOptions, stages: StagePeaks) -> Manifest:
    out = Path(out).expanduser().absolute()
    if opts.precision not in PRECISIONS:
        raise SpecrtError(f"precision must be one of {', '.join(PRECISIONS)}")
    if opts.int4_block_size not in INT4_BLOCK_SIZES:
        raise SpecrtError(f"--int4-block-size {opts.int4_block_size}: one of {', '.join(map(str, INT4_BLOCK_SIZES))}")
    _check_output(out, opts.force)
    check_profile(opts.device, opts.precision)
    for spec in drafter_specs(opts.drafter):
        check_drafter_spec(spec, opts.precision)
    if opts.draft_vocab and not any(takes_draft_vocab(s) for s in drafter_specs(opts.drafter)):
        raise SpecrtError("--draft-vocab cuts a draft model's output head: add --drafter draft-model:MODEL")
    stages.expect(len(Stages.names) + sum(drafter_stages(s) for s in drafter_specs(opts.drafter)))
    t0 = time.time()
    providers = validation_providers(opts.device, stages.log)

    resolved = sources.resolve(source, log=stages.log)  # may fetch a catalog model (logged)
    if opts.precision == "gguf" and resolved.kind != "gguf":
        raise SpecrtError(f"--precision gguf keeps a GGUF file's own quantized weights: {source} is not a .gguf file "
                          "(use int4 or int8)")
    stages.start("load source")
    loaded = sources.load(resolved)
    cfg = loaded.config
    if isinstance(loaded.hf_config.get("vision_config"), dict):
        stages.log("the checkpoint's vision tower is skipped: specrt converts its language model (text in, text out)")
    max_context = opts.max_context or min(cfg.max_position, DEFAULT_MAX_CONTEXT)
    if max_context < 16:
        raise SpecrtError(f"--max-context {max_context} is too small (minimum 16)")
    loaded.config = cfg = cfg.for_context(max_context)  # LongRoPE's factors for this context
    bad = [i for i in opts.hidden_layers if not 0 <= i < cfg.num_layers]
    if bad:
        raise SpecrtError(f"hidden layer {bad[0]} out of range (model has {cfg.num_layers} layers)")
    shapes = {name: loaded.weights.shape(name) for name in loaded.weights}
    kv_bytes = (2 * len(cfg.attention_layers) * cfg.num_kv_heads * max_context * cfg.head_dim
                * np.dtype(activation_dtype(opts.precision, opts.device)).itemsize)
    need = check_fits(resolved.name, shapes, cfg.num_layers, opts.precision, opts.int4_block_size,
                      cfg.tie_word_embeddings, kv_bytes)
    stages.log(f"estimated peak memory {need / GIB:.1f} GiB")
    stages.done()

    remove_stale_partials(out, stages.log)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-{os.getpid()}-", dir=out.parent))
    try:
        manifest = _write_bundle(tmp, loaded, opts, max_context, providers, stages)
        _move_into_place(tmp, out, opts.force)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        reason = "disk full" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)
        raise OutputPathError(f"could not write the bundle at {out}: {reason}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    stages.log(f"converted {resolved.name} ({opts.precision}) in {time.time() - t0:.1f} s, peak memory "
               f"{peak_memory_gib():.1f} GiB -> {out}")
    if stages.peaks:
        stages.log(f"peak memory by stage: {stages.summary()}")
    return manifest


INT4_BLOCK_SIZES = (32, 64, 128)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def remove_stale_partials(out: Path, log) -> None:
    """Remove what killed conversions to `out` left beside it (`.OUT.partial-PID-*` folders, `.OUT.old-PID`
    of an interrupted --force) whose process is gone; a folder without a PID (written by an older specrt) is
    stale too. A conversion still running (its PID alive) keeps its folder."""
    for path in sorted(out.parent.glob(f".{out.name}.partial-*")) + sorted(out.parent.glob(f".{out.name}.old-*")):
        tail = path.name.split(".partial-", 1)[-1] if ".partial-" in path.name else path.name.split(".old-", 1)[-1]
        pid = tail.split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid)):
            continue
        log(f"removing {path.name}, left by an interrupted conversion")
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def peak_memory_gib() -> float:
    """Peak resident memory of this process so far (what a conversion needed)."""
    import resource

    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB (macOS: bytes)
    return kib / (1 << 30 if sys.platform == "darwin" else 1 << 20)


def _move_into_place(tmp: Path, out: Path, force: bool) -> None:
    if out.exists():
        if not force:
            raise OutputPathError(f"{out} already exists (use --force to replace it)")
        trash = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, trash)
        os.replace(tmp, out)
        if trash.is_dir():
            shutil.rmtree(trash, ignore_errors=True)
        else:
            trash.unlink(missing_ok=True)
    else:
        os.replace(tmp, out)


def _torch_model(cfg, weights: dict):
    """The torch reference of a model whose parameters *are* the given float32 arrays (shared, not copied: a
    1.5B model is 6 GB in fp32, and conversion must not hold it twice). Parameters the weights lack keep their
    default initialization (a tied lm_head is the embedding)."""
    import torch

    from specrt.models.transformer import CausalLM, RMSNorm

    with torch.device("meta"):
        model = CausalLM(cfg).eval()
    model.to_empty(device="cpu")  # memory not yet touched, then replaced by the weights: never resident
    state = {k: torch.from_numpy(np.require(v, np.float32, requirements="W")) for k, v in weights.items()}
    model.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    for name, module in model.named_modules():
        lacking = [n for n, _ in module.named_parameters(recurse=False) if f"{name}.{n}".lstrip(".") not in state]
        if hasattr(module, "rotary_frequencies"):
            module.inv_freq = module.rotary_frequencies()
        if not lacking or module is model.lm_head and cfg.tie_word_embeddings:
            continue
        if isinstance(module, RMSNorm):
            torch.nn.init.constant_(module.weight, 0.0 if module.offset else 1.0)
        else:
            module.reset_parameters()
    model.requires_grad_(False)
    return model


def _against_followed_routes(graph: Path, spec: TargetSpec, providers, prompts: list[list[int]], cfg, spill: Path,
                             name: str, reference) -> tuple:
    """An MoE graph (with float activations) against the torch reference that follows its choice of experts where
    two nearly tie (rounding may pick either; a swap moves every later logit of a deep model). The graph runs
    first, its router logits as extra outputs and its outputs waiting on disk; then reference(routes) runs.
    Returns the report, the reference's outputs (spilled) and the routing record (a choice beyond a near-tie
    refuses the graph)."""
    twin, routers = float_activation_twin(graph, router_outputs=True)
    try:
        session = TargetSession(twin, dataclasses.replace(spec, extra_outputs=tuple(routers.values())),
                                providers=providers)
        got, routes = run_graph(session, prompts, spill, routers, cfg.experts_per_token)
        del session
    finally:
        twin.unlink()
    release_freed_memory()  # ONNX Runtime's copy of the model goes back before the torch reference runs
    ref = reference(routes)
    record = check_routing(ref.routing)
    outputs = SpilledOutputs(spill, name, list(zip(ref.logits, ref.taps)))
    del ref
    return compare(got, outputs, prompts), outputs, record


def _ggml_operators(stages: Stages) -> bool:
    """Whether specrt's GGUF operators can run here (specrt/kernels/ggml_ops); said in the log either way."""
    from specrt.kernels import ggml_ops

    try:
        ggml_ops.library()
    except ggml_ops.NativeUnavailable as exc:
        stages.log(f"gguf: quantized weights in ONNX Runtime's MatMulNBits forms ({exc})")
        return False
    stages.log("gguf: Q5_0/Q5_1/Q4_K/Q5_K/Q6_K weights as the file's own blocks, in specrt's operators")
    return True


def _build_graph(tmp: Path, stem: str, loaded, precision: str, max_context: int, hidden_layers: tuple[int, ...],
                 providers, stages: Stages, int4_block_size: int = 32, device: str = "cpu") -> tuple[TargetGraph, dict]:
    """Build `<stem>.onnx` (+ .data) for a loaded model, streaming, and validate it against torch.

    Memory stays bounded by a layer, not the model: the torch reference runs layer by layer
    (models/layerwise.py), each weight is read from the source, converted and appended to the data file in
    turn (write_target_graph), and the int4/int8 reference reads the written quantized weights back one layer at
    a time.
    Returns the graph entry for the manifest and the validation record. The tokenizer must already be in tmp.
    """
    from specrt.models.layerwise import run_layerwise
    from specrt.models.moe import ROUTE_TIE, ROUTE_TIE_FP16

    cfg = loaded.config
    stages.start(f"build {stem} graph")
    cpu = device == "cpu"  # a GPU graph leaves the CPU's exactness machinery out (convert/gpu_profile.py)
    graph_opts = GraphOptions(precision=precision, max_context=max_context, hidden_layers=tuple(sorted(hidden_layers)),
                              int4_block_size=int4_block_size, attention_rows_input=cpu,
                              exact_attention=cpu and providers[0] == "CPUExecutionProvider", device=device,
                              ggml_operators=precision == "gguf" and cpu and _ggml_operators(stages))
    half = graph_opts.activation_dtype == np.float16
    prompts = _tokenize(tmp, VALIDATION_TEXTS, cfg.vocab_size, min(max_context, VALIDATION_TOKENS))
    bits = weight_bits(precision)
    exact_gguf = precision == "gguf"  # the source's own quantized weights: no calibration, nothing smoothed
    calibration = _tokenize(tmp, CALIBRATION_TEXTS, cfg.vocab_size, max_context) if bits and not exact_gguf else []
    # a mixture of experts is checked against a reference that follows the graph's near-tied choices of experts,
    # run after the graph (_against_followed_routes), a GPU graph's float16 one too (held at float16's limit)
    follow_routes = bool(cfg.moe_layers)
    route_tie = ROUTE_TIE_FP16 if half else ROUTE_TIE  # a near-tie within float16's rounding in a GPU graph
    spill = tmp / ".validation"  # the references wait on disk (removed below, before the bundle is kept)
    weights, source_outputs = loaded.weights, None
    if bits or not follow_routes:
        # one pass of the source model: calibration statistics (int4/int8) and the validation reference together
        source = run_layerwise(cfg, loaded.weights, calibration + prompts, graph_opts.hidden_layers,
                               observe=len(calibration), outputs_from=len(calibration))
        source_outputs = SpilledOutputs(spill, "source", list(zip(source.logits, source.taps)))
        if bits and not exact_gguf:
            weights = smooth_down_proj(weights, source.down_proj_max)
        del source
    stages.done()

    stages.start(f"save {stem} graph")  # the weights are written as the graph is built
    written = write_target_graph(cfg, weights, graph_opts, tmp, stem)
    if device == "rocm":  # a graph MIGraphX would leave (partly or wholly) to the CPU is refused, not shipped
        refuse_off_migraphx(tmp / f"{stem}.onnx")
    if exact_gguf:
        report_gguf_forms(written, stages)
    stages.done()

    stages.start(f"validate {stem}")
    spec = TargetSpec(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, max_context, cfg.vocab_size,
                      kv_dtype=activation_dtype(precision, device), hidden_output=bool(hidden_layers),
                      sliding_window=cfg.active_sliding_window if cpu else 0,  # GPU graphs: local_window_size
                      kv_layers=cfg.kv_layer_ids, states=state_layout(cfg), kv_shapes=cfg.kv_layer_shapes)
    validation = {"gguf_requantized": dict(Counter(written.gguf_requantized.values()))} if exact_gguf else {}
    if bits:
        # The graph must compute what a torch model running the very same quantized weights (read back from the
        # data file) computes. That is checked exactly, as fp32 is, on the same graph with float activations
        # (MatMulNBits accuracy_level 0); the shipped graph's int8 activations and how far quantization moves the
        # model from its source are recorded as quality. A GPU graph (float16 activations, no int8 ones) is held as it
        # ships, once, to the same weights at float16's limit.
        untied = dataclasses.replace(cfg, tie_word_embeddings=False)

        def quantized_reference(routes=None):
            return run_layerwise(untied, QuantReadback(weights, written), prompts, graph_opts.hidden_layers,
                                 routes=routes, route_tie=route_tie)

        if follow_routes:
            exact, quantized_outputs, validation["routing"] = _against_followed_routes(
                tmp / f"{stem}.onnx", spec, providers, prompts, cfg, spill, "quantized", quantized_reference)
        else:
            quantized = quantized_reference()
            quantized_outputs = SpilledOutputs(spill, "quantized", list(zip(quantized.logits, quantized.taps)))
            del quantized
        if exact_gguf and not (written.gguf_requantized or follow_routes):  # both references: the file's values
            validation["file_weights_max_abs_diff"] = check_file_weights(source_outputs, quantized_outputs)
        if not (follow_routes or half):  # a GPU graph's float16 run is held to these weights below, at fp16's limit
            release_freed_memory()  # what the torch reference freed goes back before ONNX Runtime takes the model
            exact_path = float_activation_twin(tmp / f"{stem}.onnx")
            try:
                exact = compare(TargetSession(exact_path, spec, providers=providers), quantized_outputs, prompts)
            finally:
                exact_path.unlink()
        if not half:
            validation["quantized_reference"] = exact.as_dict()
            check(exact, f"{precision}-exact")
            stages.log(f"{stem} validation: max |diff| {exact.max_abs_diff:.2e}, top-1 agreement "
                       f"{exact.top1_agreement:.1%} over {exact.positions} positions (same {precision} weights, float "
                       "activations)")
    release_freed_memory()
    if follow_routes and not bits:  # the graph itself ran beside its router outputs
        report, _, validation["routing"] = _against_followed_routes(
            tmp / f"{stem}.onnx", spec, providers, prompts, cfg, spill, "source",
            lambda routes: run_layerwise(cfg, loaded.weights, prompts, graph_opts.hidden_layers, routes=routes,
                                         route_tie=route_tie))
    else:
        session = TargetSession(tmp / f"{stem}.onnx", spec, providers=providers)
        if bits:  # one run of the shipped graph, held to both references
            report, shipped = compare(session, source_outputs, prompts, quantized_outputs)
        else:
            report = compare(session, source_outputs, prompts)
        del session
    shutil.rmtree(spill)
    validation["source"] = report.as_dict()
    if bits and half:  # the shipped float16 graph against torch on its very weights: float16's limit
        validation["quantized_reference"] = shipped.as_dict()
        check(shipped, "fp16")
        stages.log(f"{stem} validation ({providers[0]}): max |diff| {shipped.max_abs_diff:.2e}, top-1 agreement "
                   f"{shipped.top1_agreement:.1%} over {shipped.positions} positions (same {precision} weights, "
                   f"float16 activations); {report.top1_agreement:.1%} with the unquantized source")
        report = shipped
    elif bits:
        validation["int8_activations"] = shipped.as_dict()
        stages.log(f"{stem} {precision} quality: top-1 agreement {shipped.top1_agreement:.1%} with the same weights in "
                   f"float, {report.top1_agreement:.1%} with the unquantized source")
        if shipped.top1_agreement < 0.9:
            stages.log(f"note: int8 activations change {1 - shipped.top1_agreement:.0%} of top-1 choices (expected of "
                       "random test weights, whose logits are nearly tied; a trained model shows 1-3 %)")
        report = shipped
    else:
        stages.log(f"{stem} validation: max |diff| {report.max_abs_diff:.2e}, top-1 agreement "
                   f"{report.top1_agreement:.1%} over {report.positions} positions")
    if "routing" in validation:
        stages.log(f"{stem} validation: the reference followed the graph's experts at "
                   f"{validation['routing']['followed_near_ties']} near-tied token-layers of "
                   f"{validation['routing']['token_layers']}")
    check(report, "fp16" if half else precision)
    stages.done()
    io = io_names(cfg, device)
    outputs = ["logits"] + (["hidden_states"] if hidden_layers else [])
    graph = TargetGraph(file=f"{stem}.onnx", data_file=f"{stem}.onnx.data", precision=precision,
                        inputs=(tuple(io["inputs"]) + ((ATTENTION_ROWS_INPUT,) if cpu else ())
                                + ((EXPERT_CALLS_INPUT,) if EXPERT_CALLS_INPUT in written.inputs else ())),
                        outputs=tuple(outputs),
                        hidden_layers=graph_opts.hidden_layers, hidden_size=cfg.hidden_size,
                        int4_block_size=int4_block_size if bits else 0, exact_attention=graph_opts.exact_attention,
                        device=device)
    return graph, validation


def report_gguf_forms(written, stages: Stages) -> None:
    """--precision gguf: how many weights kept the GGUF's own blocks exactly, and which did not (a type with no
    exact form: quantized to 8 bits in blocks of 32, the nearest form)."""
    requantized = written.gguf_requantized
    exact = len(written.quant_rows) - len(requantized)
    stages.log(f"gguf: {exact} weights in the file's own quantization, exactly")
    if requantized:
        types = sorted(set(requantized.values()))
        stages.log(f"gguf: {len(requantized)} weights of type {', '.join(types)} have no exact form: quantized to 8 bits "
                   f"in blocks of 32 (e.g. {next(iter(requantized))})")


def _write_bundle(tmp: Path, loaded, opts: ConvertOptions, max_context: int, providers, stages: Stages) -> Manifest:
    cfg = loaded.config
    stages.start("tokenizer")
    tok = write_tokenizer(loaded.source.path, loaded.source.kind, tmp, cfg.eos_token_ids, cfg.bos_token_id)
    stages.done()
    specs = drafter_specs(opts.drafter)
    taps = tuple(sorted(set(opts.hidden_layers).union(*(hidden_layers_for(s, loaded) for s in specs))))
    build = functools.partial(_build_graph, int4_block_size=opts.int4_block_size)
    target, validation = build(tmp, "target", loaded, opts.precision, max_context, taps, providers, stages,
                               device=opts.device)
    drafters = tuple(add_drafter(s, tmp, loaded, opts.precision, max_context, providers, stages, build,
                                 draft_vocab=opts.draft_vocab, device=opts.device) for s in specs)

    stages.start("write manifest")
    graph_files = [target.file, target.data_file] + [
        f for d in drafters for f in (d["graph"]["file"], d["graph"]["data_file"], *d.get("extra_files", ()))]
    files = {name: file_entry(tmp / name) for name in (*graph_files, *tok.files)}
    manifest = Manifest(
        model_name=loaded.source.name,
        architecture=cfg.model_type,
        model_config=cfg.to_dict(),
        target=target,
        kv=KVLayout(layers=cfg.num_layers, kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                    max_context=max_context, dtype=activation_dtype(opts.precision, opts.device),
                    layer_ids=cfg.kv_layer_ids, layer_shapes=cfg.kv_layer_shapes),
        states=state_layout(cfg),
        vocab_size=cfg.vocab_size,
        bos_token_id=tok.bos_token_id,
        # a tokenizer built from a GGUF's token list may add a special token past the model's vocabulary, which the
        # model can never emit
        stop_token_ids=tuple(i for i in tok.stop_token_ids if i < cfg.vocab_size),
        chat_template=tok.chat_template,
        tokenizer_files=tok.files,
        execution_providers=built_for(opts.device),
        files=files,
        drafters=drafters,
        provenance={
            "source": str(loaded.source.path),
            "source_kind": loaded.source.kind,
            "source_sha256": loaded.sha256,
            "specrt_version": __version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "validation": validation,
            "conversion_memory_gib": {name: p["peak_gib"] for name, p in stages.peaks.items()},
        },
    )
    (tmp / MANIFEST).write_text(manifest.to_json())
    stages.done()
    return manifest
