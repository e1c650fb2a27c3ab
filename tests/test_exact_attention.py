"""Batch-invariant mode's attention (convert/exact_attention.py): a token's logits are the same bits whichever
call computes it, at head sizes 64, 256 and 512. At head sizes 256 and 512 GroupQueryAttention's own output rounds a token by the key count of its
call (near 64 keys at 256, 96 at 512); these prefixes put one-token calls on one side of such a count and
multi-token calls on the other."""

import numpy as np
import pytest

from specrt.cli import main
from tests.tiny_models import save_tiny_bundle_source


@pytest.mark.parametrize("arch, prefixes", [("llama_wide_heads", range(56, 66)),
                                            ("llama_wider_heads", range(88, 98)),
                                            ("llama", range(56, 66))])
def test_a_token_rounds_alike_in_any_call(tmp_path, arch, prefixes):
    """At 256 and 512 through the exact path; at a head size of 128 or less GroupQueryAttention is one K block in
    every call, so the graph has no exact path (no If) and still rounds alike."""
    import onnx

    import specrt

    src = save_tiny_bundle_source(arch, tmp_path / "src")
    out = tmp_path / "bundle"
    assert main(["convert", str(src), "-o", str(out), "--max-context", "128"]) == 0
    engine = specrt.load(str(out), device="cpu", batch_invariant=True)
    assert engine.manifest.target.exact_attention  # a CPU graph: catalog bundles without it are converted again
    ifs = sum(n.op_type == "If" for n in onnx.load(str(out / "target.onnx"), load_external_data=False).graph.node)
    assert (ifs > 0) == (arch != "llama"), ifs
    target = engine.target
    assert target.attention_min_rows == 2
    ids = np.random.default_rng(0).integers(3, 90, size=prefixes[-1] + 8)
    for prefix in prefixes:
        rows = {}
        for split in ([1] * 8, [4, 4], [3, 3, 2], [8]):
            target.reset()
            target.forward(ids[None, :prefix])
            logits, pos = [], prefix
            for n in split:
                logits.append(target.forward(ids[None, pos:pos + n])[0])
                pos += n
            rows[tuple(split)] = np.concatenate(logits)  # [8, V]
        one = rows[(1,) * 8]
        for split, got in rows.items():
            assert np.array_equal(got, one), (prefix, split, float(np.abs(got - one).max()))
