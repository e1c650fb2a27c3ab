"""Gemma 4's assistant drafter (drafter.py)."""

from specrt.drafters.assistant.drafter import AssistantDrafter

__all__ = ["AssistantDrafter"]
