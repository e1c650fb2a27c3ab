"""Check a freshly written target graph against the torch reference before the bundle is kept.

Each prompt runs through ONNX Runtime in three calls (a prefill chunk, one decode step, the rest)
so that the in-place KV cache path is exercised, and is compared with one full torch forward.
Each prompt is cut to VALIDATION_TOKENS tokens (the reference's logits are [S, V] floats per prompt; a byte-level
tokenizer and a 150k vocabulary made them a gigabyte). Thresholds: fp32 max |logit difference| <= 1e-3 times
the spread (standard deviation) of the reference's logits, at least 1e-3, and every top-1 equal; fp16 (and every GPU
graph, whose activations are float16: convert/gpu_profile.py) max |difference| <= 5e-2 times that spread, at least
5e-2, and top-1 agreement >= 95% (random-weight test models' logits are nearly flat, so float16's rounding flips a
few near-ties; the difference limit is what catches a wrong graph); int4 and int8: the same graph with float activations against torch on the very same quantized
weights, held to fp32's limits. The shipped graph's int8 activations move near-tied logits (on random-weight test
models, most of them), so its agreement is recorded, not limited. A mixture of experts runs the graph first, its
router logits as extra outputs (run_graph), and the reference after it following the graph's choice of experts
where two nearly tie (models/moe.py ExpertChoice: rounding may pick either, and one swap moves every later logit
of a deep model); a choice beyond a near-tie refuses the graph (check_routing). `gguf` (the file's own values): the
reference on the graph's weights read back must also equal the reference on the file as its loader reads it
(check_file_weights), since the exact check alone follows whatever the graph holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specrt.bundle import WEIGHT_BITS
from specrt.errors import ValidationError

FP32_MAX_ABS = 1e-3  # times the reference logits' standard deviation, when that is above 1
FP16_MAX_ABS = 5e-2  # the same for float16 activations
VALIDATION_TOKENS = 64
# int4-exact / int8-exact: the quantized graph with float activations against torch on the same quantized weights
# (held to fp32's limits); int4 / int8: the shipped graph, whose int8 activations move near-tied logits (recorded,
# not limited)
EXACT = ("fp32", *(f"{p}-exact" for p in WEIGHT_BITS))  # held to fp32's limits
MIN_TOP1 = {"fp32": 1.0, "fp16": 0.95, **{p: 1.0 for p in EXACT}, **{p: 0.0 for p in WEIGHT_BITS}}

# Prompts whose tokens drive validation (a mix of chat, code and prose).
VALIDATION_TEXTS = (
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is Rome, "
    "and the capital of Spain is Madrid. These cities are known for their history, their museums and "
    "their food, and millions of tourists visit them every year.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n"
    "    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\nfor i in range(10):\n    print(i, fibonacci(i))\n",
    "<|im_start|>user\nWhat is the boiling point of water at sea level?<|im_end|>\n<|im_start|>assistant\n"
    "The boiling point of water at sea level is 100 degrees Celsius, or 212 degrees Fahrenheit.<|im_end|>\n",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who went out every "
    "morning in his little boat. One day he caught a golden fish that could speak, and the fish said to him:",
    "Question: Tom has 12 apples and gives 5 of them to his sister. How many apples does Tom have left? "
    "Answer: Tom starts with 12 apples. He gives away 5, so he has 12 - 5 = 7 apples left. The answer is 7.",
)


@dataclass(frozen=True)
class ValidationReport:
    max_abs_diff: float
    top1_agreement: float
    positions: int
    hidden_max_abs_diff: float | None
    logit_std: float = 1.0  # the reference logits' standard deviation (the scale fp32's limit is relative to)

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}


def graph_outputs(session, prompts: list[list[int]]):
    """Per prompt, what the graph gives when each prompt runs in three calls (a prefill chunk, one decode step, the
    rest): (logits [S, V], hidden-state taps [S, F] or None, the session's extra outputs [S, ...] in its order)."""
    for ids in prompts:
        if len(ids) < 3:
            raise ValueError("validation prompts need at least 3 tokens")
        session.reset()
        arr = np.array([ids], dtype=np.int64)
        cut = len(ids) // 2
        chunks = [arr[:, :cut], arr[:, cut:cut + 1], arr[:, cut + 1:]]
        outs = [session.forward(c) for c in chunks if c.shape[1]]
        outs = [o if isinstance(o, tuple) else (o,) for o in outs]
        # [1, s, X] per call ([s, X] for an output of flattened rows, such as router logits) -> [S, X]
        joined = [np.concatenate([o[j] for o in outs], axis=1)[0] if outs[0][j].ndim == 3
                  else np.concatenate([o[j] for o in outs], axis=0) for j in range(len(outs[0]))]
        del outs
        tap = joined[1].astype(np.float32) if session.spec.hidden_output else None
        yield joined[0], tap, joined[1 + session.spec.hidden_output:]


def run_graph(session, prompts: list[list[int]], folder: Path, routers: dict[int, str], top_k: int):
    """One run of a graph whose extra outputs are its MoE layers' router logits (`routers`: {layer: output name},
    in the session's extra_outputs order): its logits and taps wait on disk (a SpilledOutputs, for compare), and
    per prompt the experts it chose in each MoE layer [S, k] (ONNX Runtime's softmax, then its top k; ties to the
    lower id), for the reference to follow where they are near-ties (models/layerwise.py)."""
    spilled, routes = SpilledOutputs(folder, "graph", []), []
    for logits, tap, extras in graph_outputs(session, prompts):
        chosen = {}
        for layer, scores in zip(routers, extras):  # scores [S, E]
            z = np.exp(scores - scores.max(-1, keepdims=True), dtype=np.float32)
            probs = z / z.sum(-1, keepdims=True)
            chosen[layer] = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]
        routes.append(chosen)
        spilled.add(logits, tap)
    return spilled, routes


