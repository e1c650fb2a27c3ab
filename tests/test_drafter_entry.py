"""The manifest's drafter entries are checked when the manifest is read: a malformed entry is a one-line
BundleError naming the entry and the field (specrt/drafter_entry.py)."""

from __future__ import annotations

import copy
import json
import re
import shutil

import pytest

from specrt.bundle import MANIFEST
from specrt.cli import main
from specrt.drafter_entry import check_drafter_entries
from specrt.errors import BundleError
from tests.tiny_models import save_tiny_bundle_source

KV = {"layers": 1, "kv_heads": 2, "head_dim": 8, "max_context": 96, "dtype": "float32"}
ENTRIES = {
    "draft-model": {"kind": "draft-model", "graph": {"file": "draft.onnx", "data_file": "draft.onnx.data"}, "kv": KV,
                    "vocab_size": 100, "model_config": {}},
    "eagle3": {"kind": "eagle3", "graph": {"file": "eagle3.onnx", "data_file": "eagle3.onnx.data", "hidden_size": 16},
               "kv": KV, "draft_vocab_size": 50, "target_hidden_size": 16, "aux_layers": [0, 1, 2],
               "extra_files": ["eagle3.d2t.safetensors"]},
    "dflash": {"kind": "dflash", "graph": {"file": "dflash.onnx", "data_file": "dflash.onnx.data", "hidden_size": 16},
               "kv": KV, "block_size": 8, "mask_token_id": 3, "target_hidden_size": 16, "vocab_size": 100,
               "target_layer_ids": [1, 2]},
}


def test_well_formed_entries_pass_and_unknown_kinds_are_kept():
    entries = [*ENTRIES.values(), {"kind": "from-a-newer-specrt", "anything": 1}]
    checked = check_drafter_entries(entries)
    assert [e.raw for e in checked] == entries and [e.kind for e in checked] == [*ENTRIES, "from-a-newer-specrt"]
    assert checked[1].aux_layers == (0, 1, 2) and checked[1].kv.max_context == 96  # typed
    assert checked[1].files() == {"eagle3.onnx", "eagle3.onnx.data", "eagle3.d2t.safetensors"}


@pytest.mark.parametrize("kind, edit, message", [
    ("draft-model", lambda e: e.pop("graph"), "the draft-model drafter (drafters[0]) lacks 'graph'"),
    ("draft-model", lambda e: e["kv"].pop("layers"), "kv lacks 'layers'"),
    ("draft-model", lambda e: e["kv"].update(max_context="4096"), "'max_context' must be a positive integer"),
    ("draft-model", lambda e: e["kv"].update(max_context=-1), "'max_context' must be a positive integer"),
    ("eagle3", lambda e: e.pop("aux_layers"), "lacks 'aux_layers'"),
    ("eagle3", lambda e: e.update(aux_layers=["2"]), "'aux_layers' must be a list of layer indices"),
    ("eagle3", lambda e: e["graph"].pop("hidden_size"), "graph lacks 'hidden_size'"),
    ("eagle3", lambda e: e.update(extra_files="eagle3.d2t"), "'extra_files' must be a list"),
    ("dflash", lambda e: e.update(block_size=True), "'block_size' must be a positive integer"),
    ("dflash", lambda e: e.update(graph="dflash.onnx"), "'graph' must be an object"),
    ("dflash", lambda e: e.pop("kind"), "drafters[0] has no 'kind'"),
])
def test_malformed_entries_name_the_field(kind, edit, message):
    entry = copy.deepcopy(ENTRIES[kind])
    edit(entry)
    with pytest.raises(BundleError, match=re.escape(message)):
        check_drafter_entries([entry])


@pytest.mark.parametrize("drafters, message", [("eagle3", "must be a list of objects"),
                                               (["eagle3"], "drafters\\[0\\] must be an object")])
def test_drafters_must_be_a_list_of_objects(drafters, message):
    with pytest.raises(BundleError, match=message):
        check_drafter_entries(drafters)


def test_a_bundle_with_a_broken_drafter_entry_is_a_one_line_error(tmp_path, capsys):
    src = save_tiny_bundle_source("llama", tmp_path / "src", seed=0)
    bundle = tmp_path / "b"
    assert main(["convert", str(src), "-o", str(bundle), "--max-context", "64", "--drafter", f"draft-model:{src}"]) == 0
    for command in (["info", str(bundle)], ["generate", str(bundle), "--prompt", "the cat", "--max-new-tokens", "4",
                                            "--drafter", "draft-model", "--device", "cpu"]):
        broken = tmp_path / "broken"
        shutil.rmtree(broken, ignore_errors=True)
        shutil.copytree(bundle, broken)
        manifest = json.loads((broken / MANIFEST).read_text())
        del manifest["drafters"][0]["graph"]
        (broken / MANIFEST).write_text(json.dumps(manifest))
        command[1] = str(broken)
        capsys.readouterr()
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error:") and "lacks 'graph'" in err and len(err.splitlines()) == 1
