"""The chat side of a generation, apart from the decode loop: a Request (what one generation is asked), the prompt's
token ids through the chat template (with the thinking and effort variables, tools in the template's own format,
an earlier thought handed back as the template takes it), the output's constraint (response_format, or the tool
calls' grammar), and how the finished answer is read (its calls, its thought).

Engine.generate (runtime/engine.py) prepares a Request here and runs the decode loop on what comes back.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from specrt.errors import SpecrtError
from specrt.runtime.reasoning import GEMMA_CHANNEL
from specrt.runtime.sampling import SamplingParams
from specrt.runtime.target_session import ContextOverflowError
from specrt.runtime.tokenizer import BundleTokenizer, PromptError


@dataclass
class Request:
    """One generation's input. prompt: a string (through the chat template unless raw) or a message list; system:
    a system message before a string prompt. response_format: OpenAI's {"type": "json_object"} or {"type":
    "json_schema", "json_schema": {"schema": S}}: the output is constrained to it (runtime/constraint.py). tools,
    tool_choice, parallel_tool_calls: OpenAI's (runtime/tools.py): the result's tool_calls hold the calls made, its
    text whatever else was said, its `reasoning` the thought (in the text instead with reasoning_inline, as
    llama.cpp's reasoning_format none). thinking, reasoning_effort: this prompt's template variables (None: the
    engine's)."""
    prompt: object
    params: SamplingParams = field(default_factory=SamplingParams)
    system: str | None = None
    raw: bool = False
    response_format: dict | None = None
    tools: list | None = None
    tool_choice: object = None
    parallel_tool_calls: bool = True
    thinking: bool | None = None
    reasoning_effort: str | None = None
    reasoning_inline: bool = False


@dataclass
class Prepared:
    """A Request made ready for the decode loop."""
    ids: list[int]  # the prompt's token ids
    params: SamplingParams  # the request's, with the tool format's stop strings added
    constraint: object | None  # runtime/constraint.OutputConstraint, or None
    plan: object | None  # runtime/tools.ToolPlan of a request with tools
    keep_special: bool  # decode with special tokens kept (a format's markers, Gemma 4's thought channel)
    inline: bool = False  # reasoning_inline
    open_thought: bool = False  # the prompt ends inside a thought (read where the plan needs it: tool requests)


class Prompting:
    """Prompts, constraints and answers for one bundle's tokenizer and chat template."""

    def __init__(self, tokenizer: BundleTokenizer, max_context: int, bundle_dir: Path, vocab_size: int,
                 stop_ids: frozenset[int]):
        self.tokenizer, self.max_context = tokenizer, max_context
        self._grammar_source = (Path(bundle_dir) / "tokenizer.json", vocab_size, stop_ids)
        self._grammar_tokenizer = None  # the tokenizer as the grammar engine reads it (runtime/constraint.py)
        # reasoning models (Qwen3, Qwen3.5): True / False sets the template's enable_thinking; None: its default
        self.thinking: bool | None = None
        # gpt-oss: "low" | "medium" | "high" sets the template's reasoning_effort; None: its default
        self.reasoning_effort: str | None = None

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
        """Token ids of a prompt: a string (through the chat template unless raw) or a message list."""
        if isinstance(prompt, str):
            if not prompt.strip():
                raise PromptError("empty prompt")
            if raw:
                return self.encode(prompt)
            messages = _messages(prompt, system)
        else:
            messages = list(prompt)
        if self.tokenizer.harmony:  # gpt-oss's template reads an earlier turn's thought as `thinking`
            messages = [{**m, "thinking": m["reasoning_content"]} if m.get("reasoning_content") else m
                        for m in messages]
        variables = self.template_variables(thinking, reasoning_effort)
        return self.encode(self.tokenizer.render(messages, add_generation_prompt=True, variables=variables))

    def encode(self, text: str) -> list[int]:
        """Token ids of text; a text too long to fit the context whatever its tokens (more characters than the
        context times the longest token's) is refused before the tokenizer spends memory on it."""
        limit = self.max_context * self.tokenizer.max_token_chars
        if len(text) > limit:
            raise ContextOverflowError(f"the prompt has {len(text)} characters, more than the {self.max_context} "
                                       f"tokens of the bundle's context can hold")
        return self.tokenizer.encode(text)

    # -- the thought ---------------------------------------------------------------------------
    @property
    def thought_style(self):
        """The chat template's thought markers (runtime/reasoning.py), or None."""
        from specrt.runtime.reasoning import style_of

        return style_of(self.tokenizer.template_source)

    def reasoning_open(self, messages: list[dict]) -> bool:
        """The chat template leaves a reasoning block open for the answer (Qwen3.5 with thinking on ends the prompt
        with <think>): the answer starts with the model's reasoning."""
        try:
            text = self.tokenizer.render(list(messages), add_generation_prompt=True,
                                         variables=self.template_variables())
        except SpecrtError:
            return False
        from specrt.runtime.reasoning import THINK, prompt_leaves_open

        return prompt_leaves_open(THINK, text)

    def thought_open(self, ids: list[int]) -> bool:
        """The prompt (its token ids) ends inside a `<think>` (Qwen3.5 with thinking on): the answer starts with
        the model's reasoning."""
        from specrt.runtime.reasoning import THINK, prompt_leaves_open

        return prompt_leaves_open(THINK, self.tokenizer.tok.decode(list(ids[-8:]), skip_special_tokens=False))

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

    # -- tools and constraints -----------------------------------------------------------------
    def tool_plan(self, prompt, system, tools, tool_choice, parallel):
        """A request with tools: its ToolPlan (runtime/tools.py)."""
        from specrt.runtime import tools as tool_calls

        given = tool_calls.parse_tools(tools)
        mode, only = tool_calls.parse_choice(tool_choice, given)
        if isinstance(prompt, str):
            prompt = _messages(prompt, system)
        source = self.tokenizer.template_source
        return tool_calls.plan(list(prompt), given, mode, only, bool(parallel), tool_calls.template_format(source),
                               source)

    def plan_ids(self, plan, thinking=None, reasoning_effort=None) -> list[int]:
        """Token ids of a tool plan's prompt."""
        variables = {**self.template_variables(thinking, reasoning_effort), **plan.variables}
        return self.encode(self.tokenizer.render(plan.messages, add_generation_prompt=True, variables=variables))

    def tool_prompt_ids(self, prompt, tools, tool_choice=None, parallel_tool_calls: bool = True,
                        system: str | None = None, thinking: bool | None = None,
                        reasoning_effort: str | None = None) -> list[int]:
        """Token ids of a prompt as a request with these tools renders it (generate's, for a caller that checks the
        length first and hands generate the ids)."""
        return self.plan_ids(self.tool_plan(prompt, system, tools, tool_choice, parallel_tool_calls), thinking,
                             reasoning_effort)

    def grammar_tokenizer(self):
        if self._grammar_tokenizer is None:
            from specrt.runtime.constraint import GrammarTokenizer

            self._grammar_tokenizer = GrammarTokenizer(*self._grammar_source)
        return self._grammar_tokenizer

    def constraint(self, grammar: str, bound_digits: bool = False):
        from specrt.runtime.constraint import OutputConstraint

        return OutputConstraint(self.grammar_tokenizer(), grammar, bound_digits)

    def output_constraint(self, response_format: dict, params: SamplingParams | None = None):
        """A fresh grammar state for one generation's output (ConstraintError for a format it cannot compile)."""
        from specrt.runtime.constraint import OutputConstraint

        return self.constraint(OutputConstraint.grammar_for(response_format), bound_digits=True)

    # -- a request, before and after the decode loop -------------------------------------------
    def prepare(self, request: Request, ids: list[int] | None = None) -> Prepared:
        """The request's prompt ids (`ids` where the caller already rendered them), its constraint and the stop
        strings its tool format adds."""
        params, plan = request.params, None
        if request.tools is not None and request.raw:
            from specrt.runtime.tools import ToolError

            raise ToolError("tools go through the chat template; a raw prompt takes none")
        if request.tools is not None:
            plan = self.tool_plan(request.prompt, request.system, request.tools, request.tool_choice,
                                  request.parallel_tool_calls)
            if ids is None:  # a caller that checked the prompt's length passes the ids it rendered
                ids = self.plan_ids(plan, request.thinking, request.reasoning_effort)
            if plan.stops:
                params = dataclasses.replace(params, stop=tuple(params.stop) + plan.stops)
        open_thought = plan is not None and self.thought_open(ids)
        if plan is not None and plan.native_grammar:  # calls in the template's format, built for this vocabulary
            from specrt.runtime.tools import call_grammar

            grammar = call_grammar(plan, self.grammar_tokenizer().special_id, open_thought)
            constraint = self.constraint(grammar) if grammar is not None else None
        elif plan is not None and plan.grammar is not None:
            constraint = self.constraint(plan.grammar)
        elif request.response_format is not None:
            constraint = self.output_constraint(request.response_format)
        else:
            constraint = None
        if ids is None:
            ids = self.prompt_ids(request.prompt, system=request.system, raw=request.raw, thinking=request.thinking,
                                  reasoning_effort=request.reasoning_effort)
        # a tool format's markers are special tokens in its model's vocabulary: its answer is read with them; Gemma
        # 4's thought channel is told apart by its markers, special tokens too
        keep_special = (plan is not None and plan.format != "generic" and plan.mode != "none") \
            or self.thought_style is GEMMA_CHANNEL
        return Prepared(list(ids), params, constraint, plan, keep_special, request.reasoning_inline, open_thought)

    def read(self, text: str, ready: Prepared):
        """A finished answer with tools -> runtime/tool_formats.Answer (content, thought, calls in OpenAI's form)."""
        from specrt.runtime.tools import read_answer

        return read_answer(text, ready.plan, ready.open_thought, inline=ready.inline)


def _messages(prompt: str, system: str | None) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
