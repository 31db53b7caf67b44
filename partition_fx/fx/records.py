"""How each original parameter tensor was treated by ``partitionify``, and the table ``describe`` prints."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .params import PartitionedTensor


@dataclass
class ParameterRecord:
    """How one original parameter tensor was treated (for ``describe``, export and optimisation).

    >>> record = ParameterRecord(names=["fc.weight"], shape=(2, 3), treatment="frozen", reason="requires_grad=False")
    >>> record.names[0], record.partitioned
    ('fc.weight', None)
    """

    names: list[str]
    """Every qualified name of the tensor in the original model (several when tied)."""
    shape: tuple[int, ...]
    treatment: str
    """``random``, ``product``, ``sum``, ``shared`` (left unpartitioned), ``frozen`` or ``hyper`` (a parameter
    of a ``HyperparameterModule``: unpartitioned, stepped by the hyperparameter optimiser)."""
    reason: str
    partitioned: PartitionedTensor | None = None


def records_table(records: Sequence[ParameterRecord], num_partitions: int) -> list[str]:
    """Per record: its first name, shape, treatment, entries per partition and why; then the totals. The
    first two lines are the header and its rule.

    >>> print("\\n".join(records_table([ParameterRecord(["w"], (2,), "frozen", "requires_grad=False")], 2)))
    tensor  shape  treatment  p1  p2  note
    ------  -----  ---------  --  --  -------------------
    w       2      frozen     -   -   requires_grad=False
    total                     0   0
    """
    header = ["tensor", "shape", "treatment"] + [f"p{k}" for k in range(1, num_partitions + 1)] + ["note"]
    rows = [header]
    totals = [0] * num_partitions
    for record in records:
        if record.partitioned is not None:
            sizes = record.partitioned.partition_sizes()
            totals = [t + s for t, s in zip(totals, sizes)]
            counts = [str(s) for s in sizes]
        else:
            counts = ["-"] * num_partitions
        note = record.reason + (f"; tied with {', '.join(record.names[1:])}" if len(record.names) > 1 else "")
        rows.append([record.names[0], "x".join(map(str, record.shape)) or "scalar", record.treatment, *counts, note])
    rows.append(["total", "", "", *map(str, totals), ""])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines
