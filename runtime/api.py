"""`specrt.load(model, device=..., drafter=...)`: a ready Engine from a bundle path or a catalog name.

A catalog name is converted into the cache on first use (`<cache>/bundles/<name>-<precision>`), which
needs the `[convert]` extra; later loads open the cached bundle in seconds.
"""

from __future__ import annotations

from pathlib import Path

from specrt.bundle import MANIFEST, load_bundle
from specrt.catalog import CATALOG, DEFAULT_MODEL, cache_dir
from specrt.errors import SpecrtError
from specrt.runtime.engine import Engine
from specrt.runtime.providers import providers_for


def _ngram():
    from specrt.drafters.ngram import NgramDrafter

    return NgramDrafter()


# drafter name -> factory; draft-model, eagle3, mtp and dflash arrive with their issues
DRAFTERS = {"none": lambda: None, "ngram": _ngram}


def resolve_bundle(model: str, precision: str = "int4", stages=None) -> Path:
    """Path of a bundle for `model` (a bundle folder, or a catalog name converted on first use)."""
    path = Path(model).expanduser()
    if path.is_dir() and (path / MANIFEST).is_file():
        return path
    catalog_names = tuple(CATALOG)
    if model in catalog_names:
        bundle = cache_dir() / "bundles" / f"{model}-{precision}"
        if not (bundle / MANIFEST).is_file():
            try:
                from specrt.convert.pipeline import ConvertOptions, convert
            except ImportError:
                raise SpecrtError(f"{model} is not converted yet and conversion needs: pip install 'specrt[convert]'") from None
            bundle.parent.mkdir(parents=True, exist_ok=True)
            convert(model, bundle, ConvertOptions(precision=precision, force=True), stages)
        return bundle
    if path.exists():
        raise SpecrtError(f"{path} is not a specrt bundle (make one with: specrt convert {path} -o BUNDLE)")
    raise SpecrtError(f"unknown model {model!r} (catalog: {', '.join(catalog_names)}; or give a bundle folder)")


def load(model: str = DEFAULT_MODEL, device: str = "auto", drafter: str | None = None, precision: str = "int4",
         threads: int = 0, stages=None) -> Engine:
    if drafter is not None and drafter not in DRAFTERS:
        raise SpecrtError(f"drafter {drafter!r} is not available yet (available: {', '.join(DRAFTERS)})")
    providers = providers_for(device)
    bundle = resolve_bundle(model, precision, stages)
    manifest = load_bundle(bundle, check_hashes=False)  # sizes on every load; `specrt info` checks sha256
    return Engine(bundle, manifest, providers, threads=threads, drafter=DRAFTERS[drafter or "none"]())
