"""EAGLE-3 drafting (Li et al. 2025): the head's graph (convert/eagle3_graph.py) reads three of the target's
layers and predicts over a reduced draft vocabulary mapped back by d2t; chain and tree drafting as
drafters/feature_head.py describes."""

from __future__ import annotations

from specrt.drafters.feature_head import FeatureHeadDrafter


class Eagle3Drafter(FeatureHeadDrafter):
    name = "eagle3"
