"""Cache the target's features and top-16 next-token distributions for the DFlash recipe experiments
(docs/perf.md, issue 7, "Why the first DFlash drafter was weak").

    python scripts/dflash_recipe/cache_features.py 96   # -> cache96.pt: 96 ShareGPT sequences of 256 tokens

Holds ids [N, 256], feats [N, 256, 3 * 576] (fp16, the EAGLE-3 taps 2, 15, 27), top_ids / top_p [N, 256, 16].
"""

import sys

import numpy as np
import torch

from specrt.convert import sources
from specrt.convert.pipeline import _torch_model
from specrt.datasets import load_conversations
from specrt.train.dflash import target_pass
from specrt.train.recipe import _tokenize
from specrt.models.eagle3 import default_aux_layers

n = int(sys.argv[1])
loaded = sources.load(sources.resolve("smollm2-135m-instruct"))
seqs = _tokenize(loaded, load_conversations(None), n * 260, 256)[:n]
target = _torch_model(loaded.config, loaded.weights)
layers = tuple(default_aux_layers(loaded.config.num_layers))
feats, top_ids, top_p = [], [], []
for i in range(0, n, 8):
    ids = torch.from_numpy(np.stack(seqs[i:i + 8]).astype(np.int64))
    f, logits = target_pass(target, ids, layers)
    top = torch.softmax(logits.float(), -1).topk(16, -1)
    feats.append(f.half())
    top_ids.append(top.indices.int())
    top_p.append(top.values.half())
torch.save({"ids": torch.from_numpy(np.stack(seqs).astype(np.int64)), "feats": torch.cat(feats),
            "top_ids": torch.cat(top_ids), "top_p": torch.cat(top_p)}, f"cache{n}.pt")
