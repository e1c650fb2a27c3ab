"""Check a freshly written target graph against the torch reference before the bundle is kept.

Each prompt runs through ONNX Runtime in three calls (a prefill chunk, one decode step, the rest)
so that the in-place KV cache path is exercised, and is compared with one full torch forward.
Each prompt is cut to VALIDATION_TOKENS tokens (the reference's logits are [S, V] floats per prompt; a byte-level
tokenizer and a 150k vocabulary made them a gigabyte). Thresholds: fp32 max |logit difference| <= 1e-3 times
the spread (standard deviation) of the reference's logits, at least 1e-3, and every top-1 equal; fp16 top-1
agreement >= 99%; int4 and int8: the same graph with float activations against torch on the very same quantized
weights, held to fp32's limits. The shipped graph's int8 activations move near-tied logits (on random-weight test
models, most of them), so its agreement is recorded, not limited.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrt.bundle import WEIGHT_BITS
from specrt.errors import ValidationError

FP32_MAX_ABS = 1e-3  # times the reference logits' standard deviation, when that is above 1
VALIDATION_TOKENS = 64
# int4-exact / int8-exact: the quantized graph with float activations against torch on the same quantized weights
# (held to fp32's limits); int4 / int8: the shipped graph, whose int8 activations move near-tied logits (recorded,
# not limited)
EXACT = ("fp32", *(f"{p}-exact" for p in WEIGHT_BITS))  # held to fp32's limits
MIN_TOP1 = {"fp32": 1.0, "fp16": 0.99, **{p: 1.0 for p in EXACT}, **{p: 0.0 for p in WEIGHT_BITS}}

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


def compare(session, reference: list[tuple[np.ndarray, np.ndarray | None]], prompts: list[list[int]]) -> ValidationReport:
    """session: a runtime TargetSession; reference: per prompt, the torch reference's logits [S, V] and hidden-state
    taps [S, taps * H] (None without taps), from models/layerwise.py."""
    max_abs, agree, total, hidden_diff, std = 0.0, 0, 0, None, 0.0
    for ids, (ref, ref_tap) in zip(prompts, reference, strict=True):
        if len(ids) < 3:
            raise ValueError("validation prompts need at least 3 tokens")
        session.reset()
        arr = np.array([ids], dtype=np.int64)
        cut = len(ids) // 2
        chunks = [arr[:, :cut], arr[:, cut:cut + 1], arr[:, cut + 1:]]
        outs = [session.forward(c) for c in chunks if c.shape[1]]
        if ref_tap is not None:
            got = np.concatenate([o[0] for o in outs], axis=1)[0]
            tap = np.concatenate([o[1] for o in outs], axis=1)[0]
            d = float(np.abs(tap.astype(np.float32) - ref_tap).max())
            hidden_diff = d if hidden_diff is None else max(hidden_diff, d)
        else:
            got = np.concatenate(outs, axis=1)[0]
        if not (np.isfinite(ref).all() and np.isfinite(got).all()):
            side = "the torch reference" if not np.isfinite(ref).all() else "the graph"
            raise ValidationError(f"{side} outputs non-finite logits (NaN or inf) on a validation prompt: the source's "
                                  f"weights or config (rms_norm_eps, rope_theta) are broken; bundle not written")
        max_abs = max(max_abs, float(np.abs(got - ref).max()))
        agree += int((got.argmax(-1) == ref.argmax(-1)).sum())
        total += len(ids)
        std = max(std, float(ref.std()))
    return ValidationReport(max_abs, agree / total, total, hidden_diff, std)


def max_abs_limit(report: ValidationReport) -> float:
    return FP32_MAX_ABS * max(1.0, report.logit_std)


def check(report: ValidationReport, precision: str) -> None:
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
