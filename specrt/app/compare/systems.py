"""The systems `specrt bench --compare NAME` runs beside specrt, each in its own environment (environment.py)
and worker process (workers/). Registry: SYSTEMS.

A system joins the precision groups it can run: onnxruntime-genai converts the source at fp32 and at int4 with
its own model builder; llama.cpp and llama-server (llama_server.py) run the GGUF's own quantization (beside specrt's
int4, or its gguf bundle); transformers and optimum run fp32 (beside specrt's fp32). Where the preferred group is not
being measured, a system joins the first group, so its speedup is still relative to specrt's plain decoding in the
same run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from specrt.app.compare.environment import SystemUnavailable, ensure_environment, system_dir
from specrt.app.compare.sources import TOKENIZER_FILES, gguf_quant_label, hf_folder

WORKERS = Path(__file__).parent / "workers"
PROMPT_LOOKUP_TOKENS = 10  # what llama.cpp and transformers document for prompt-lookup decoding


@dataclass
class CompareContext:
    """What a system needs to know about the model being benchmarked in one precision group."""

    bundle: Path
    source: Path | None
    source_kind: str | None  # "gguf" | "hf"
    source_sha256: str | None
    draft_source: Path | None  # an independent draft model's source, where the bundle has one
    draft_kind: str | None
    threads: int
    n_ctx: int
    log: object = print
    synth: dict | None = None  # {"lengths": [L, ...], "draft_tokens": K}: synthetic-acceptance rows wanted


@dataclass
class Variant:
    """One row: a drafter setting of a system, and the worker config that runs it."""

    drafter: str
    precision: str
    config: dict = field(default_factory=dict)


def model_key(ctx: CompareContext) -> str:
    """A short name for the source model, for the folders systems build from it."""
    import hashlib

    return (ctx.source_sha256 or hashlib.sha256(str(ctx.source).encode()).hexdigest())[:16]


def preferred(groups: list[str], want: str) -> str:
    return want if want in groups else groups[0]


class ExternalSystem:
    name = ""
    requirements: tuple[str, ...] = ()
    worker = ""

    def python(self, log) -> Path:
        return ensure_environment(self.name, self.requirements, log)

    def variants(self, group: str, groups: list[str], ctx: CompareContext, python: Path) -> list[Variant]:
        raise NotImplementedError

    @property
    def script(self) -> Path:
        return WORKERS / self.worker

    @staticmethod
    def _need_source(ctx: CompareContext) -> Path:
        if ctx.source is None or not ctx.source.exists():
            raise SystemUnavailable(f"the bundle does not record a source model that still exists ({ctx.source})")
        return ctx.source

    def _gguf_source(self, ctx: CompareContext) -> tuple[Path, str]:
        """The bundle's GGUF source and its quantization's label (Q4_K_M ...): llama.cpp's systems run the file."""
        source = self._need_source(ctx)
        if ctx.source_kind != "gguf":
            raise SystemUnavailable(f"{self.name} runs GGUF files; this bundle was converted from an HF folder")
        return source, gguf_quant_label(source)


