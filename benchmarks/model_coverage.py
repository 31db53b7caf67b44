"""Which torchvision models convert, by family and by path (traced by torch.fx, or untraced).

Every model of the families asked (``tests/zoo.py``: every classifier, and every detection, segmentation, video,
optical-flow and quantizable model) is built without weights and checked by ``zoo.check_conversion``, the check
``pytest -m zoo`` runs: subnetworks equal to the original right after conversion, equal to their exports after
perturbing every partition, every parameter partitioned. One row per model: its family, the path it took, whether
it passed (and the first line of what failed), its seconds. ``docs/conversion.md``'s coverage table is this file's.

    python -m benchmarks.model_coverage                                   # every family but classification
    python -m benchmarks.model_coverage --families classification         # the 80 classifiers (~20 min)
    python -m benchmarks.model_coverage --models s3d raft_small           # check these again, in the results
    python -m benchmarks.model_coverage --quick                           # one model per family; writes nothing
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch

from benchmarks.common import RESULTS, ROOT, header, load_results, results, write_results

FAMILIES = ("classification", "detection", "segmentation", "video", "optical_flow", "quantization")


def _zoo() -> Any:
    sys.path.insert(0, str(ROOT / "tests"))
    import zoo

    return zoo


def coverage_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per family: models tried, passed, and by which path."""
    out = []
    for family in FAMILIES:
        mine = [r for r in rows if r["family"] == family]
        if mine:
            out.append({
                "family": family,
                "tried": len(mine),
                "passed": sum(r["passed"] for r in mine),
                "traced": sum(r["passed"] and r["path"] == "traced" for r in mine),
                "untraced": sum(r["passed"] and r["path"] == "untraced" for r in mine),
            })  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES[1:]))
    parser.add_argument("--models", nargs="+", help="check these models again and replace their rows in --out")
    parser.add_argument("--quick", action="store_true", help="one model per family; writes nothing")
    parser.add_argument("--out", default=str(RESULTS / "model_coverage.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    zoo = _zoo()
    models = [m for m in zoo.TORCHVISION + zoo.TORCHVISION_TASKS if m.task in args.families]
    if args.models:
        models = [m for m in zoo.TORCHVISION + zoo.TORCHVISION_TASKS if m.name in args.models]
    elif args.quick:
        models = [next(m for m in models if m.task == family) for family in args.families]
    rows = []
    for spec in models:
        started = time.perf_counter()
        try:
            path, passed, error = zoo.check_conversion(spec), True, None
        except Exception as e:  # a failure is a row of the table, with its first line
            path, passed, error = None, False, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        row = {"family": spec.task, "model": spec.name, "path": path, "passed": passed, "error": error,
               "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip
        rows.append(row)
        print(f"{spec.task:15s} {spec.name:40s} {path or 'FAILED':9s} {row['seconds']:6.1f}s {error or ''}", flush=True)
    config = vars(args)
    if args.models:  # the other rows as the results file has them
        earlier = load_results(args.out)
        rows = [r for r in earlier["rows"] if r["model"] not in args.models] + rows
        rows.sort(key=lambda r: (FAMILIES.index(r["family"]), r["model"]))
        config = {**earlier["config"], "rechecked": args.models}
    result = results(
        header("model_coverage", quick=args.quick), config, rows, summary={"families": coverage_rows(rows)}
    )
    if not args.quick:
        write_results(args.out, result)
    return result


if __name__ == "__main__":
    main()
