"""Does a token's logits depend on how tokens are grouped into target calls? For each bundle and each mode (default,
batch-invariant), 10 random tokens after a prompt are fed one per call, as one call, as 4+4+2 and as 3+1+5+1; prints
the largest logit difference from the one-call run and whether the argmaxes agree.
Usage: python scripts/call_rounding.py BUNDLE [BUNDLE ...]
"""

from __future__ import annotations

import argparse

import numpy as np

import specrt


def logits_of(target, prompt: list[int], tokens: list[int], chunks: list[int]) -> np.ndarray:
    """[len(tokens), V] logits of tokens fed after the prompt in calls of these sizes."""
    target.reset()
    target.forward(np.array([prompt]))
    rows, at = [], 0
    for size in chunks:
        out = target.forward(np.array([tokens[at:at + size]]))
        rows.append((out[0] if isinstance(out, tuple) else out)[0])
        at += size
    return np.concatenate(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundles", metavar="BUNDLE", nargs="+")
    for bundle in ap.parse_args().bundles:
        for exact in (False, True):
            engine = specrt.load(bundle, device="cpu", drafter="none", batch_invariant=exact)
            prompt = engine.prompt_ids("Write a haiku about the sea and the sky and the long summer night.")
            tokens = np.random.default_rng(0).integers(0, engine.manifest.vocab_size, 10).tolist()
            whole = logits_of(engine.target, prompt, tokens, [10])
            cells = []
            for chunks in ([1] * 10, [4, 4, 2], [3, 1, 5, 1]):
                other = logits_of(engine.target, prompt, tokens, chunks)
                same = bool((other.argmax(-1) == whole.argmax(-1)).all())
                cells.append(f"{'+'.join(map(str, chunks)) if len(chunks) < 10 else '1 x 10'}: "
                             f"{np.abs(other - whole).max():.2e}{'' if same else ' (argmax differs)'}")
            print(f"{bundle} {engine.manifest.target.precision} {'batch-invariant' if exact else 'default'}: "
                  + "; ".join(cells))


if __name__ == "__main__":
    main()
