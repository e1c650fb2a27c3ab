"""Peak memory and time of one drafter's conversion stages alone (build + validate its graph), without converting
the target again: what `specrt convert SOURCE --drafter SPEC` spends on that drafter.

    python scripts/measure_drafter_stage.py SOURCE SPEC [--precision int4] [--max-context 2048]
    e.g. python scripts/measure_drafter_stage.py 9B/target mtp

Prints the stage peaks (the same StagePeaks convert reports) and the process's peak resident memory.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from specrt.convert import sources
    from specrt.convert.drafter_bundle import add_drafter, drafter_specs
    from specrt.convert.memory import StagePeaks
    from specrt.convert.pipeline import Stages
    from specrt.runtime.providers import providers_for

    ap = argparse.ArgumentParser()
    ap.add_argument("source")
    ap.add_argument("spec")
    ap.add_argument("--precision", default="int4")
    ap.add_argument("--max-context", type=int, default=2048)
    args = ap.parse_args()

    class Log(Stages):
        def log(self, msg: str) -> None:
            print(msg, file=sys.stderr)

    stages = StagePeaks(Log())
    loaded = sources.load(sources.resolve(args.source))
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        (spec,) = drafter_specs(args.spec)
        add_drafter(spec, Path(tmp), loaded, args.precision, args.max_context, providers_for("cpu"), stages, None)
    stages.close()
    print(f"{args.spec}: {time.perf_counter() - t0:.0f} s; stage peaks: {stages.summary()}; process peak "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
