"""What a chat template can see is what transformers' apply_chat_template gives it (issue 49's first part), inside
the bounded sandbox of issue 48: each template below renders through runtime/template_sandbox.py exactly as through
transformers' own compiled template (transformers.utils.chat_template_utils), on the same messages and tools."""

from __future__ import annotations

import pytest

from specrt.runtime.template_sandbox import TemplateError, compile_template, render_cap, render_template

MESSAGES = [{"role": "system", "content": "Réponds en français."},
            {"role": "user", "content": "Quel temps fait-il à Besançon? <b>vite</b> & 'bien'"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Météo d'une ville",
                                           "parameters": {"type": "object", "required": ["city"],
                                                          "properties": {"city": {"type": "string"}}}}}]

TEMPLATES = {
    # Qwen's and Llama 3.1's tool prompts: tools as JSON in their own key order, non-ASCII kept (jinja's tojson sorted
    # the keys and wrote caf\u00e9)
    "tojson of tools": "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}{{ messages[-1].content }}",
    "tojson with an indent": "{{ tools[0] | tojson(indent=4) }}",
    # gpt-oss's tool results: a literal marker plus tojson (jinja's Markup escaped the marker into &lt;|message|&gt;)
    "a marker plus tojson": '{{ "<|start|>functions.f to=assistant<|message|>" + messages[-1].content | tojson }}',
    # gpt-oss and Llama 3.1 date their system message
    "strftime_now": '{{ "Current date: " + strftime_now("%Y-%m") }}',
    # transformers enables {% break %} and {% continue %}
    "loop controls": "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}{{ m.content }}"
                     "{% break %}{% endfor %}",
    # transformers' {% generation %} block (training masks): its body, rendered
    "generation block": "{% for m in messages %}{% generation %}[{{ m.role }}]{% endgeneration %}{% endfor %}",
}


def _transformers(source: str, **variables) -> str:
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template(source).render(**variables)


def _specrt(source: str, **variables) -> str:
    return render_template(compile_template(source), MESSAGES, render_cap(MESSAGES), **variables)


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_templates_render_as_transformers_renders_them(name):
    variables = dict(tools=TOOLS, add_generation_prompt=True, bos_token="", eos_token="")
    want = _transformers(TEMPLATES[name], messages=MESSAGES, **variables)
    assert _specrt(TEMPLATES[name], **variables) == want
    if name == "tojson of tools":  # what jinja's own tojson gave instead
        assert '{"type": "function", "function": {"name": "get_weather", "description": "Météo' in want
    if name == "a marker plus tojson":
        assert "<|message|>" in want and "&lt;" not in want


def test_a_namespace_refuses_underscore_attributes_as_transformers_does():
    with pytest.raises(TemplateError, match="underscore"):
        _specrt("{% set ns = namespace(_x=1) %}{{ ns._x }}")
    assert _specrt("{% set ns = namespace(x=1) %}{% set ns.x = ns.x + 1 %}{{ ns.x }}") == "2"


def test_tojson_is_still_bounded():
    """transformers' tojson inside issue 48's limits: an indent past TOJSON_INDENT is refused before it is built."""
    with pytest.raises(TemplateError, match="tojson indent"):
        _specrt("{{ [[1]] | tojson(indent=400000000) }}")
