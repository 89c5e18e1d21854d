"""Inter-region round-trip times from the CloudPing AWS p50 matrix.

Rules / theory of operation
---------------------------
* Source: ``data/network/aws_interregion_rtt_p50_ms_cloudping_1y.csv`` — one-year p50 RTT in
  milliseconds between AWS regions (row ``src_region`` = sender, columns = receiver), the
  measurement paper 1 §V-A uses for its inter-region transfer delay. Loaded once, converted
  to **seconds**, returned as plain dicts keyed by ``(src, dst)``.
* ``region_rtt`` maps emulator regions to AWS regions and symmetrises each pair as the mean
  of both directions (the raw matrix differs by at most ~12 ms between directions). A region
  to itself is 0 s: a local placement pays no forwarding delay (paper 1 §IV: "zero for a
  local DC placement"); two emulator regions that share one AWS region get that region's
  intra-region RTT (a few ms).
* Paper regions → AWS regions (``PAPER_REGIONS``): EU-North → eu-north-1, US-East →
  us-east-1, Asia → **ap-northeast-1** (Tokyo), South America → sa-east-1. We pick Tokyo
  because it keeps every pair inside the paper's stated 85–280 ms range (112–258 ms); with
  ap-southeast-1 (Singapore) sa-east-1↔Asia would be ~327 ms.
* Pure functions, no clocks; errors are ``ConfigError`` naming the file and the row/column, or
  ``InvalidInput`` naming the emulator region whose AWS region is unknown.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from services.model.errors import ConfigError, InvalidInput

DEFAULT_RTT_PATH = (
    Path(__file__).resolve().parents[2] / "data" / "network"
    / "aws_interregion_rtt_p50_ms_cloudping_1y.csv"
)

#: The four regions of paper 1 §V-A and the AWS region standing in for each.
PAPER_REGIONS: Mapping[str, str] = {
    "eu-north": "eu-north-1",
    "us-east": "us-east-1",
    "asia": "ap-northeast-1",
    "south-america": "sa-east-1",
}

RttMatrix = dict[tuple[str, str], float]


def load_rtt_matrix(path: str | Path = DEFAULT_RTT_PATH) -> RttMatrix:
    """Directed RTT in seconds for every ``(src_aws, dst_aws)`` pair of the CloudPing CSV."""
    p = Path(path)
    try:
        with p.open(newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except OSError as exc:
        raise ConfigError(str(p), "", f"cannot read RTT matrix: {exc.strerror or exc}") from exc
    if not rows or not rows[0] or rows[0][0] != "src_region":
        raise ConfigError(str(p), "src_region", "first column must be 'src_region'")
    dsts = rows[0][1:]
    out: RttMatrix = {}
    srcs: list[str] = []
    for i, rec in enumerate(rows[1:], start=2):
        if not rec:
            continue
        if len(rec) != len(rows[0]):
            raise ConfigError(str(p), f"row {i}", f"{len(rec)} fields, header has {len(rows[0])}")
        src = rec[0]
        srcs.append(src)
        for dst, cell in zip(dsts, rec[1:], strict=True):
            try:
                ms = float(cell)
            except ValueError:
                raise ConfigError(str(p), f"{src}->{dst}", f"not a number: {cell!r}") from None
            if not (math.isfinite(ms) and ms >= 0):
                raise ConfigError(str(p), f"{src}->{dst}", f"RTT must be finite, >= 0: {ms}")
            out[(src, dst)] = ms / 1000.0
    if sorted(srcs) != sorted(dsts):
        raise ConfigError(str(p), "src_region", "rows and columns must list the same regions")
    return out


def aws_regions(matrix: Mapping[tuple[str, str], float]) -> tuple[str, ...]:
    """The AWS regions a matrix covers, sorted."""
    return tuple(sorted({a for a, _ in matrix} | {b for _, b in matrix}))


def region_rtt(
    regions: Mapping[str, str],
    matrix: Mapping[tuple[str, str], float] | None = None,
    *,
    path: str | Path = DEFAULT_RTT_PATH,
) -> RttMatrix:
    """Symmetric RTT in seconds between emulator regions, each mapped to an AWS region.

    ``regions`` maps an emulator region name to an AWS region id; ``matrix`` (from
    ``load_rtt_matrix``) is loaded from ``path`` when omitted. Every ordered pair is present,
    including ``(r, r) = 0``.
    """
    m = load_rtt_matrix(path) if matrix is None else matrix
    known = aws_regions(m)
    for name, aws in regions.items():
        if aws not in known:
            raise InvalidInput(
                f"regions.{name}",
                f"unknown AWS region {aws!r}; the RTT matrix has: {', '.join(known)}",
            )
    out: RttMatrix = {}
    for a, aws_a in regions.items():
        for b, aws_b in regions.items():
            if a == b:
                out[(a, b)] = 0.0
                continue
            try:
                fwd, rev = m[(aws_a, aws_b)], m[(aws_b, aws_a)]
            except KeyError:
                raise InvalidInput(
                    f"regions.{a}", f"RTT matrix lacks the pair {aws_a!r}<->{aws_b!r}"
                ) from None
            out[(a, b)] = 0.5 * (fwd + rev)
    return out


def rtt_array(rtt: Mapping[tuple[str, str], float], order: Sequence[str]) -> np.ndarray:
    """The RTT dict as a dense ``len(order) × len(order)`` array (seconds) for vectorised use."""
    n = len(order)
    arr = np.zeros((n, n), dtype=np.float64)
    for i, a in enumerate(order):
        for j, b in enumerate(order):
            if (a, b) not in rtt:
                raise InvalidInput("regions", f"no RTT for pair ({a!r}, {b!r})")
            arr[i, j] = rtt[(a, b)]
    return arr
