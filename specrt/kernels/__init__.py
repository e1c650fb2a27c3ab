"""Triton kernels beside their CPU twins (arrive with the speculative issue)."""
