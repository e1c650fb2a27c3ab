"""The EAGLE-style probe: predict x_{a+1} from [embed(x_a), features(a-1)] directly, without attention (one
MLP), on the same cached data and with the same 4 x 32 examples per step as the DFlash runs of sweep.py. It
tells whether the information is there and how fast a direct path learns it.

    python scripts/dflash_recipe/probe.py        # needs cache96.pt (cache_features.py)
"""

import time

import numpy as np
import torch
import torch.nn.functional as F

from specrt.convert import sources

H = 576
loaded = sources.load(sources.resolve("smollm2-135m-instruct"))
w = loaded.weights
c = torch.load("cache96.pt")
ids, feats, top_ids, top_p = c["ids"], c["feats"].float(), c["top_ids"].long(), c["top_p"].float()
embed = torch.from_numpy(np.array(w["model.embed_tokens.weight"], dtype=np.float32))
vocab = torch.unique(torch.cat([top_ids[..., :4].flatten(), ids.flatten()]))  # the same reduced vocabulary
remap = torch.full((embed.shape[0],), -1, dtype=torch.long)
remap[vocab] = torch.arange(len(vocab))
head = embed[vocab]
top_ids = remap[top_ids]
top_p = torch.where(top_ids >= 0, top_p, 0.0)
top_ids = top_ids.clamp_min(0)
final_norm = torch.from_numpy(np.array(w["model.norm.weight"], dtype=np.float32))


class Probe(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3 * H, H, bias=False)
        self.n1, self.n2, self.out = torch.nn.RMSNorm(H), torch.nn.RMSNorm(H), torch.nn.RMSNorm(H)
        self.up, self.down = torch.nn.Linear(2 * H, 1536), torch.nn.Linear(1536, H)
        with torch.no_grad():
            self.out.weight.copy_(final_norm)

    def forward(self, e, f):  # e [A, H] embedding of x_a, f [A, 3H] features of position a - 1
        x = torch.cat([self.n1(e), self.n2(self.fc(f))], -1)
        return self.out(self.down(F.silu(self.up(x))))


model = Probe()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
n, length = len(ids), ids.shape[1]
held, train = range(n - 8, n), list(range(n - 8))
rng = np.random.default_rng(0)


def loss_of(i, a):
    log_q = F.log_softmax(model(embed[ids[i][a]], feats[i][a - 1]) @ head.t(), -1)
    loss = -(top_p[i][a] * log_q.gather(-1, top_ids[i][a])).sum(-1).mean()
    return loss, (log_q.argmax(-1) == top_ids[i][a][:, 0]).float().mean()


t0 = time.time()
for step in range(401):
    if step % 50 == 0:
        with torch.no_grad():
            agree = np.mean([loss_of(i, torch.arange(1, length - 8))[1].item() for i in held])
        print("held", step, round(float(agree), 3), round(time.time() - t0), flush=True)
    total = 0
    for i in rng.choice(train, 4, replace=False):
        a = torch.from_numpy(rng.choice(np.arange(1, length - 8), 32, replace=False))
        total = total + loss_of(int(i), a)[0] / 4
    opt.zero_grad()
    total.backward()
    opt.step()