class OrtGenai(ExternalSystem):
    """onnxruntime-genai on models its own builder converts from the same weights (fp32 or int4). Rows: plain, its
    n-gram decoding (what its docs/SpeculativeDecoding.md shows: ngram_size 4, up to 8 tokens, chained lookup,
    adaptive width from 2) and, where the bundle has an independent draft model, its draft-model decoding (its
    default fixed 4 tokens) through a composite genai_config.json naming both models."""

    name = "onnxruntime-genai"
    # its wheel requires only numpy and onnxruntime; its model builder also imports these (torch and transformers
    # are usually found in specrt's own environment, which the system's environment is layered over)
    requirements = ("onnxruntime-genai==0.18.0", "onnx-ir", "onnx", "safetensors", "torch", "transformers")
    worker = "ort_genai_worker.py"
    NGRAM = {"ngram_size": 4, "max_draft_tokens": 8, "ngram_chained_lookup": True, "min_adaptive_k": 2,
             "cooldown": False}
    DRAFT = {"max_draft_tokens": 4}

    def variants(self, group, groups, ctx, python):
        if group not in ("fp32", "int4"):
            return []
        hf = hf_folder(self._need_source(ctx), ctx.source_kind, ctx.bundle, ctx.log, ctx.source_sha256)
        out = self._build(python, hf, f"{model_key(ctx)}-{group}", group, ctx.log)
        rows = [Variant("none", group, {"model": str(out)}),
                Variant("prompt-lookup", group, {"model": str(out), "speculative": self.NGRAM})]
        if ctx.draft_source is not None and ctx.draft_source.exists() and ctx.draft_source != ctx.source:
            draft_hf = hf_folder(ctx.draft_source, ctx.draft_kind, ctx.bundle, ctx.log)
            draft = self._build(python, draft_hf, f"{_key_of(draft_hf)}-{group}", group, ctx.log)
            pair = _composite(out, draft, system_dir(self.name) / "models" / f"{out.name}+{draft.name}")
            rows.append(Variant("draft-model", group, {"model": str(pair), "speculative": self.DRAFT}))
        return rows

    def _build(self, python: Path, hf: Path, key: str, group: str, log) -> Path:
        """hf converted by the system's own model builder into the cache (once)."""
        out = system_dir(self.name) / "models" / key
        if (out / "genai_config.json").is_file():
            return out
        log(f"{self.name}: its model builder converts {hf} at {group}")
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=".build-") as tmp:
            tmp = str(Path(tmp).resolve())
            cmd = [str(python), "-m", "onnxruntime_genai.models.builder", "-i", str(Path(hf).resolve()), "-o",
                   f"{tmp}/model", "-p", group, "-e", "cpu", "-c", f"{tmp}/cache"]
            with open(out.parent / f"build-{key}.log", "w") as logf:
                # run from the build folder: `python -m` puts the working directory first on sys.path, and
                # specrt's source tree (kernels/, models/) would shadow packages the builder imports
                proc = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT, cwd=tmp)
            if proc.returncode != 0:
                raise SystemUnavailable(f"its model builder failed (log: {out.parent / f'build-{key}.log'})")
            shutil.rmtree(f"{tmp}/cache", ignore_errors=True)
            os.replace(f"{tmp}/model", out)
        return out


