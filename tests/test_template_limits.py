"""A bundle's chat template is code from whoever made the model file (issue 48): every render is bounded in steps,
time, size and memory, whether the template prints or not (runtime/template_sandbox.py), renders in several threads
count their own budgets, and conversion refuses a template that goes past those limits on a sample conversation
(convert/tokenizer.py). Each hostile template is rendered in a fresh, memory-capped subprocess, which reports the
error, the time and how far its peak memory grew."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from specrt.runtime.template_sandbox import RENDER_ITEMS, RENDER_SECONDS, RENDER_STEPS, TOJSON_INDENT
from tests.tiny_models import save_tiny_bundle_source, save_tiny_tokenizer
from tests.tool_templates import TEMPLATES

CAP = r"would be \d+ characters long, past the cap of \d+ characters"
REPEAT = r"a repetition longer than \d+ items"
STEPS = rf"ran over {RENDER_STEPS} steps|rendering took over {RENDER_SECONDS:.0f} s"
BUILT = r"strings and lists add up to over \d+ bytes"
RING = '{% set ns = namespace(s="ab", l=[1]) %}'
COMPARED = rf"comparing or sorting a structure of over {RENDER_ITEMS} elements"

HOSTILE = {
    # loops that print nothing: range() is budgeted, so the lists come from elsewhere
    "loops over a list": ("{% set xs = messages * 1000 %}{% for a in xs %}{% for b in xs %}{% for c in xs %}"
                          "{% endfor %}{% endfor %}{% endfor %}", STEPS),
    "loops over a string": ('{% for a in "x" * 4000000 %}{% for b in "x" * 4000000 %}{% endfor %}{% endfor %}',
                            STEPS),
    "recursive macro": ("{% macro m(n) %}{% if n %}{{ m(n - 1) }}{{ m(n - 1) }}{% endif %}{% endmacro %}{{ m(40) }}",
                        f"{STEPS}|{BUILT}"),
    # filters that pad, repeat or fill
    "center filter": ('{{ "x"|center(400000000) }}', CAP),
    "format filter": ('{{ "%400000000d"|format(1) }}', CAP),
    "indent filter": ('{{ "x"|indent(400000000, true) }}', CAP),
    "wordwrap filter": ('{{ ("x " * 2000000)|wordwrap(1, wrapstring="y" * 100) }}', CAP),
    "replace filter": ('{{ ("x" * 4000000)|replace("x", "y" * 100) }}', CAP),
    "join filter": ('{{ ("x" * 4000000)|join("y" * 100) }}', CAP),
    "batch filled": ('{{ [1]|batch(400000000, "x")|list|length }}', CAP),
    "sum of lists": ("{{ ([[1, 2, 3]] * 2000000)|sum(start=[])|length }}", CAP),
    "tojson indent": ("{{ [[1]]|tojson(indent=400000000) }}", f"tojson indent over {TOJSON_INDENT}"),
    "lipsum": ("{{ lipsum(400000000)|length }}", f"more than {RENDER_ITEMS} items"),
    # operators
    "% width": ('{{ "%400000000d" % 1 }}', CAP),
    "% key repeated": ('{{ ("%(a)s" * 800000) % {"a": "x" * 4000} }}', CAP),
    "~ doubling": (RING + '{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}', CAP),
    "+ doubling": (RING + '{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}', CAP),
    "list + doubling": (RING + '{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}', f"{CAP}|{BUILT}"),
    "bytes repeated": ('{{ "x".encode() * 400000000 }}', REPEAT),
    "number doubling": ("{% set ns = namespace(x=2 ** 64) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}"
                        "{% endfor %}{{ ns.x > 1 }}", r"a number of over \d+ bits"),
    # string methods the sandbox lets through
    "str.ljust": ('{{ "x".ljust(400000000) }}', CAP),
    "str.rjust": ('{{ "x".rjust(400000000) }}', CAP),
    "str.zfill": ('{{ "x".zfill(400000000) }}', CAP),
    "str.center": ('{{ "x".center(400000000) }}', CAP),
    "str.expandtabs": ('{{ "\\t".expandtabs(400000000) }}', CAP),
    "str.format width": ('{{ "{:>400000000}".format(1) }}', CAP),
    "str.format field repeated": ('{{ ("{0}" * 1000000).format("x" * 4000) }}', CAP),
    "str.replace": ('{{ ("a" * 100000).replace("a", "x" * 100000) }}', CAP),
    "str.join": ('{{ ("x" * 100000).join(["a"] * 100000) }}', CAP),
    "str.translate": ('{{ ("a" * 100000).translate({97: "x" * 100000}) }}', CAP),
    "int.to_bytes": ('{{ (1).to_bytes(400000000, "big")|length }}', CAP),
    # many results under the cap, or one printed 2**40 times
    "many live strings": (RING + '{% for i in range(1000) %}{% set ns.l = ns.l + [ns.s * 2000000 ~ i] %}'
                          '{% endfor %}', BUILT),
    "a block of copies": ('{% set big = "x" * 4000000 %}{% set b %}{% for i in range(1000) %}{{ big }}{% endfor %}'
                          '{% endset %}', CAP),
    "a list printed 2**40 times": (RING + '{% for i in range(40) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}'
                                   '{{ ns.l }}', CAP),
    # two such lists built apart: Python compares them element by element, 2**40 comparisons inside C
    "comparing shared lists": ('{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(40) %}'
                               '{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}'
                               '{{ ns.a == ns.b }}', COMPARED),
    "in over shared lists": ('{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(40) %}'
                             '{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}'
                             '{{ ns.a in [ns.b] }}', COMPARED),
    "sorting shared lists": ('{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(40) %}'
                             '{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}'
                             '{{ [ns.a, ns.b]|sort|length }}', COMPARED),
}

# peak memory is read from VmHWM, this process's own high-water mark: ru_maxrss keeps the one before exec (the
# parent's, pytest's, which would hide anything below it)
CHILD = r"""
import json, resource, sys, time
from pathlib import Path

