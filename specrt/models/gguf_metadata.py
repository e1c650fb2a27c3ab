"""Reading one architecture's GGUF metadata keys (`{arch}.{key}`), for the per-layout readers (archs/qwen3_5_gguf.py,
archs/gemma4_gguf.py)."""

from __future__ import annotations

from specrt.errors import SourceError


def arch_fields(reader, field_value, arch: str):
    """(field(key, default=None), need(key)) over `{arch}.{key}`: need is a SourceError naming the key where the
    file lacks it."""
    def field(key: str, default=None):
        return field_value(reader, f"{arch}.{key}", default)

    def need(key: str):
        value = field(key)
        if value is None:
            raise SourceError(f"GGUF metadata {arch}.{key} is missing (a {arch} file needs it)")
        return value

    return field, need