def _composite(target: Path, draft: Path, out: Path) -> Path:
    """A model folder onnxruntime-genai runs with draft-model decoding: the target's files and config, plus the
    draft's decoder block as model.draft (its files linked under draft/; paths are relative to the folder)."""
    import json

    if (out / "genai_config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".pair-") as tmp:
        root = Path(tmp) / "pair"
        (root / "draft").mkdir(parents=True)
        for folder, dest in ((target, root), (draft, root / "draft")):
            for f in folder.iterdir():
                if f.is_file() and f.name != "genai_config.json":
                    try:
                        os.link(f, dest / f.name)
                    except OSError:  # a file system without hard links
                        shutil.copyfile(f, dest / f.name)
        config = json.loads((target / "genai_config.json").read_text())
        draft_block = json.loads((draft / "genai_config.json").read_text())["model"]["decoder"]
        config["model"]["draft"] = {**draft_block, "filename": f"draft/{draft_block['filename']}"}
        (root / "genai_config.json").write_text(json.dumps(config, indent=2))
        os.replace(root, out)
    return out


LLAMA_CPP_REQUIREMENTS = ("llama-cpp-python==0.3.36",)  # builds llama.cpp from source on first install (minutes)
# x86 instruction sets llama.cpp's CMake can enable one by one: /proc/cpuinfo flag -> option
GGML_ISA_OPTIONS = (("avx", "GGML_AVX"), ("avx2", "GGML_AVX2"), ("bmi2", "GGML_BMI2"), ("fma", "GGML_FMA"),
                    ("f16c", "GGML_F16C"), ("avx_vnni", "GGML_AVX_VNNI"), ("avx512f", "GGML_AVX512"),
                    ("avx512vbmi", "GGML_AVX512_VBMI"), ("avx512_vnni", "GGML_AVX512_VNNI"),
                    ("avx512_bf16", "GGML_AVX512_BF16"))


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def llama_cpp_build_env(flags: set[str] | None = None) -> dict[str, str]:
    """How llama.cpp is compiled here. Its default (-march=native) emits AMX tile instructions on a CPU that
    advertises AMX, and where the process is not granted AMX's state (a VM, a container, an older kernel) they trap
    at the first matrix multiply (SIGILL). On such CPUs: every other instruction set the CPU has, AMX off."""
    flags = cpu_flags() if flags is None else flags
    if not any(f.startswith("amx") for f in flags):
        return {}
    options = ["-DGGML_NATIVE=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    options += [f"-D{option}=ON" for flag, option in GGML_ISA_OPTIONS if flag in flags]
    return {"CMAKE_ARGS": " ".join(options)}


def llama_cpp_python(log) -> Path:
    """The Python of llama.cpp's environment (llama-cpp-python, built for this CPU as llama_cpp_build_env says)."""
    return ensure_environment("llama.cpp", LLAMA_CPP_REQUIREMENTS, log, build_env=llama_cpp_build_env())


class LlamaCpp(ExternalSystem):
    name = "llama.cpp"
    requirements = LLAMA_CPP_REQUIREMENTS
    worker = "llama_cpp_worker.py"

    def python(self, log) -> Path:
        return llama_cpp_python(log)

    def variants(self, group, groups, ctx, python):
        if group != preferred(groups, "int4"):
            return []
        source, label = self._gguf_source(ctx)
        base = {"model": str(source), "threads": ctx.threads, "n_ctx": ctx.n_ctx}
        return [Variant("none", label, {**base, "prompt_lookup": 0}),
                Variant("prompt-lookup", label, {**base, "prompt_lookup": PROMPT_LOOKUP_TOKENS})]


class Transformers(ExternalSystem):
    name = "transformers"
    requirements = ()  # the transformers and torch specrt convert already installed
    worker = "hf_generate_worker.py"

    def variants(self, group, groups, ctx, python):
        if group != preferred(groups, "fp32"):
            return []
        hf = hf_folder(self._need_source(ctx), ctx.source_kind, ctx.bundle, ctx.log, ctx.source_sha256)
        base = {"model": str(hf), "backend": "transformers", "threads": ctx.threads}
        rows = [Variant("none", "fp32", {**base, "prompt_lookup": 0}),
                Variant("prompt-lookup", "fp32", {**base, "prompt_lookup": PROMPT_LOOKUP_TOKENS})]
        if ctx.draft_source is not None and ctx.draft_source.exists() and ctx.draft_source != ctx.source:
            draft = hf_folder(ctx.draft_source, ctx.draft_kind, ctx.bundle, ctx.log)
            rows.append(Variant("assisted", "fp32", {**base, "prompt_lookup": 0, "assistant": str(draft)}))
        return rows


class Optimum(ExternalSystem):
    name = "optimum"
    requirements = ("optimum-onnx==0.1.0",)
    worker = "hf_generate_worker.py"

    def variants(self, group, groups, ctx, python):
        if group != preferred(groups, "fp32"):
            return []
        hf = hf_folder(self._need_source(ctx), ctx.source_kind, ctx.bundle, ctx.log, ctx.source_sha256)
        export = system_dir(self.name) / "models" / model_key(ctx)
        export.parent.mkdir(parents=True, exist_ok=True)
        return [Variant("none", "fp32", {"model": str(hf), "backend": "optimum", "threads": ctx.threads,
                                         "prompt_lookup": 0, "export_dir": str(export)})]


class OpenVino(ExternalSystem):
    """OpenVINO GenAI on IR folders optimum-intel exports from the same weights: int4 (its asymmetric int4, group
    32, every layer), int8 (its asymmetric per-channel int8) or fp32. Rows: plain, prompt lookup, the bundle's draft
    model and its EAGLE-3 head (exported with `specrt export-drafter --for openvino`). In the fp32 group the rows
    compute in f32 with an f32 KV cache; one more plain row keeps OpenVINO's default, which on a CPU with bf16
    computes in bf16 with an f16 KV cache (as the int4 and int8 groups' rows do)."""

    name = "openvino"
    # optimum-intel requires torchvision, which PyPI builds against a CUDA torch: torch pinned to specrt's own
    # (taken from the layered environment) makes pip pick the matching torchvision, removed again afterwards since
    # it does not import beside the CPU build; its EAGLE-3 model file (loaded as remote code) imports einops
    requirements = ("openvino-genai==2026.4.1.0", "optimum-intel==2.2.0", "einops", "diffusers", "torch==2.13.0")
    remove = ("torchvision",)
    worker = "openvino_worker.py"
    STRICT_F32 = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
    WEIGHTS = {"int4": ["--weight-format", "int4", "--group-size", "32", "--ratio", "1.0"],
               "int8": ["--weight-format", "int8"], "fp32": ["--weight-format", "fp32"]}  # optimum-cli's options
    LABELS = {"int4": "int4 asym g32", "int8": "int8 asym per-channel", "fp32": "fp32"}

    def python(self, log) -> Path:
        return ensure_environment(self.name, self.requirements, log, remove=self.remove)

    def variants(self, group, groups, ctx, python):
        if group not in self.WEIGHTS:
            return []
        hf = hf_folder(self._need_source(ctx), ctx.source_kind, ctx.bundle, ctx.log, ctx.source_sha256)
        target = self._export(python, hf, f"{model_key(ctx)}-{group}", group, ctx.log)
        strict = self.STRICT_F32 if group == "fp32" else {}
        base = {"model": str(target), "properties": {"INFERENCE_NUM_THREADS": ctx.threads, **strict}}
        label = self.LABELS[group]
        rows = [Variant("none", label, {**base, "mode": "none"})]
        if group == "fp32":
            # the precisions it then computes in depend on the CPU (bf16 and an f16 KV cache where it has bf16):
            # the worker reports them in its version
            rows.append(Variant("none", "fp32 (default hint)",
                                {**base, "mode": "none", "properties": {"INFERENCE_NUM_THREADS": ctx.threads}}))
        rows.append(Variant("prompt-lookup", label, {**base, "mode": "prompt-lookup"}))
        if ctx.draft_source is not None and ctx.draft_source.exists() and ctx.draft_source != ctx.source:
            draft_hf = hf_folder(ctx.draft_source, ctx.draft_kind, ctx.bundle, ctx.log)
            draft = self._export(python, draft_hf, f"{_key_of(draft_hf)}-{group}", group, ctx.log)
            rows.append(Variant("draft-model", label, {**base, "mode": "draft-model", "draft": str(draft)}))
        for kind, head in self._heads(python, ctx, hf, group):
            rows.append(Variant(kind, label, {**base, "mode": "eagle3", "draft": str(head)}))
        return rows

    def _export(self, python: Path, hf: Path, key: str, group: str, log, remote_code: bool = False) -> Path:
        """hf exported by optimum-cli into the cache (once)."""
        out = system_dir(self.name) / "models" / key
        if (out / "openvino_model.xml").is_file():
            return out
        log(f"{self.name}: optimum-intel exports {hf} at {group}")
        out.parent.mkdir(parents=True, exist_ok=True)
        weights = self.WEIGHTS[group]
        if not (python.parent / "optimum-cli").is_file():
            raise SystemUnavailable(f"its environment has no optimum-cli ({python.parent})")
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=".export-") as tmp:
            cmd = [str(python.parent / "optimum-cli"), "export", "openvino", "--model", str(Path(hf).resolve()),
                   "--task", "text-generation-with-past", *weights, *(["--trust-remote-code"] if remote_code else []),
                   f"{tmp}/ir"]
            with open(out.parent / f"export-{key}.log", "w") as logf:
                # from the temporary folder: specrt's source tree on the path would shadow packages it imports
                proc = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT, cwd=tmp)
            if proc.returncode != 0 or not Path(f"{tmp}/ir/openvino_model.xml").is_file():
                raise SystemUnavailable(f"optimum-intel's export failed (log: {out.parent / f'export-{key}.log'})")
            os.replace(f"{tmp}/ir", out)
        return out

    def _heads(self, python: Path, ctx: CompareContext, hf: Path, group: str) -> list[tuple[str, Path]]:
        """The bundle's drafters that `specrt export-drafter --for openvino` writes (an EAGLE-3 head), each as an
        OpenVINO draft model: [(kind, IR folder)]."""
        from specrt import drafter_kinds
        from specrt.bundle import load_bundle
        from specrt.convert.export_drafter import NotForEngine
        from specrt.errors import SpecrtError

        manifest = load_bundle(ctx.bundle, check_hashes=False)
        heads = []
        for entry in manifest.drafters:
            spec = drafter_kinds.KINDS.get(entry.kind)
            if spec is None or spec.engine_writer is None or not (Path(entry.source) / "config.json").is_file():
                continue
            try:
                heads.append((entry.kind, self._head(python, ctx, hf, group, entry, manifest)))
            except NotForEngine:
                continue
            except SpecrtError as exc:  # a head it cannot take (norm_before_residual...): the other rows still run
                ctx.log(f"{self.name}: no {entry.kind} row: {exc}")
        return heads

    def _head(self, python: Path, ctx: CompareContext, hf: Path, group: str, entry, manifest) -> Path:
        from specrt.convert.export_drafter import SET_HIDDEN_LAYERS, export
        from specrt.models.config import ModelConfig
        from specrt.models.eagle3 import load_eagle3_checkpoint

        source = Path(entry.source)
        key = f"{_key_of(source)}-{entry.kind}-{group}"
        out = system_dir(self.name) / "models" / key
        if (out / "openvino_model.xml").is_file():
            return out
        with tempfile.TemporaryDirectory(prefix="specrt-ov-head-") as tmp:
            folder = Path(tmp) / "head"
            export(source, "openvino", folder, target=str(hf), log=ctx.log)
            for name in TOKENIZER_FILES:  # the exporter writes the draft's tokenizer IR from these
                if (hf / name).is_file():
                    shutil.copyfile(hf / name, folder / name)
            head = self._export(python, folder, key, group, ctx.log, remote_code=True)
        cfg, _ = load_eagle3_checkpoint(source, ModelConfig.from_dict(manifest.model_config))
        layers = ",".join(str(k) for k in cfg.aux_layers)
        proc = subprocess.run([str(python), "-c", SET_HIDDEN_LAYERS, str(head), layers], capture_output=True,
                              text=True, cwd=tempfile.gettempdir())
        if proc.returncode != 0:
            shutil.rmtree(head, ignore_errors=True)
            raise SystemUnavailable(f"could not name the head's layers in its IR: {proc.stderr.strip()[-300:]}")
        return head


