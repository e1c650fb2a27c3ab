"""An independent small LM with the target's tokenizer, run as its own ONNX graph with its own KV cache."""

from specrt.drafters.draft_model.drafter import DraftModelDrafter

__all__ = ["DraftModelDrafter"]
