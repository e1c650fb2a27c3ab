"""Drafters, one subpackage per kind (arrive with the speculative issues)."""
