"""Chat templates in the shape of the published ones' tool formats, over the default model's ChatML turns (the
published templates themselves cannot be fetched here; these write calls and take results the way they do):
Qwen2.5's hermes blocks, Qwen3.5's XML calls, Llama 3.1's JSON answer, Gemma 4's call syntax and tool_responses,
gpt-oss's harmony messages. Their markers are ordinary text in the default model's vocabulary."""

HERMES = (
    "{%- if tools %}<|im_start|>system\nYou may call these tools:\n<tools>\n{%- for tool in tools %}\n"
    "{{ tool | tojson }}{%- endfor %}\n</tools>\nTo call one, write <tool_call>\n{\"name\": NAME, \"arguments\": "
    "ARGS}\n</tool_call><|im_end|>\n{%- endif %}"
    "{%- for m in messages %}\n<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}\n<tool_call>\n{{ {'name': c.function.name, 'arguments': "
    "c.function.arguments} | tojson }}\n</tool_call>{%- endfor %}<|im_end|>{%- endfor %}"
    "{%- if add_generation_prompt %}\n<|im_start|>assistant\n{%- endif %}"
)

QWEN_XML = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}"
    "{%- endfor %}{{- '\\n</tools>\\nTo call a function write:\\n<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\n"
    "VALUE\\n</parameter>\\n</function>\\n</tool_call><|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}{{- '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response>"
    "<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content }}"
    "{%- for c in m.tool_calls or [] %}{{- '<tool_call>\\n<function=' + c.function.name + '>\\n' }}"
    "{%- for k, v in c.function.arguments | items %}{{- '<parameter=' + k + '>\\n' }}"
    "{{- v if v is string else v | tojson }}{{- '\\n</parameter>\\n' }}{%- endfor %}"
    "{{- '</function>\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)

LLAMA3 = (
    "{%- set ns = namespace(listed=false) %}{%- for m in messages %}"
    "{%- if m.role == 'tool' %}{{- '<|im_start|>ipython\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- elif m.tool_calls %}{{- '<|im_start|>assistant\\n' }}{%- for c in m.tool_calls %}"
    "{{- '{\"name\": \"' + c.function.name + '\", \"parameters\": ' }}{{- c.function.arguments | tojson }}{{- '}' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content }}"
    "{%- if tools and m.role == 'user' and not ns.listed %}{%- set ns.listed = true %}{{- '\\nGiven these functions, answer with a call as "
    "{\"name\": function name, \"parameters\": dictionary of arguments}.' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

GEMMA4 = (
    "{%- macro arg(v) -%}{%- if v is string -%}{{- '<|\"|>' + v + '<|\"|>' -}}"
    "{%- elif v is mapping -%}{{- '{' -}}{%- for k, x in v | dictsort -%}{{- k + ':' + arg(x) -}}"
    "{%- if not loop.last %},{% endif -%}{%- endfor -%}{{- '}' -}}"
    "{%- else -%}{{- v | tojson -}}{%- endif -%}{%- endmacro -%}"
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- for tool in tools %}{{- '<|tool>declaration:' + "
    "tool.function.name }}{{- tool.function.parameters | tojson }}{{- '<tool|>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}{{- '<|im_start|>' + ('model' if m.role == 'assistant' else m.role) + '\\n' }}"
    "{%- for c in m.tool_calls or [] %}{{- '<|tool_call>call:' + c.function.name + arg(c.function.arguments) + "
    "'<tool_call|>' }}{%- endfor %}"
    "{%- for r in m.tool_responses or [] %}{{- '<|tool_response>response:' + r.name + arg(r.response) + "
    "'<tool_response|>' }}{%- endfor %}"
    "{{- m.content }}{%- if not (m.tool_responses and not m.content) %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt and not (messages[-1].tool_responses and not messages[-1].content) %}"
    "{{- '<|im_start|>model\\n' }}{%- endif %}"
)

HARMONY = (
    "{%- if tools %}{{- '<|im_start|>developer\\n# Tools\\nnamespace functions {\\n' }}{%- for tool in tools %}"
    "{{- 'type ' + tool.function.name + ' = (_: ' }}{{- tool.function.parameters | tojson }}{{- ') => any;\\n' }}"
    "{%- endfor %}{{- '}<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}{{- '<|im_start|>functions.' + (m.name or 'tool') + ' to=assistant\\n' + m.content + "
    "'<|im_end|>\\n' }}"
    "{%- elif m.tool_calls %}{%- for c in m.tool_calls %}{{- '<|im_start|>assistant\\n<|channel|>commentary "
    "to=functions.' + c.function.name + ' <|constrain|>json<|message|>' }}"
    "{{- c.function.arguments | tojson }}{{- '<|call|><|im_end|>\\n' }}{%- endfor %}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

TEMPLATES = {"hermes": HERMES, "qwen_xml": QWEN_XML, "llama3": LLAMA3, "gemma4": GEMMA4, "harmony": HARMONY}

# the markers that are single special tokens in Gemma 4's and gpt-oss's own vocabularies (bundle_with_markers)
MARKERS = {"gemma4": ("<|tool_call>", "<tool_call|>", '<|"|>', "<|channel>", "<channel|>"),
           "harmony": ("<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|start|>", "<|call|>", "<|return|>")}


def bundle_with_markers(bundle, folder, markers: list[str], template: str | None = None):
    """A copy of bundle (its files hard-linked where they can be) whose vocabulary's last len(markers) entries are those
    markers, as special tokens: a format's markers are single special tokens there, as in their own models'
    vocabularies (the merges that made the replaced entries are dropped)."""
    import json
    import os
    import shutil
    from pathlib import Path

    bundle, folder = Path(bundle), Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for f in bundle.iterdir():
        if f.name not in ("tokenizer.json", "specrt.json") and not (template and f.name == "chat_template.jinja"):
            try:
                os.link(f, folder / f.name)
            except OSError:
                shutil.copy2(f, folder / f.name)
    tok = json.loads((bundle / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    by_id = {i: t for t, i in vocab.items()}
    ids = list(range(len(vocab) - len(markers), len(vocab)))
    replaced = {by_id[i] for i in ids}
    for marker, i in zip(markers, ids):
        del vocab[by_id[i]]
        vocab[marker] = i
        tok["added_tokens"].append({"id": i, "content": marker, "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": True})
    tok["model"]["merges"] = [m for m in tok["model"]["merges"]
                              if ("".join(m) if isinstance(m, list) else m.replace(" ", "")) not in replaced]
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    from specrt.bundle import file_entry

    manifest = json.loads((bundle / "specrt.json").read_text())  # the manifest's checksum of the new tokenizer
    if template:
        (folder / "chat_template.jinja").write_text(template)
        manifest["chat_template"] = template
    for name in ("tokenizer.json", "chat_template.jinja") if template else ("tokenizer.json",):
        entry = file_entry(folder / name)
        manifest["files"][name] = {"size": entry.size, "sha256": entry.sha256}
    (folder / "specrt.json").write_text(json.dumps(manifest))
    return folder, dict(zip(markers, ids))
