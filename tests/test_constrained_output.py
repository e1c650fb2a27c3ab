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
S = {"type": "string", "maxLength": 24}  # bounded strings: every answer ends within the token budget
# held-out-style schemas: nested objects, bounded arrays, enums, numbers with ranges, optional fields
MORE_SCHEMAS = [
    ("A book, as JSON.", {"type": "object", "properties": {"title": S, "author": S, "year": {
        "type": "integer", "minimum": 1400, "maximum": 2030}, "genres": {"type": "array", "items": S, "maxItems": 3}},
        "required": ["title", "author"], "additionalProperties": False}),
    ("An order from a cafe, as JSON.", {"type": "object", "properties": {"items": {"type": "array", "minItems": 1,
        "maxItems": 3, "items": {"type": "object", "properties": {"name": S, "qty": {
            "type": "integer", "minimum": 1, "maximum": 9}}, "required": ["name", "qty"],
            "additionalProperties": False}}, "total": {"type": "number", "minimum": 0, "maximum": 1000}},
        "required": ["items", "total"], "additionalProperties": False}),
    ("Today's weather, as JSON.", {"type": "object", "properties": {"sky": {
        "enum": ["sunny", "cloudy", "rain", "snow"]}, "temperature_c": {"type": "number", "minimum": -50,
                                                                       "maximum": 60}, "windy": {"type": "boolean"}},
        "required": ["sky", "temperature_c", "windy"], "additionalProperties": False}),
    ("A user profile, as JSON.", {"type": "object", "properties": {"username": {
        "type": "string", "pattern": "^[a-z]{3,12}$"}, "email": S, "age": {"type": "integer", "minimum": 13,
                                                                          "maximum": 110}},
        "required": ["username"], "additionalProperties": False}),
    ("Three numbers between 1 and 10, as JSON.", {"type": "array", "items": {
        "type": "integer", "minimum": 1, "maximum": 10}, "minItems": 3, "maxItems": 3}),
    ("A task list, as JSON.", {"type": "object", "properties": {"tasks": {"type": "array", "maxItems": 4, "items": {
        "type": "object", "properties": {"task": S, "done": {"type": "boolean"}, "priority": {
            "enum": ["low", "medium", "high"]}}, "required": ["task", "done"], "additionalProperties": False}}},
        "required": ["tasks"], "additionalProperties": False}),
    ("A movie review, as JSON.", {"type": "object", "properties": {"movie": S, "stars": {
        "type": "integer", "minimum": 1, "maximum": 5}, "summary": {"type": "string", "maxLength": 60}},
        "required": ["movie", "stars", "summary"], "additionalProperties": False}),
    ("A point in 3D space, as JSON.", {"type": "object", "properties": {"x": {"type": "number"}, "y": {
        "type": "number"}, "z": {"type": "number"}}, "required": ["x", "y", "z"], "additionalProperties": False}),
    ("A recipe, as JSON.", {"type": "object", "properties": {"dish": S, "servings": {
        "type": "integer", "minimum": 1, "maximum": 12}, "ingredients": {"type": "array", "minItems": 1,
                                                                         "maxItems": 4, "items": S}},
        "required": ["dish", "ingredients"], "additionalProperties": False}),
    ("A flight, as JSON.", {"type": "object", "properties": {"from": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "to": {"type": "string", "pattern": "^[A-Z]{3}$"}, "class": {"enum": ["economy", "business", "first"]}},
        "required": ["from", "to", "class"], "additionalProperties": False}),
    ("A company, as JSON.", {"type": "object", "properties": {"name": S, "address": {"type": "object", "properties": {
        "street": S, "city": S, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["city"],
        "additionalProperties": False}, "employees": {"type": "integer", "minimum": 1, "maximum": 100000}},
        "required": ["name", "address"], "additionalProperties": False}),
    ("Is the sky blue? Answer as JSON.", {"type": "object", "properties": {"answer": {"type": "boolean"},
                                                                           "confidence": {"type": "number",
                                                                                          "minimum": 0, "maximum": 1}},
                                          "required": ["answer", "confidence"], "additionalProperties": False}),
    ("A color palette, as JSON.", {"type": "object", "properties": {"colors": {"type": "array", "minItems": 2,
        "maxItems": 4, "items": {"type": "string", "pattern": "^#[0-9a-f]{6}$"}}}, "required": ["colors"],
        "additionalProperties": False}),
    ("A student's grades, as JSON.", {"type": "object", "properties": {"student": S, "grades": {
        "type": "object", "properties": {"math": {"enum": ["A", "B", "C", "D", "F"]}, "art": {
            "enum": ["A", "B", "C", "D", "F"]}}, "required": ["math"], "additionalProperties": False}},
        "required": ["student", "grades"], "additionalProperties": False}),
    ("An event, as JSON.", {"type": "object", "properties": {"event": S, "date": {
        "type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}, "attendees": {
        "type": "integer", "minimum": 0, "maximum": 500}, "online": {"type": "boolean"}},
        "required": ["event", "date"], "additionalProperties": False}),
    ("A pair of words and their lengths, as JSON.", {"type": "array", "minItems": 2, "maxItems": 2, "items": {
        "type": "object", "properties": {"word": {"type": "string", "maxLength": 12}, "length": {
            "type": "integer", "minimum": 1, "maximum": 12}}, "required": ["word", "length"],
        "additionalProperties": False}}),
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


def test_held_out_schemas_always_give_output_that_fits(engine):
    """Sixteen more schemas (with the four above: twenty), decoded with the grammar drafting: every output parses
    and jsonschema validates it."""
    import jsonschema

    for prompt, schema in MORE_SCHEMAS:
        out = engine.generate(prompt, SamplingParams(max_new_tokens=256), drafter=None,
                              response_format=json_schema(schema)).wait()
        assert out.finish_reason == "stop", (prompt, out.text)
        jsonschema.validate(json.loads(out.text), schema)


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
