"""Constrained output (runtime/constraint.py) on the real default model: the output follows the JSON schema, and the
grammar changes nothing about losslessness (greedy constrained output is the same with every drafter as with none).
First part of issue 38: the runtime and the Python API; the server's response_format / tools come next."""

from __future__ import annotations

import json

import numpy as np
import pytest

import specrt
from specrt.runtime.constraint import ConstraintError
from specrt.runtime.sampling import SamplingParams

pytestmark = pytest.mark.real_model

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0,
                                                                          "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                                                 "minItems": 1, "maxItems": 3}},
     "required": ["colors"], "additionalProperties": False},
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                      "location": {"type": "object", "properties": {
                                          "lat": {"type": "number"}, "lon": {"type": "number"}},
                                          "required": ["lat", "lon"], "additionalProperties": False},
                                      "capital": {"type": "boolean"}},
     "required": ["city", "location"], "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {"step": {"type": "integer"},
                                                                 "text": {"type": "string", "maxLength": 40}},
                                "required": ["step", "text"], "additionalProperties": False},
     "minItems": 2, "maxItems": 3},
]
PROMPTS = ["Describe a person as JSON.", "List some colours as JSON.", "Tell me about Paris as JSON.",
           "Give the steps to make tea as JSON."]
PARAMS = SamplingParams(max_new_tokens=160)


def json_schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


@pytest.fixture(scope="module")
def engine(int4_bundle):
    return specrt.load(str(int4_bundle), device="cpu", batch_invariant=True)


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_constrained_output_fits_its_schema_with_every_drafter(engine, index):
    """Plain constrained decoding gives JSON the schema validates; the n-gram drafter, the EAGLE-3 head and the
    DFlash drafter (fixed draft length, batch-invariant calls) give the same tokens."""
    import jsonschema

    from specrt.app.api import make_drafter

    schema, prompt = SCHEMAS[index], PROMPTS[index]
    engine.grammar_drafts = False  # plain constrained decoding: one target call a token
    try:
        plain = engine.generate(prompt, PARAMS, drafter=None, response_format=json_schema(schema)).wait()
    finally:
        engine.grammar_drafts = True
    assert plain.finish_reason == "stop" and plain.stats.mean_accepted == 1.0
    jsonschema.validate(json.loads(plain.text), schema)
    forced = engine.generate(prompt, PARAMS, drafter=None, response_format=json_schema(schema)).wait()
    assert forced.token_ids == plain.token_ids and forced.stats.drafter == "grammar"
    # the grammar's forced tokens (keys, quotes, braces) were verified several a call
    assert 0 < forced.stats.forced_accepted <= forced.stats.forced_drafted
    assert forced.stats.target_calls <= plain.stats.target_calls - forced.stats.forced_accepted
    engine.adaptive = False
    calls = []
    try:
        for kind in ("ngram", "eagle3", "dflash"):
            drafter = make_drafter(kind, engine.bundle_dir, engine.manifest, engine.providers)
            out = engine.generate(prompt, PARAMS, drafter=drafter, response_format=json_schema(schema)).wait()
            assert out.token_ids == plain.token_ids, kind
            calls.append(out.stats.target_calls)
    finally:
        engine.adaptive = True
    assert sum(calls) < 3 * plain.stats.target_calls  # drafts the grammar allowed were verified, several a call


def test_sampled_constrained_output_fits_its_schema(engine):
    """Sampling (temperature 1) under a schema whose every value is bounded: the output always ends and fits."""
    import jsonschema

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                               "pet": {"enum": ["cat", "dog", "none"]}},
              "required": ["name", "age", "pet"], "additionalProperties": False}
    for seed in range(4):
        out = engine.generate("Describe a person as JSON.", SamplingParams(max_new_tokens=96, temperature=1.0,
                                                                           seed=seed),
                              drafter=None, response_format=json_schema(schema)).wait()
        assert out.finish_reason == "stop"
        jsonschema.validate(json.loads(out.text), schema)


def test_sampled_output_with_the_grammar_drafting_follows_plain_constrained_sampling(engine):
    """Temperature 1 under a schema of one enum between forced runs (`{"pet":"`, `"}`): the grammar's forced tokens
    drafted (alone, and with the n-gram drafter after them) give the same distribution of outputs as plain
    constrained sampling (chi-square test of homogeneity over 160 samples each)."""
    from scipy.stats import chi2_contingency

    from specrt.app.api import make_drafter

    schema = {"type": "object", "properties": {"pet": {"enum": ["cat", "dog", "fish", "bird", "none"]}},
              "required": ["pet"], "additionalProperties": False}
    ngram = make_drafter("ngram", engine.bundle_dir, engine.manifest, engine.providers)
    counts = {}
    for name, drafter, grammar in (("plain", None, False), ("grammar", None, True), ("grammar+ngram", ngram, True)):
        engine.grammar_drafts = grammar
        try:
            outs = [engine.generate("Which pet do you have? Answer as JSON.", SamplingParams(
                max_new_tokens=24, temperature=1.0, seed=seed), drafter=drafter,
                response_format=json_schema(schema)).wait() for seed in range(160)]
        finally:
            engine.grammar_drafts = True
        counts[name] = [sum(json.loads(o.text)["pet"] == v for o in outs) for v in schema["properties"]["pet"]["enum"]]
        if grammar:
            assert sum(o.stats.forced_accepted for o in outs) > 0
    table = np.array(list(counts.values()))
    table = table[:, table.sum(0) > 0]
    assert table.shape[1] >= 2, counts  # the test needs a choice that varies
    for row in (1, 2):
        assert chi2_contingency(table[[0, row]]).pvalue > 0.01, counts


@pytest.mark.parametrize("response_format, message", [
    ({"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}, "the JSON schema cannot be used"),
    ({"type": "xml"}, "response_format type must be json_object or json_schema"),
    ({"type": "json_schema"}, "needs a json_schema.schema object"),
])
def test_a_format_that_cannot_be_used_is_named(engine, response_format, message):
    with pytest.raises(ConstraintError, match=message):
        engine.generate("x", PARAMS, response_format=response_format)
