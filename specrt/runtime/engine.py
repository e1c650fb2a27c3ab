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
from specrt.runtime.reasoning import GEMMA_CHANNEL
from specrt.runtime.sampling import SamplingParams
from specrt.runtime.speculative import GrammarOnly, PlainStepper, SpeculativeStepper
from specrt.runtime.target_session import ContextOverflowError, TargetSession, TargetSpec
from specrt.runtime.tokenizer import BundleTokenizer, PromptError

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
        self.tokenizer = BundleTokenizer(self.bundle_dir, manifest.chat_template)
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
        # reasoning models (Qwen3, Qwen3.5): True / False sets the template's enable_thinking; None: its default
        self.thinking: bool | None = None
        # gpt-oss: "low" | "medium" | "high" sets the template's reasoning_effort; None: its default
        self.reasoning_effort: str | None = None
        self._grammar_tokenizer = None  # the tokenizer as the grammar engine reads it (runtime/constraint.py)
        self.grammar_drafts = True  # under a constraint, the tokens the grammar forces lead each draft

    # -- prompts -------------------------------------------------------------------------------
    def template_variables(self, thinking: bool | None = None, reasoning_effort: str | None = None) -> dict:
        """The chat template's reasoning variables for a prompt: enable_thinking and reasoning_effort where set
        (for the prompt, else on the engine)."""
        thinking = self.thinking if thinking is None else thinking
        effort = self.reasoning_effort if reasoning_effort is None else reasoning_effort
        return {**({} if thinking is None else {"enable_thinking": thinking}),
                **({} if effort is None else {"reasoning_effort": effort})}

    def prompt_ids(self, prompt, system: str | None = None, raw: bool = False, thinking: bool | None = None,
                   reasoning_effort: str | None = None) -> list[int]:
        """Token ids of a prompt: a string (through the chat template unless raw) or a message list. thinking,
        reasoning_effort: this prompt's enable_thinking / reasoning_effort (None: the engine's)."""
        if isinstance(prompt, str):
            if not prompt.strip():
                raise PromptError("empty prompt")
            if raw:
                return self._encode(prompt)
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        else:
            messages = list(prompt)
        if self.tokenizer.harmony:  # gpt-oss's template reads an earlier turn's thought as `thinking`
            messages = [{**m, "thinking": m["reasoning_content"]} if m.get("reasoning_content") else m
                        for m in messages]
        variables = self.template_variables(thinking, reasoning_effort)
        return self._encode(self.tokenizer.render(messages, add_generation_prompt=True, variables=variables))

    def reasoning_open(self, messages: list[dict]) -> bool:
        """The chat template leaves a reasoning block open for the answer (Qwen3.5 with thinking on ends the prompt
        with <think>): the answer starts with the model's reasoning."""
        variables = self.template_variables()
        try:
            text = self.tokenizer.render(list(messages), add_generation_prompt=True, variables=variables)
        except SpecrtError:
            return False
        return text.rfind("<think>") > text.rfind("</think>")

    @property
    def thought_style(self):
        """The chat template's thought markers (runtime/reasoning.py), or None."""
        from specrt.runtime.reasoning import style_of

        return style_of(self.tokenizer.template_source)

    def answer_parser(self, messages: list[dict], thinking: bool | None = None, reasoning_effort: str | None = None,
                      inline: bool = False):
        """A parser of the answer's thought and text, fed as it streams (pieces whose `reasoning` tells them apart):
        gpt-oss's channels (harmony_parser), a `<think>` or Gemma 4 thought channel (runtime/reasoning.py
        ThoughtParser, inside the thought from the start where the prompt leaves one open); None for a template
        that writes no thought. inline (reasoning_format none): the thought stays in the text (InlineParser)."""
        from specrt.runtime.reasoning import InlineParser, ThoughtParser, prompt_leaves_open

        if self.tokenizer.harmony:
            parser = self.harmony_parser(messages, thinking, reasoning_effort)
            return InlineParser(inner=parser) if inline else parser
        style = self.thought_style
        if style is None:
            return None
        variables = self.template_variables(thinking, reasoning_effort)
        prompt = self.tokenizer.render(list(messages), add_generation_prompt=True, variables=variables)
        open_thought = prompt_leaves_open(style, prompt)
        if inline:
            return InlineParser(style.open + "\n" if open_thought else "")
        return ThoughtParser(style, open_thought)

    def harmony_parser(self, messages: list[dict], thinking: bool | None = None,
                       reasoning_effort: str | None = None):
        """For a harmony bundle (gpt-oss), a parser of the answer's channels that starts where the prompt, rendered
        with these template variables, leaves off (inside the assistant's header); None for other bundles."""
        if not self.tokenizer.harmony:
            return None
        from specrt.runtime.harmony import START, HarmonyParser

        variables = self.template_variables(thinking, reasoning_effort)
        text = self.tokenizer.render(list(messages), add_generation_prompt=True, variables=variables)
        if START not in text:  # a template that opens no message: the answer starts with its own header
            return HarmonyParser(in_header=True)
        parser = HarmonyParser(in_header=False)
        parser.feed(text[text.rfind(START):])
        parser.pending = ""
        return parser

    def _encode(self, text: str) -> list[int]:
        """Token ids of text; a text too long to fit the context whatever its tokens (more characters than the
        context times the longest token's) is refused before the tokenizer spends memory on it."""
        limit = self.max_context * self.tokenizer.max_token_chars
        if len(text) > limit:
            raise ContextOverflowError(f"the prompt has {len(text)} characters, more than the {self.max_context} "
                                       f"tokens of the bundle's context can hold")
        return self.tokenizer.encode(text)

    # -- generation ----------------------------------------------------------------------------
    def generate(self, prompt, params: SamplingParams | None = None, *, system: str | None = None,
                 raw: bool = False, wait: bool = True, drafter="default", ids: list[int] | None = None,
                 response_format: dict | None = None, tools: list | None = None, tool_choice=None,
                 parallel_tool_calls: bool = True, thinking: bool | None = None,
                 reasoning_effort: str | None = None, reasoning_inline: bool = False) -> Generation:
        """drafter: "default" (the engine's), None (plain decoding) or a Drafter (runtime/drafter.py). ids: the
        prompt's token ids where the caller already has them (prompt_ids of the same prompt): not encoded again.
        response_format: OpenAI's {"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema": S}}:
        the output is constrained to it (runtime/constraint.py; needs specrt[grammar]). tools, tool_choice,
        parallel_tool_calls: OpenAI's (runtime/tools.py): the result's tool_calls hold the calls made, its text
        whatever else was said, its `reasoning` the thought (in text instead with reasoning_inline, as llama.cpp's
        reasoning_format none). thinking, reasoning_effort: this prompt's template variables (None: the engine's)."""
        params = params or SamplingParams()
        plan = None
        if tools is not None and raw:
            from specrt.runtime.tools import ToolError

            raise ToolError("tools go through the chat template; a raw prompt takes none")
        if tools is not None:
            plan = self._tool_plan(prompt, system, tools, tool_choice, parallel_tool_calls)
            if ids is None:  # a caller that checked the prompt's length passes the ids it rendered
                ids = self._tool_prompt_ids(plan, thinking, reasoning_effort)
            if plan.stops:
                params = dataclasses.replace(params, stop=tuple(params.stop) + plan.stops)
        if plan is not None and plan.native_grammar:  # calls in the template's format, built for this vocabulary
            grammar = self._call_grammar(plan, ids)
            constraint = self._constraint(grammar) if grammar is not None else None
        elif plan is not None and plan.grammar is not None:
            constraint = self._constraint(plan.grammar)
        else:
            constraint = self.output_constraint(response_format, params) if response_format is not None else None
        ids = list(ids) if ids is not None else self.prompt_ids(prompt, system=system, raw=raw, thinking=thinking,
                                                                reasoning_effort=reasoning_effort)
        if len(ids) >= self.max_context:
            raise ContextOverflowError(
                f"prompt has {len(ids)} tokens; the bundle's context is {self.max_context} (convert with a larger --max-context)"
            )
        gen = Generation(iter(()))
        gen._chunks = self._run(ids, params, gen, wait, self.drafter if drafter == "default" else drafter, constraint,
                                plan, reasoning_inline)
        return gen

    def tool_prompt_ids(self, prompt, tools, tool_choice=None, parallel_tool_calls: bool = True,
                        system: str | None = None, thinking: bool | None = None,
                        reasoning_effort: str | None = None) -> list[int]:
        """Token ids of a prompt as a request with these tools renders it (generate's, for a caller that checks the
        length first and hands generate the ids)."""
        return self._tool_prompt_ids(self._tool_plan(prompt, system, tools, tool_choice, parallel_tool_calls),
                                     thinking, reasoning_effort)

    def _tool_plan(self, prompt, system, tools, tool_choice, parallel):
        """A request with tools: its ToolPlan (runtime/tools.py)."""
        from specrt.runtime import tools as tool_calls

        given = tool_calls.parse_tools(tools)
        mode, only = tool_calls.parse_choice(tool_choice, given)
        if isinstance(prompt, str):
            prompt = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        source = self.tokenizer.template_source
        return tool_calls.plan(list(prompt), given, mode, only, bool(parallel), tool_calls.template_format(source),
                               source)

    def _tool_prompt_ids(self, plan, thinking, reasoning_effort) -> list[int]:
        variables = {**self.template_variables(thinking, reasoning_effort), **plan.variables}
        return self._encode(self.tokenizer.render(plan.messages, add_generation_prompt=True, variables=variables))

    def _call_grammar(self, plan, ids: list[int]) -> str | None:
        """The grammar of an answer with calls (runtime/tools.py call_grammar): the format's markers by this
        vocabulary's special tokens; reasoning first where the prompt leaves a <think> open."""
        from specrt.runtime.tools import call_grammar

        return call_grammar(plan, self._grammar_tokenizer_once().special_id, self.thought_open(ids))

    def thought_open(self, ids: list[int]) -> bool:
        """The prompt (its token ids) ends inside a `<think>` (Qwen3.5 with thinking on): the answer starts with
        the model's reasoning."""
        from specrt.runtime.reasoning import THINK, prompt_leaves_open

        return prompt_leaves_open(THINK, self.tokenizer.tok.decode(list(ids[-8:]), skip_special_tokens=False))

    def _grammar_tokenizer_once(self):
        from specrt.runtime.constraint import GrammarTokenizer

        if self._grammar_tokenizer is None:
            self._grammar_tokenizer = GrammarTokenizer(self.bundle_dir / "tokenizer.json", self.manifest.vocab_size,
                                                       self.stop_ids)
        return self._grammar_tokenizer

    def _constraint(self, grammar: str, bound_digits: bool = False):
        from specrt.runtime.constraint import OutputConstraint

        return OutputConstraint(self._grammar_tokenizer_once(), grammar, bound_digits)

    def output_constraint(self, response_format: dict, params: SamplingParams):
        """A fresh grammar state for one generation's output (ConstraintError for a format it cannot compile)."""
        from specrt.runtime.constraint import OutputConstraint

        return self._constraint(OutputConstraint.grammar_for(response_format), bound_digits=True)

    def _run(self, ids: list[int], params: SamplingParams, gen: Generation, wait: bool, drafter, constraint=None,
             plan=None, reasoning_inline: bool = False):
        if not self._lock.acquire(blocking=wait):
            raise EngineBusyError("another generation is running on this engine")
        try:
            # a tool format's markers are special tokens in its model's vocabulary: its answer is read with them
            keep_special = plan is not None and plan.format != "generic" and plan.mode != "none"
            # Gemma 4's thought channel is told apart by its markers, which are special tokens
            keep_special = keep_special or self.thought_style is GEMMA_CHANNEL
            yield from self._decode(ids, params, gen, drafter, constraint, keep_special)
        finally:
            self._lock.release()
        if plan is not None:  # the calls made, the thought, and whatever else was said
            from specrt.runtime.tools import read_answer

            said = read_answer(gen.result.text, plan, self.thought_open(ids), inline=reasoning_inline)
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
        rows-invariant graph one-token calls run their attention on two rows (+2-31 % a call, docs/perf.md);
        otherwise every target call feeds >= 2 rows (~1.05-1.3x), and graphs quantized in blocks larger than 32
        weights feed an even number of rows. MoE graphs run each token's experts in a call of their own (a verification
        then costs about one token's MoE time per token: convert/moe_graph.py)."""
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
