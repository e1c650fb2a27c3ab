"""DFlash block-diffusion drafting (models/dflash.py): drafter, confidence cut, training."""

from specrt.drafters.dflash.drafter import DFlashDrafter

__all__ = ["DFlashDrafter"]
