"""Held-back top-1 agreement by block position of several DFlash checkpoints on one common set, the last N
sequences of the first 960k tokens of ShareGPT (beyond what a run with --max-tokens 640000 trains on or holds
back), so drafters trained on different amounts of data are compared on the same sequences. --stream T takes
the last N sequences of the first T tokens instead (T = a run's --max-tokens and N = its held-back count: that
run's held-back set).

    python scripts/dflash_recipe/compare_heads.py 48 FOLDER [FOLDER ...] [--stream 960000]
"""

import argparse
from pathlib import Path


def main(count: int, folders: list[str], stream: int = 960_000) -> None:
    import numpy as np
    import torch

    from specrt.convert import sources
    from specrt.convert.pipeline import _torch_model
    from specrt.datasets import load_conversations
    from specrt.models.dflash import load_dflash_checkpoint, model_from_tensors
    from specrt.train.dflash import DFlashTrainee, held_back_agreement
    from specrt.train.recipe import _tokenize

    loaded = sources.load(sources.resolve("smollm2-135m-instruct", log=lambda m: None))
    held = _tokenize(loaded, load_conversations(None), stream, 256)[-count:]
    target = _torch_model(loaded.config, loaded.weights)
    embed = torch.from_numpy(np.array(loaded.weights["model.embed_tokens.weight"], dtype=np.float32))  # tied
    for folder in folders:
        cfg, tensors = load_dflash_checkpoint(Path(folder), loaded.config)
        trainee = DFlashTrainee(model_from_tensors(cfg, tensors), embed, embed, None)
        print(folder, held_back_agreement(target, trainee, held), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("count", metavar="N", type=int, help="held-back sequences to score")
    ap.add_argument("folders", metavar="FOLDER", nargs="+", help="DFlash checkpoint folders")
    ap.add_argument("--stream", type=int, default=960_000, help="take the last N sequences of the first T tokens")
    args = ap.parse_args()
    main(args.count, args.folders, args.stream)