def status(key):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key + ":")) << 10

resource.setrlimit(resource.RLIMIT_AS, (status("VmSize") + (3 << 30),) * 2)  # a runaway must not take the machine
import jinja2.sandbox, tokenizers  # imported before the baseline: the render is what is measured
from specrt.runtime.tokenizer import BundleTokenizer

before = status("VmHWM")
t0 = time.perf_counter()
try:
    BundleTokenizer(Path(sys.argv[1]), sys.argv[2]).render([{"role": "user", "content": "hi"}])
    outcome = {"error": None, "message": ""}
except Exception as exc:
    outcome = {"error": type(exc).__name__, "message": str(exc), "limit": getattr(exc, "limit", None)}
outcome["seconds"] = time.perf_counter() - t0
outcome["grown_mb"] = (status("VmHWM") - before) / (1 << 20)
print(json.dumps(outcome))
"""


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory) -> Path:
    """tokenizer.json and tokenizer_config.json: all a BundleTokenizer reads."""
    folder = tmp_path_factory.mktemp("tok")
    save_tiny_tokenizer(folder)
    return folder


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_templates_are_refused_quickly_and_small(name, tokenizer_folder):
    template, message = HOSTILE[name]
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, str(tokenizer_folder), template], capture_output=True,
                              text=True, timeout=RENDER_SECONDS + 30, cwd=tokenizer_folder)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name}: still rendering after {RENDER_SECONDS + 30:.0f} s")
    assert proc.returncode == 0, proc.stderr[-2000:]
    outcome = json.loads(proc.stdout.strip().splitlines()[-1])
    assert outcome["error"] == "TemplateError" and outcome["limit"], outcome
    assert "\n" not in outcome["message"] and outcome["message"].startswith("chat template: "), outcome
    assert re.search(message, outcome["message"]), outcome
    assert outcome["seconds"] < RENDER_SECONDS + 2, outcome
    assert outcome["grown_mb"] < 200, outcome


def _plain_render(template: str, messages, **variables) -> str:
    """What transformers' apply_chat_template renders: its own compiled template (its sandbox, no limits)."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template(template).render(messages=messages, **variables)


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|>{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}")
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather <in> a city & more.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TURNS = [{"role": "system", "content": "You are a bot."}, {"role": "user", "content": "Hi there, what's up?"},
         {"role": "assistant", "content": "", "tool_calls": [
             {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
         {"role": "tool", "name": "get_weather", "content": '{"celsius": 21}'},
         {"role": "assistant", "content": "It is 21 degrees."}, {"role": "user", "content": "thanks " * 500}]


@pytest.mark.parametrize("name", ["chatml", *TEMPLATES])
def test_real_templates_render_as_before(name, tokenizer_folder):
    """A regression guard: the bounded sandbox renders ChatML and the published templates' tool formats exactly as
    transformers does, with and without tools."""
    from specrt.runtime.tokenizer import BundleTokenizer

    template = CHATML if name == "chatml" else TEMPLATES[name]
    tok = BundleTokenizer(tokenizer_folder, template)
    for variables in ({}, {"tools": [TOOL]}):
        expected = _plain_render(template, TURNS, add_generation_prompt=True, bos_token="<s>",
                                 eos_token="<|im_end|>", **variables)
        assert tok.render(TURNS, variables=variables) == expected


def test_two_threads_render_at_once_each_within_its_own_budget(tokenizer_folder):
    """Each render asks range() for 991 000 of its 1 000 000 items, and loops 2 250 000 times over a list it
    builds (3.2 million of its 5 million steps): one budget shared by the two renders would refuse one of them."""
    from specrt.runtime.tokenizer import BundleTokenizer

    template = ("{% for i in range(990) %}{% for j in range(1000) %}{% endfor %}{% endfor %}"
                "{% for a in messages * 1500 %}{% for b in messages * 1500 %}{% endfor %}{% endfor %}"
                "{{ messages[0].content }}")
    tok = BundleTokenizer(tokenizer_folder, template)
    barrier, results = threading.Barrier(2), {}

    def render(name):
        barrier.wait()
        try:
            results[name] = tok.render([{"role": "user", "content": name}])
        except Exception as exc:  # noqa: BLE001 (reported below)
            results[name] = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=render, args=(name,)) for name in ("first", "second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=4 * RENDER_SECONDS)
    assert results == {"first": "first", "second": "second"}


def test_a_hostile_render_in_one_thread_leaves_the_other_alone(tokenizer_folder):
    """One thread's template runs past its steps while the other renders ChatML over and over: the first is
    refused, the second never is."""
    from specrt.runtime.tokenizer import BundleTokenizer, TemplateError

    hostile = BundleTokenizer(tokenizer_folder, "{% set xs = messages * 300 %}{% for a in xs %}{% for b in xs %}"
                                                "{% for c in xs %}{% endfor %}{% endfor %}{% endfor %}")
    chatml = BundleTokenizer(tokenizer_folder, CHATML)
    messages = [{"role": "user", "content": "hello"}]
    expected, outcome, done = _plain_render(CHATML, messages, add_generation_prompt=True), {}, threading.Event()

    def refuse():
        try:
            hostile.render(messages)
            outcome["hostile"] = "rendered"
        except TemplateError as exc:
            outcome["hostile"] = exc
        done.set()

    thread = threading.Thread(target=refuse)
    thread.start()
    renders = 0
    while not done.is_set():
        assert chatml.render(messages) == expected
        renders += 1
    thread.join()
    assert isinstance(outcome["hostile"], TemplateError) and outcome["hostile"].limit, outcome
    assert re.search(STEPS, str(outcome["hostile"])) and renders > 0


def _source_with_template(root: Path, template: str) -> Path:
    src = save_tiny_bundle_source("llama", root / "src")
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (src / "tokenizer_config.json").write_text(json.dumps(cfg))
    return src


def test_convert_refuses_a_template_past_the_limits(tmp_path, capsys):
    from specrt.cli import main

    src = _source_with_template(tmp_path, '{% for m in messages %}{{ m.content }}{% endfor %}{{ "x"|center(400000000) }}')
    out = tmp_path / "bundle"
    assert main(["convert", str(src), "-o", str(out), "--max-context", "64"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len([line for line in err if line.startswith("error: ")]) == 1, err
    assert "chat template goes past the runtime's limits" in err[-1] and "past the cap of" in err[-1], err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["src"]


@pytest.mark.parametrize("template", [
    "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}ok",
    "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{{ m.content }}{% endfor %}",
    "{{ messages[0].content.missing.deeper }}",
    "{% for m in messages %}",  # does not compile: the runtime says so when the bundle is loaded, as before
])
def test_convert_keeps_templates_that_fail_on_a_sample_within_the_limits(template, tmp_path):
    """Templates that raise on the sample conversations (Gemma's refuses a system message, Mistral's wants
    alternating turns) are not refused: only going past a limit is the template's fault."""
    from specrt.convert.tokenizer import write_tokenizer

    src = tmp_path / "src"
    src.mkdir()
    save_tiny_tokenizer(src)
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    (src / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": template}))
    out = tmp_path / "out"
    out.mkdir()
    info = write_tokenizer(src, "hf", out, (), None)
    assert info.chat_template == template and (out / "chat_template.jinja").read_text() == template
