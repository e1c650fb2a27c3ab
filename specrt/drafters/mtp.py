"""MTP drafting: the target's own multi-token-prediction module (convert/mtp_graph.py) reads the target's last
hidden state and predicts over the whole vocabulary; chained (and tree) drafting as drafters/feature_head.py
describes, the one module repeated for every draft step."""

from __future__ import annotations

from specrt.drafters.feature_head import FeatureHeadDrafter


class MtpDrafter(FeatureHeadDrafter):
    name = "mtp"
