"""The torch reference of a sparse mixture-of-experts MLP (Qwen3-MoE, Qwen3.5-MoE), in the published checkpoints'
names.

A router (`gate.weight` [E, H]) scores every expert; softmax over all E, the top k kept (divided by their sum when
the config's norm_topk_prob says so); each kept expert is a SwiGLU MLP (`experts.{j}.{gate,up,down}_proj.weight`)
and the token's output is the routing-weighted sum of theirs, plus (Qwen3.5-MoE) a shared expert every token runs,
scaled by sigmoid(`shared_expert_gate.weight` x). gpt-oss (softmax over the top-k logits, which is the same
routing) has biases on the router and the experts and a clamped SwiGLU; its fused checkpoint tensors are read as
these per-expert names (models/gpt_oss_layout.py). transformers' Qwen3MoeSparseMoeBlock computes the
same; the ONNX graph computes it with ONNX Runtime's MoE / QMoE (convert/moe_graph.py).

Validation can make a router follow the graph's choice of experts (`follow`): two experts whose scores are nearly
tied may swap places between two correct implementations (rounding), and a swap late in a deep model moves every
later logit; the reference takes the graph's choice where it is a near-tie and counts where it is not.
"""

from __future__ import annotations

import torch
from torch import nn

from specrt.models.config import ModelConfig


class Expert(nn.Module):
    """down(swiglu(gate(x), up(x))); gpt-oss: biased, gate clamped above and up on both sides at `limit`, the gate's
    sigmoid at alpha, up offset by beta."""

    def __init__(self, hidden: int, width: int, cfg: ModelConfig | None = None):
        super().__init__()
        bias = bool(cfg and cfg.moe_bias)
        self.gate_proj = nn.Linear(hidden, width, bias=bias)
        self.up_proj = nn.Linear(hidden, width, bias=bias)
        self.down_proj = nn.Linear(width, hidden, bias=bias)
        self.alpha, self.limit, self.beta = (cfg.swiglu_alpha, cfg.swiglu_limit, cfg.swiglu_beta) if cfg else (1, 0, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, H] -> [N, H]
        g, u = self.gate_proj(x), self.up_proj(x)
        if self.limit:
            g, u = g.clamp(max=self.limit), u.clamp(-self.limit, self.limit)
        return self.down_proj(g * torch.sigmoid(self.alpha * g) * (u + self.beta))


ROUTE_TIE = 1e-2  # a followed expert's log-probability may be this much (times the row's spread) below the k-th
ROUTE_TIE_FP16 = 1e-1  # the same for a graph with float16 activations (a GPU graph: convert/gpu_profile.py)


class ExpertChoice:
    """The top k of a router's probabilities, or the ids another implementation chose (`follow` [N, k], set before
    the call) where each chosen expert scores within ROUTE_TIE of the k-th best; counts what it followed."""

    def __init__(self):
        self.follow: torch.Tensor | None = None
        self.tie = ROUTE_TIE  # the near-tie a followed choice may be within
        self.followed = 0  # tokens whose followed choice differs from the top k (near-ties)
        self.refused: list[tuple[int, float]] = []  # (token, gap in spreads): choices beyond a near-tie

    def __call__(self, probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """probs [N, E] float32 -> (the chosen probabilities [N, k], expert ids [N, k])."""
        top, ids = torch.topk(probs, k, dim=-1)
        if self.follow is None:
            return top, ids
        follow, self.follow = self.follow.to(torch.int64), None
        if follow.shape != ids.shape:
            raise ValueError(f"followed expert ids {tuple(follow.shape)} do not match the router's {tuple(ids.shape)}")
        logp = torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))  # [N, E]
        spread = logp.std(dim=-1).clamp_min(1e-6)  # [N]
        gap = (logp.gather(-1, ids[:, -1:]) - logp.gather(-1, follow)).amax(-1) / spread  # [N] worst, in spreads
        differs = (follow.sort(-1).values != ids.sort(-1).values).any(-1)  # [N]
        self.followed += int(differs.sum())
        self.refused += [(int(t), float(gap[t])) for t in torch.nonzero(differs & (gap > self.tie)).flatten()]
        return probs.gather(-1, follow), follow


class SparseMoE(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.top_k, self.normalize = cfg.experts_per_token, cfg.norm_topk_prob
        self.choice = ExpertChoice()
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=cfg.moe_bias)
        self.experts = nn.ModuleList(Expert(cfg.hidden_size, cfg.moe_intermediate_size, cfg)
                                     for _ in range(cfg.num_experts))
        if cfg.shared_expert_size:  # Qwen3.5-MoE: every token also runs this expert, scaled by a sigmoid gate
            self.shared_expert = Expert(cfg.hidden_size, cfg.shared_expert_size)
            self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, H] -> (routing weights [N, k], expert ids [N, k])."""
        probs = torch.softmax(self.gate(x).float(), dim=-1)  # [N, E]
        weights, ids = self.choice(probs, self.top_k)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, S, H] -> [B, S, H]
        flat = x.reshape(-1, x.shape[-1])
        weights, ids = self.route(flat)
        out = torch.zeros_like(flat)
        for e in ids.unique().tolist():  # only the experts some token chose run
            rows, slot = torch.nonzero(ids == e, as_tuple=True)
            out.index_add_(0, rows, self.experts[e](flat[rows]) * weights[rows, slot, None])
        if hasattr(self, "shared_expert"):
            out = out + torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        return out.reshape(x.shape)
