"""Torch definitions of target architectures written for export, and their weight loaders."""
