"""Reading measurement CSVs into numpy columns, with errors naming the file and column.

Rules
-----
* A CSV has a header row; the caller names the columns it requires and those it accepts
  as optional. A missing file, a missing required column, or a cell that is not a finite
  number raises `ConfigError(path, column, message)` (the row number is in the message).
* Optional numeric columns may be blank in some rows; blanks become NaN and the caller
  decides what a NaN means (e.g. "not measured").
* Text columns are returned as lists of stripped strings.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from services.model.errors import ConfigError

FloatArray = npt.NDArray[np.float64]


class Table:
    """Columns of one CSV file: numeric columns as float arrays, text columns as lists."""

    def __init__(self, path: str, n_rows: int) -> None:
        self.path = path
        self.n_rows = n_rows
        self.num: dict[str, FloatArray] = {}
        self.text: dict[str, list[str]] = {}

    def has(self, column: str) -> bool:
        return column in self.num or column in self.text


def read_table(
    path: str | Path,
    numeric: Sequence[str] = (),
    text: Sequence[str] = (),
    optional_numeric: Sequence[str] = (),
    optional_text: Sequence[str] = (),
) -> Table:
    """Read `path`; required numeric cells must be finite numbers, optional ones may be blank."""
    p = str(path)
    try:
        with open(p, newline="") as fh:
            reader = csv.DictReader(fh)
            header = [h.strip() for h in (reader.fieldnames or [])]
            rows = list(reader)
    except OSError as exc:
        raise ConfigError(p, "", f"cannot read measurement file: {exc.strerror}") from exc
    except csv.Error as exc:
        raise ConfigError(p, "", f"not a valid CSV file: {exc}") from exc
    if not header:
        raise ConfigError(p, "", "empty file: expected a header row")
    for col in (*numeric, *text):
        if col not in header:
            raise ConfigError(p, col, f"missing required column (header: {', '.join(header)})")
    if not rows:
        raise ConfigError(p, "", "no data rows")
    # DictReader keys are the raw header cells; map stripped names back to them.
    raw = {h.strip(): h for h in (reader.fieldnames or [])}
    table = Table(p, len(rows))
    for col in text:
        table.text[col] = [(r.get(raw[col]) or "").strip() for r in rows]
    for col in optional_text:
        if col in raw:
            table.text[col] = [(r.get(raw[col]) or "").strip() for r in rows]
    for col, required in [(c, True) for c in numeric] + [(c, False) for c in optional_numeric]:
        if col not in raw:
            continue
        vals = np.empty(len(rows), dtype=np.float64)
        for i, r in enumerate(rows):
            cell = (r.get(raw[col]) or "").strip()
            if cell == "":
                if required:
                    raise ConfigError(p, col, f"row {i + 2}: empty cell, expected a number")
                vals[i] = math.nan
                continue
            try:
                v = float(cell)
            except ValueError:
                raise ConfigError(p, col, f"row {i + 2}: expected a number, got {cell!r}") from None
            if not math.isfinite(v):
                raise ConfigError(p, col, f"row {i + 2}: expected a finite number, got {cell!r}")
            vals[i] = v
        table.num[col] = vals
    return table


def write_rows(path: str | Path, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Write a CSV with `header`; floats are written with 12 significant digits."""
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        for row in rows:
            w.writerow([f"{v:.12g}" if isinstance(v, float) else v for v in row])