def compare(session, reference, prompts: list[list[int]], *more) -> ValidationReport | tuple[ValidationReport, ...]:
    """session: a runtime TargetSession (run here as graph_outputs runs it), or its outputs from run_graph;
    reference: per prompt, the torch reference's logits [S, V] and hidden-state taps [S, taps * H] (None without
    taps), from models/layerwise.py (a list, or a SpilledOutputs read back one prompt at a time). `more`: further
    references held to the same run of the session (one report each)."""
    references = (reference, *more)
    if any(len(r) != len(prompts) for r in references):
        raise ValueError(f"{len(prompts)} prompts but {[len(r) for r in references]} reference outputs")
    if isinstance(session, SpilledOutputs):
        outputs = (session[p] for p in range(len(session)))
    else:
        outputs = ((got, tap) for got, tap, _ in graph_outputs(session, prompts))
    stats = [[0.0, 0, None, 0.0] for _ in references]  # per reference: max |diff|, top-1 agreements, hidden, std
    total = 0
    for p, (ids, (got, tap)) in enumerate(zip(prompts, outputs)):
        for reference, st in zip(references, stats):
            ref, ref_tap = reference[p]
            if ref_tap is not None:
                d = float(np.abs(tap - ref_tap).max())
                st[2] = d if st[2] is None else max(st[2], d)
            if not (np.isfinite(ref).all() and np.isfinite(got).all()):
                side = "the torch reference" if not np.isfinite(ref).all() else "the graph"
                raise ValidationError(f"{side} outputs non-finite logits (NaN or inf) on a validation prompt: the "
                                      "source's weights or config (rms_norm_eps, rope_theta) are broken; bundle not "
                                      "written")
            st[0] = max(st[0], float(np.abs(got - ref).max()))
            st[1] += int((got.argmax(-1) == ref.argmax(-1)).sum())
            st[3] = max(st[3], float(ref.std()))
        total += len(ids)
    reports = tuple(ValidationReport(m, a / total, total, h, sd) for m, a, h, sd in stats)
    return reports if more else reports[0]


def check_routing(routing) -> dict:
    """The record of a reference that followed the graph's experts (models/layerwise.RoutesFollowed); refuses a
    graph whose choice differs from the reference's beyond a near-tie."""
    if routing.refused:
        layer, prompt, position, gap = max(routing.refused, key=lambda r: r[3])
        raise ValidationError(
            f"the graph chooses other experts than the torch reference at {len(routing.refused)} of "
            f"{routing.tokens} token-layers (worst: layer {layer}, validation prompt {prompt}, position {position}, "
            f"{gap:.2g} spreads below the k-th expert's score); bundle not written")
    return {"followed_near_ties": routing.followed, "token_layers": routing.tokens}


class SpilledOutputs:
    """A reference's per-prompt (logits [S, V], taps [S, F] or None), kept in .npy files under `folder` and read
    back one prompt at a time (five prompts' logits over a 248k vocabulary are 300 MB: not held while ONNX Runtime
    holds a 9B model)."""

    def __init__(self, folder: Path, name: str, outputs: list[tuple[np.ndarray, np.ndarray | None]]):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.name, self.files = folder, name, []
        for logits, taps in outputs:
            self.add(logits, taps)

    def add(self, logits: np.ndarray, taps: np.ndarray | None) -> None:
        i = len(self.files)
        files = (self.folder / f"{self.name}.{i}.logits.npy",
                 self.folder / f"{self.name}.{i}.taps.npy" if taps is not None else None)
        np.save(files[0], logits)
        if taps is not None:
            np.save(files[1], taps)
        self.files.append(files)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray | None]:
        logits, taps = self.files[i]
        return np.load(logits), (np.load(taps) if taps is not None else None)


def check_file_weights(source: SpilledOutputs, quantized: SpilledOutputs) -> float:
    """--precision gguf: the torch model on the graph's weights read back must compute what it computes on the
    file's weights as its loader reads them (the same values: both are the file's), so that a layout slip (blocks
    that missed a reordering) cannot pass the exact check, which follows the graph's own weights. Returns the max
    |diff| of their logits."""
    worst = 0.0
    for i in range(len(source)):
        a, b = source[i][0], quantized[i][0]
        worst = max(worst, float(np.abs(a - b).max()))
        limit = FP32_MAX_ABS * max(1.0, float(a.std()))
        if worst > limit:
            raise ValidationError(f"the graph's weights differ from the file's (logits {worst:.2e} apart on a "
                                  f"validation prompt, limit {limit:.1e}): a conversion bug; bundle not written")
    return worst


def max_abs_limit(report: ValidationReport, precision: str = "fp32") -> float:
    return (FP16_MAX_ABS if precision == "fp16" else FP32_MAX_ABS) * max(1.0, report.logit_std)


def check(report: ValidationReport, precision: str) -> None:
    if precision == "fp16" and report.max_abs_diff > max_abs_limit(report, precision):
        raise ValidationError(
            f"float16 graph differs from the torch reference by {report.max_abs_diff:.2e} "
            f"(limit {max_abs_limit(report, precision):.1e}); bundle not written"
        )
    if precision in EXACT and report.max_abs_diff > max_abs_limit(report):
        raise ValidationError(
            f"{precision} graph differs from the torch reference by {report.max_abs_diff:.2e} "
            f"(limit {max_abs_limit(report):.1e}); bundle not written"
        )
    if report.top1_agreement < MIN_TOP1[precision]:
        raise ValidationError(
            f"{precision} graph agrees with the torch reference on {report.top1_agreement:.1%} of top-1 tokens "
            f"(need {MIN_TOP1[precision]:.0%}); bundle not written"
        )