def _key_of(path: Path) -> str:
    import hashlib

    return hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:16]


class LlamaServer(ExternalSystem):
    """llama-server (compare/llama_server.py builds it): plain, --spec-default, and a draft model where the
    bundle's draft model came from a GGUF (with it, a --spec-synth-len row per bench --synth-len)."""

    name = "llama-server"
    worker = "llama_server_worker.py"

    def python(self, log) -> Path:
        import sys

        from specrt.app.compare.llama_server import server_binary

        self.binary = server_binary(log)
        return Path(sys.executable)  # the worker needs the standard library only

    def variants(self, group, groups, ctx, python):
        if group != preferred(groups, "int4"):
            return []
        source, label = self._gguf_source(ctx)
        base = {"binary": str(self.binary), "model": str(source), "threads": ctx.threads, "n_ctx": ctx.n_ctx}
        rows = [Variant("none", label, {**base, "args": []}),
                Variant("spec-default", label, {**base, "args": ["--spec-default"]})]
        has_draft = ctx.draft_kind == "gguf" and ctx.draft_source is not None and ctx.draft_source.exists()
        if has_draft:
            rows.append(Variant("draft-simple", label,
                                {**base, "args": ["--spec-type", "draft-simple", "-md", str(ctx.draft_source)]}))
        for length in (ctx.synth or {}).get("lengths", ()):
            # its synthetic acceptance drafts with the draft model (paying its cost) and accepts at random
            if not has_draft:
                raise SystemUnavailable("its synthetic-acceptance rows (--spec-synth-len) draft with a draft model: "
                                        "convert the bundle with --drafter draft-model:DRAFT.gguf")
            rows.append(Variant(f"synth-{length:g}", label, {**base, "args": [
                "--spec-type", "draft-simple", "-md", str(ctx.draft_source), "--spec-synth-len", f"{length:g}",
                "--spec-draft-n-max", str(ctx.synth["draft_tokens"])]}))
        return rows


SYSTEMS: dict[str, ExternalSystem] = {s.name: s for s in (OrtGenai(), LlamaCpp(), LlamaServer(), Transformers(),
                                                           Optimum(), OpenVino())}
