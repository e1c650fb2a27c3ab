"""The engine an app embeds: a loaded bundle, its tokenizer, one target session and the decode loop.

`Engine.generate(prompt or messages, params)` returns a Generation: iterate it for text chunks, then read
`.result` (text, token ids, finish reason, stats). The KV cache is reused across calls by prefix: the
engine remembers which tokens its cache holds, rolls back to the longest common prefix with the new
prompt and prefills only the rest, so a chat's next turn prefills only the new turn.

One generation at a time per engine: a second caller waits on the engine's lock (or gets EngineBusyError
with wait=False); state is never shared half-way. Importing this module imports no torch/transformers.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import numpy as np

from specrt.bundle import Manifest
from specrt.errors import SpecrtError
from specrt.runtime.chat import ChatSession
from specrt.runtime.decode_target import EngineTarget
from specrt.runtime.detokenize import StreamDecoder
from specrt.runtime.drafter import Drafter, TargetTaps, TargetView, common_prefix
from specrt.runtime.generation import Generation, GenerationResult, GenerationStats
from specrt.runtime.pays import PaysMemory
from specrt.runtime.prompting import Prepared, Prompting, Request
from specrt.runtime.sampling import SamplingParams
from specrt.runtime.speculative import GrammarOnly, PlainStepper, SpeculativeStepper
from specrt.runtime.target_session import ContextOverflowError, TargetSession, TargetSpec
from specrt.runtime.tokenizer import BundleTokenizer

PREFILL_CHUNK = 256  # prompt tokens per target call while prefilling (bounds the activation memory)


class EngineBusyError(SpecrtError):
    """Another generation is running on this engine."""


def _kernels_available() -> bool:
    try:
        import torch  # noqa: F401
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


class StopStringFilter:
    """Holds back text that may be the start of a stop string; finds the first complete one."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.sent = 0

    def feed(self, chunk: str) -> tuple[str, bool]:
        """Returns (text safe to emit, whether a stop string was found)."""
        self.text += chunk
        cut = min((i for i in (self.text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            out = self.text[self.sent:cut]
            self.text = self.text[:cut]
            self.sent = cut
            return out, True
        safe = max(self.sent, len(self.text) - self.hold)
        out = self.text[self.sent:safe]
        self.sent = safe
        return out, False

    def flush(self) -> str:
        out = self.text[self.sent:]
        self.sent = len(self.text)
        return out


class Engine:
    def __init__(self, bundle_dir: Path, manifest: Manifest, providers: list[str], threads: int = 0,
                 drafter=None, max_draft: int = 4, adaptive: bool = True, batch_invariant: bool = False,
                 draft_length: int | None = None):
        self.bundle_dir, self.manifest, self.providers = Path(bundle_dir), manifest, providers
        tokenizer = BundleTokenizer(self.bundle_dir, manifest.chat_template)
        window = manifest.model_config["sliding_window"] if "sliding_attention_bias" in manifest.target.inputs else 0
        spec = TargetSpec(manifest.kv.layers, manifest.kv.kv_heads, manifest.kv.head_dim, manifest.kv.max_context,
                          manifest.vocab_size, kv_dtype=manifest.kv.dtype,
                          hidden_output="hidden_states" in manifest.target.outputs, sliding_window=window,
                          hidden_width=len(manifest.target.hidden_layers) * manifest.target.hidden_size,
                          kv_layers=manifest.kv.layer_ids, states=manifest.states, kv_shapes=manifest.kv.layer_shapes)
        self.target = TargetSession(self.bundle_dir / manifest.target.file, spec, providers, threads=threads)
        self.batch_invariant = batch_invariant
        # verify with the Triton kernel on the logits where they are (GPU providers, with torch + triton)
        self.device_verify = self.target.device != "cpu" and _kernels_available()
        self.max_context = manifest.kv.max_context
        # the target's hidden-state taps per cache slot (what feature-reading drafters see), if it has them
        self.taps = TargetTaps(manifest.target.hidden_layers, manifest.target.hidden_size,
                               self.max_context) if spec.hidden_output else None
        self.stop_ids = frozenset(manifest.stop_token_ids)
        self._cached: list[int] = []  # token ids whose KV the target cache holds, in order
        self._lock = threading.Lock()
        self.drafter = drafter  # default drafter of generate(); None: plain decoding
        self.max_draft = max_draft
        self.adaptive = adaptive  # let measured costs and acceptance pick the draft length (down to none)
        # a fixed number of draft tokens per target call (adaptive off, no confidence cut), as engines that
        # draft a fixed k do; None: the adaptive controller chooses
        self.draft_length = draft_length
        self.pays = PaysMemory()  # calibrated call costs and the drafters' records across requests
        # prompts, constraints and the reading of answers (chat template, tools, thought)
        self.prompting = Prompting(tokenizer, self.max_context, self.bundle_dir, manifest.vocab_size, self.stop_ids)
        self.grammar_drafts = True  # under a constraint, the tokens the grammar forces lead each draft

    # -- prompts (runtime/prompting.py) --------------------------------------------------------
    tokenizer = property(lambda self: self.prompting.tokenizer,
                         lambda self, value: setattr(self.prompting, "tokenizer", value))
    # reasoning models: thinking (Qwen3, Qwen3.5: the template's enable_thinking) and reasoning_effort (gpt-oss)
    # set for every prompt; None: the template's default
    thinking = property(lambda self: self.prompting.thinking,
                        lambda self, value: setattr(self.prompting, "thinking", value))
    reasoning_effort = property(lambda self: self.prompting.reasoning_effort,
                                lambda self, value: setattr(self.prompting, "reasoning_effort", value))

    def template_variables(self, thinking: bool | None = None, reasoning_effort: str | None = None) -> dict:
        return self.prompting.template_variables(thinking, reasoning_effort)

    def prompt_ids(self, prompt, system: str | None = None, raw: bool = False, thinking: bool | None = None,
                   reasoning_effort: str | None = None) -> list[int]:
        """Token ids of a prompt: a string (through the chat template unless raw) or a message list. thinking,
        reasoning_effort: this prompt's enable_thinking / reasoning_effort (None: the engine's)."""
        return self.prompting.prompt_ids(prompt, system, raw, thinking, reasoning_effort)

    def tool_prompt_ids(self, prompt, tools, tool_choice=None, parallel_tool_calls: bool = True,
                        system: str | None = None, thinking: bool | None = None,
                        reasoning_effort: str | None = None) -> list[int]:
        """Token ids of a prompt as a request with these tools renders it (generate's, for a caller that checks the
        length first and hands generate the ids)."""
        return self.prompting.tool_prompt_ids(prompt, tools, tool_choice, parallel_tool_calls, system, thinking,
                                              reasoning_effort)

    def reasoning_open(self, messages: list[dict]) -> bool:
        return self.prompting.reasoning_open(messages)

    def answer_parser(self, messages: list[dict], thinking: bool | None = None, reasoning_effort: str | None = None,
                      inline: bool = False):
        return self.prompting.answer_parser(messages, thinking, reasoning_effort, inline)

    def harmony_parser(self, messages: list[dict], thinking: bool | None = None,
                       reasoning_effort: str | None = None):
        return self.prompting.harmony_parser(messages, thinking, reasoning_effort)

    def output_constraint(self, response_format: dict, params: SamplingParams | None = None):
        """A fresh grammar state for one generation's output (ConstraintError for a format it cannot compile)."""
        return self.prompting.output_constraint(response_format)

    # -- generation ----------------------------------------------------------------------------
    def generate(self, prompt, params: SamplingParams | None = None, *, wait: bool = True, drafter="default",
                 ids: list[int] | None = None, **options) -> Generation:
        """prompt: a Request (runtime/prompting.py), or its prompt, with params and the Request's other fields
        (system, raw, response_format, tools, tool_choice, parallel_tool_calls, thinking, reasoning_effort,
        reasoning_inline) as keywords. drafter: "default" (the engine's), None (plain decoding) or a Drafter
        (runtime/drafter.py). ids: the prompt's token ids where the caller already has them (prompt_ids or
        tool_prompt_ids of the same prompt): not encoded again."""
        if not (drafter is None or isinstance(drafter, Drafter) or (isinstance(drafter, str) and drafter == "default")):
            raise SpecrtError(f"generate(drafter=...) takes \"default\", None or a Drafter, not {drafter!r:.40}: a drafter "
                              "by name is chosen when loading (specrt.load(model, drafter=NAME))")
        request = prompt if isinstance(prompt, Request) else Request(prompt, params or SamplingParams(), **options)
        ready = self.prompting.prepare(request, ids)
        if len(ready.ids) >= self.max_context:
            raise ContextOverflowError(
                f"prompt has {len(ready.ids)} tokens; the bundle's context is {self.max_context} (convert with a "
                "larger --max-context)")
        gen = Generation(iter(()))
        gen._chunks = self._run(ready, gen, wait, self.drafter if drafter == "default" else drafter)
        return gen

    def _run(self, ready: Prepared, gen: Generation, wait: bool, drafter):
        if not self._lock.acquire(blocking=wait):
            raise EngineBusyError("another generation is running on this engine")
        try:
            yield from self._decode(ready.ids, ready.params, gen, drafter, ready.constraint, ready.keep_special)
        finally:
            self._lock.release()
        if ready.plan is not None:  # the calls made, the thought, and whatever else was said
            said = self.prompting.read(gen.result.text, ready)
            gen.result = dataclasses.replace(gen.result, text=said.content, tool_calls=said.calls or None,
                                             reasoning=said.reasoning or None,
                                             finish_reason="tool_calls" if said.calls else gen.result.finish_reason)

    def _prefill(self, ids: list[int]) -> tuple[np.ndarray, int]:
        """Bring the cache to hold ids; returns (logits of the last id [V], reused tokens)."""
        reused = common_prefix(self._cached, ids)
        reused = min(reused, len(ids) - 1)  # the last prompt token is always fed: its logits are needed
        # a recurrent target restores only some lengths (the last call's prefixes, the last prompt's end, 0)
        reused = self.target.reachable(reused)
        self.target.rollback(reused)
        self._cached = self._cached[:reused]
        # a recurrent target keeps a snapshot of its state before the prompt's last token: the next chat turn (or the
        # same prompt again) starts from there
        end = len(ids) - 1 if self.target.recurrent else len(ids)
        for lo in range(reused, end, PREFILL_CHUNK):
            logits = self.feed(ids[lo:min(lo + PREFILL_CHUNK, end)])
        if end < len(ids):
            self.target.snapshot()
            logits = self.feed(ids[end:])
        return logits[-1], reused

    # -- what steppers use ----------------------------------------------------------------------
    def cached_tokens(self) -> list[int]:
        return self._cached

    def feed(self, tokens: list[int], position_ids=None, attention_bias=None, device_logits: bool = False):
        """Run the target on tokens after the cache; returns logits [len(tokens), V] (numpy, or a torch tensor
        where the session runs with device_logits)."""
        start = self.target.length
        out = self.target.forward(np.array([tokens], dtype=np.int64), position_ids, attention_bias, device_logits)
        if self.taps is not None:
            out, hidden = out
            self.taps.write(start, hidden[0])
        self._cached.extend(tokens)
        return out[0]

    def commit(self, base: int, accepted: list[int], draft) -> None:
        """After verifying [pending, *draft] at slot base: keep pending and the accepted path only."""
        keep = base + 1 + len(accepted)
        path = [base + 1 + i for i in accepted]
        self.target.compact(base + 1, path)
        if self.taps is not None:
            self.taps.keep_path(base + 1, path)
        self.target.rollback(keep)
        self._cached[base + 1:] = [int(draft.tokens[i]) for i in accepted]

    def target_view(self) -> TargetView:
        """What drafters that read hidden states see of the target (SpecrtError when the graph has no taps)."""
        if self.taps is None:
            raise SpecrtError("this bundle's target graph has no hidden-state outputs, which this drafter reads "
                              "(convert the model with the drafter)")
        return TargetView(self.taps, self.target)

    @property
    def draft_limit(self) -> int | None:
        """The most draft tokens one verification may take: a recurrent target replays at most its capture
        capacity of a call's tokens (the pending token and capacity - 1 drafts); None: no limit."""
        return self.manifest.states.capacity - 1 if self.manifest.states is not None else None

    def _stepper(self, params: SamplingParams, drafter: Drafter | None, constraint=None):
        target = EngineTarget(self)  # what the stepper sees of the engine (runtime/decode_target.py)
        if drafter is None and constraint is not None and self.grammar_drafts:
            return SpeculativeStepper(target, params, GrammarOnly(), max_draft=1, adaptive=False,
                                      constraint=constraint)
        if drafter is None:
            return PlainStepper(target, params, constraint)
        limit = self.draft_limit or 1 << 30
        if self.draft_length is not None:
            return SpeculativeStepper(target, params, drafter, max_draft=min(self.draft_length, limit),
                                      adaptive=False, constraint=constraint)
        max_draft = drafter.max_draft or self.max_draft  # a tree drafter asks for more nodes
        return SpeculativeStepper(target, params, drafter, max_draft=min(max_draft, limit), adaptive=self.adaptive,
                                  constraint=constraint)

    def _decode(self, ids: list[int], params: SamplingParams, gen: Generation, drafter=None, constraint=None,
                keep_special: bool = False):
        t0 = time.perf_counter()
        stop_ids = self.stop_ids if params.stop_token_ids is None else frozenset(params.stop_token_ids)
        logits, reused = self._prefill(ids)
        if drafter is not None:
            drafter.prefill(ids)  # a draft model reads the prompt too: part of the time to first token
        stepper = self._stepper(params, drafter, constraint)  # calibrates the call costs on first use: before the first token
        t_first = time.perf_counter()
        decoder = StreamDecoder(self.tokenizer.tok, skip_special_tokens=not (self.tokenizer.harmony or keep_special))
        stops = StopStringFilter(params.stop)
        out: list[int] = []
        finish, hit, stop_token = "length", False, False
        new_tokens = stepper.first(logits)
        while True:
            for token in new_tokens:
                if token in stop_ids:
                    finish, stop_token = "stop", True
                    break
                out.append(token)
                text, hit = stops.feed(decoder.push(token))
                if text:
                    yield text
                if hit or len(out) >= params.max_new_tokens:
                    break
            if finish == "stop" or hit or len(out) >= params.max_new_tokens:
                break
            budget = min(params.max_new_tokens - len(out), self.max_context - len(self._cached) - 1)
            if budget < 1:
                break
            new_tokens = stepper.step(budget)
        if hit:
            finish = "stop"
        else:
            tail, hit = stops.feed(decoder.finish())
            tail += "" if hit else stops.flush()
            finish = "stop" if hit else finish
            if tail:
                yield tail
        elapsed = time.perf_counter() - t_first
        stepper.finish()
        if drafter is not None:
            drafter.remember(ids + out)  # drafters that learn across requests (ngram:pool) keep the conversation
        calls = stepper.stats.target_calls + 1  # the prefill call produced the first token
        # tokens the target calls produced: the output, plus the stop token that ended it (not shown)
        produced = len(out) + int(stop_token)
        stats = GenerationStats(
            new_tokens=len(out), prompt_tokens=len(ids), reused_tokens=reused, target_calls=calls,
            mean_accepted=produced / calls,
            tokens_per_second=len(out) / elapsed if elapsed > 0 else 0.0,
            prefill_seconds=t_first - t0, drafter=stepper.name,
            acceptance_by_position=[a / d for a, d in zip(stepper.stats.accepted_by_position,
                                                          stepper.stats.drafted_by_position)],
            drafted_by_position=list(stepper.stats.drafted_by_position),
            accepted_by_position=list(stepper.stats.accepted_by_position),
            draft_seconds=stepper.stats.draft_seconds, verify_seconds=stepper.stats.verify_seconds,
            drafts_by_drafter=dict(stepper.stats.drafts_by_drafter),
            forced_drafted=stepper.stats.forced_drafted, forced_accepted=stepper.stats.forced_accepted,
        )
        gen.result = GenerationResult(stops.text, out, finish, stats)

    @property
    def rows_invariant(self) -> bool:
        """The graph can round a token the same in a call of any number of tokens without padding the calls: its
        attention takes attention_min_rows (convert/attention_rows.py) and its MatMulNBits blocks hold 32 weights or
        fewer (larger blocks compute the last row of an odd count alone)."""
        return self.target.has_attention_rows and self.manifest.target.int4_block_size <= 32

    @property
    def batch_invariant(self) -> bool:
        return self._batch_invariant

    @batch_invariant.setter
    def batch_invariant(self, on: bool) -> None:
        """Output independent of how tokens are grouped into calls (speculative == plain token for token). On a
        rows-invariant graph one-token calls run their attention on two rows, on CPU graphs at head sizes above 128 in
        an exact form (a call then costs 1.1-1.7x a plain one at head size 256, growing with the context; at 64
        0.93-1.13x: docs/performance.md, "Losslessness and batch-invariant calls"); otherwise every target call feeds >= 2 rows
        (~1.05-1.3x), and graphs quantized in blocks larger than 32 weights feed an even number of rows. MoE graphs
        run each token's experts in a call of their own (a verification then costs about one token's MoE time per
        token: convert/moe_graph.py)."""
        if on and self.manifest.target.device != "cpu":
            raise SpecrtError(f"batch-invariant mode is not available on a bundle built for {self.manifest.target.device}"
                              ": its exactness is the CPU graph's (convert the model without --device for it)")
        self._batch_invariant = on
        self.target.experts_token_by_token = on
        pad = on and not self.rows_invariant
        # the attention's input also switches on its call-invariant form (convert/exact_attention.py): on with the
        # calls padded too, where padding the attention alone would not do
        self.target.attention_min_rows = 2 if on and self.target.has_attention_rows else 1
        self.target.min_rows = 2 if pad else 1
        self.target.even_rows = pad and self.manifest.target.int4_block_size > 32

    def reset(self) -> None:
        """Forget the cached conversation (the next prompt is prefilled whole)."""
        with self._lock:
            self._cached = []
            self.target.reset()

    def chat(self, system: str | None = None) -> ChatSession:
        return ChatSession(self, system)
