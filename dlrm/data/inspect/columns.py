"""What `inspect` decides for each column, from rows spread over the dataset: its role (label,
dense, id, ids, string, strings, weight, or left out with the reason), a dense column's transform
(data.parquet.dense_transforms), a sparse column's table rows and modulo collision rate, and the
notices of what a user may have forgotten (a --multi, a --delimiter, a label)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dlrm.common.errors import UserError
from dlrm.data.parquet.files import compute

SPARSE = ("id", "ids", "string", "strings")
TIME_NAMES = re.compile(r"^(day|date|time|timestamp|ts|datetime|event_time|event_date)$|(_time|_date|_ts|_day)$", re.I)
COUNT_NAMES = re.compile(
    r"(count|cnt|num|n_|price|amount|total|views|clicks|age|duration|size|qty|quantity|gain|loss|wage|salary|weeks)",
    re.I,
)
LABEL_NAMES = re.compile(r"^(label|target|y|click|clicked|converted|conversion|is_click)$", re.I)
SEPARATORS = ("|", ";", ",")
HEADROOM = 2.0  # table rows per distinct id expected in the dataset, at least
SMALL_TABLE = 1 << 20  # rows: up to this, 8 rows per distinct id (about 12% of hashed ids share a row, not 39%)


@dataclass
class Column:
    """One column as the sample shows it. role: label, dense, id, ids, string, strings, weight or
    ignore (`reason`: why, and how to keep it)."""

    name: str
    type: str
    role: str
    missing: float
    distinct: int
    mean_per_sample: float = 1.0
    max_per_sample: int = 1
    max_id: int | None = None
    rows: int | None = None  # table rows (sparse roles)
    pooling: float | None = None  # mean ids per sample (sparse roles)
    reason: str = ""  # why it is left out, or a note on the decision
    transform: dict | None = None  # dense: its data.parquet.dense_transforms entry
    explain: str = ""  # dense: one line on why this transform
    estimate: int = 0  # sparse: distinct values expected in the whole dataset
    collisions: float = 0.0  # sparse: expected share of ids sharing a row under modulo
    min_id: int | None = None
    notices: list[str] = field(default_factory=list)


def estimate_distinct(values: pa.Array, total_rows: int, sampled_rows: int) -> int:
    """Distinct values expected in `total_rows` rows from a sample of `sampled_rows` (Chao1: the
    sample's distinct count plus f1^2 / 2 f2 for the values seen once (f1) and twice (f2)), at most
    the sample's distinct count scaled linearly."""
    counts = compute("value_counts", values).field("counts").to_numpy()
    d = len(counts)
    if total_rows <= sampled_rows or d == 0:
        return d
    f1, f2 = int((counts == 1).sum()), int((counts == 2).sum())
    chao = d + f1 * f1 / (2 * max(f2, 1))
    return int(min(chao, d * total_rows / sampled_rows))


def collision_rate(ids: int, rows: int) -> float:
    """Expected share of `ids` distinct ids, hashed uniformly into `rows` rows, that share their row."""
    if ids <= 1:
        return 0.0
    return 1 - (1 - 1 / rows) ** (ids - 1)


def _is_time(t: pa.DataType, name: str) -> bool:
    return pa.types.is_timestamp(t) or pa.types.is_date(t) or bool(TIME_NAMES.search(name))


def _looks_yymmddhh(values: np.ndarray) -> bool:
    return bool(values.size > 0 and values.min() >= 10010100 and values.max() <= 99123123 and (values % 100 < 24).all())


def dense_transform(values: np.ndarray, missing: float) -> tuple[dict, str]:
    """The transform of a dense column from its finite values: clipped at the 0.1th and 99.9th
    percentiles, log1p when non-negative and heavy-tailed (the 99.9th above 10x the median + 1), then
    standardised by the mean and deviation so transformed; a missing flag above 1% missing."""
    lo, med, hi = (float(q) for q in np.quantile(values, [0.001, 0.5, 0.999]))
    heavy = lo >= 0 and hi > 10 * (med + 1)
    x = np.clip(values.astype(np.float64), lo, hi)
    if heavy:
        x = np.log1p(x)
    mean, std = float(x.mean()), float(x.std())
    t = {
        "log1p": bool(heavy),
        "mean": round(mean, 6),
        "std": round(std, 6) if std > 1e-12 else 1.0,
        "clip": [lo, hi],
        "missing_flag": missing >= 0.01,
    }
    why = (
        f"non-negative, heavy-tailed (median {med:.3g}, 99.9th {hi:.3g}): log1p, then standardised"
        if heavy
        else f"median {med:.3g}, 99.9th {hi:.3g}: standardised"
    )
    why += f"; clipped at [{lo:.3g}, {hi:.3g}]"
    if t["missing_flag"]:
        why += f"; {missing:.0%} missing: 0 and a missing flag"
    return t, why


# long: one decision per column kind, in the order docs/your-data.md's table gives them
def _decide(
    c: Column, col: pa.Array, n: int, labels: Sequence[str], dense: Sequence[str], keep: Sequence[str], weight: str
) -> None:
    t = col.type
    name = c.name
    is_list = pa.types.is_list(t) or pa.types.is_large_list(t)
    inner = t.value_type if is_list else t
    if name == weight:
        c.role, c.reason = "weight", "a sample weight (--weight): not a feature"
        return
    if name in labels:
        values = set(compute("unique", col.drop_null()).to_pylist()) if not is_list else {None}
        if not values <= {0, 1}:
            shown = sorted(str(v) for v in values)[:5]
            raise UserError(
                f"--label {name} holds values other than 0 and 1 ({', '.join(shown)}, ...; {len(values)} distinct): it "
                "looks like a feature; name the 0/1 label column with --label"
            )
        c.role = "label"
        return
    c.role = "ignore"
    if pa.types.is_dictionary(t):
        raise UserError(
            f"column {name!r} is dictionary-encoded ({t}, e.g. pandas 'category'): the trainer reads plain "
            f"columns; write it as {t.value_type} (pandas: df[{name!r}].astype(str)) or --ignore {name}"
        )
    if pa.types.is_binary(inner) or pa.types.is_large_binary(inner):
        raise UserError(
            f"column {name!r} is binary, not UTF-8 text (a Latin-1 file?): re-encode the input as UTF-8 "
            f"(iconv -f latin1 -t utf-8) and convert again, or --ignore {name}"
        )
    if c.missing >= 1.0:
        c.reason = "empty: every value missing"
        return
    kept = name in keep
    if not kept and c.distinct <= 1 and not is_list:
        c.reason = "constant: one value, nothing to learn (--keep COL keeps it)"
        return
    if not kept and _is_time(t, name):
        c.reason = f"a time or day column ({t}): training on it does not carry to later days (--keep {name} keeps it)"
        return
    integer, floating = pa.types.is_integer(t), pa.types.is_floating(t)
    if not kept and integer and not is_list and _looks_yymmddhh(col.drop_null().to_numpy(zero_copy_only=False)):
        c.reason = (
            "a YYMMDDHH time code: the hours of later days never occur in training "
            f"(--keep {name} keeps it as a small table)"
        )
        return
    strings = pa.types.is_string(t) or pa.types.is_large_string(t)
    if not kept and (integer or strings) and n >= 100 and c.distinct >= 0.9 * n:
        c.reason = f"a row id: {c.distinct:,} distinct in {n:,} rows, it names rows (--keep {name} keeps it as an id)"
        return
    beyond_int64 = pa.types.is_uint64(t) and (compute("max", col).as_py() or 0) > 2**63 - 1
    if (name in dense or floating or (integer and COUNT_NAMES.search(name) and not beyond_int64)) and not is_list:
        values = col.drop_null().cast(pa.float64()).to_numpy(zero_copy_only=False)
        values = values[np.isfinite(values)]
        if not values.size:
            c.reason = "no finite value"
            return
        c.role = "dense"
        c.transform, c.explain = dense_transform(values, c.missing)
        return
    if integer:
        c.role = "id"
    elif strings:
        c.role = "string"
    elif is_list and pa.types.is_integer(inner):
        c.role = "ids"
    elif is_list and (pa.types.is_string(inner) or pa.types.is_large_string(inner)):
        c.role = "strings"
    else:
        c.reason = f"type {t} is not a feature kind"


def _sparse(c: Column, col: pa.Array, n: int, total_rows: int, max_rows: int) -> None:
    values = col
    if c.role in ("ids", "strings"):
        lengths = pc.fill_null(compute("list_value_length", col), 0).to_numpy(zero_copy_only=False)
        c.missing = float((lengths == 0).mean())
        c.mean_per_sample, c.max_per_sample = float(lengths.mean()), int(lengths.max(initial=0))
        values = compute("list_flatten", col)
    values = values.drop_null()
    c.estimate = max(1, estimate_distinct(values, total_rows, n))
    rows = min(max_rows, max(16, math.ceil(HEADROOM * c.estimate)))
    exact = False
    if c.role in ("id", "ids") and len(values):
        lo, hi = compute("min", values).as_py(), compute("max", values).as_py()
        c.min_id, c.max_id = int(lo), int(hi)
        if lo >= 0 and hi + 1 <= 2 * rows and hi < max_rows:  # small ids already: kept exact, no folding
            rows, exact = max(rows, int(hi) + 1), True
    if not exact:  # hashed or folded: more rows per id while the table is small, fewer collisions
        rows = min(max_rows, max(rows, min(8 * c.estimate, SMALL_TABLE)))
        if c.role == "id" and _looks_yymmddhh(values.to_numpy(zero_copy_only=False)):
            c.reason = "looks like a YYMMDDHH time code: a small table from its distinct values"
    c.rows = int(rows)
    folds = c.role in ("string", "strings") or (c.max_id is not None and (c.max_id >= rows or (c.min_id or 0) < 0))
    c.collisions = collision_rate(c.estimate, rows) if folds else 0.0
    c.pooling = max(0.01, round(c.mean_per_sample, 2))  # positive: a feature always empty counts 0.01


def _notices(c: Column, col: pa.Array) -> None:
    """Lines on what the user may have forgotten for this column."""
    if c.role == "string":
        cells = col.drop_null()
        if len(cells):
            for sep in SEPARATORS:
                share = compute("mean", compute("match_substring", cells, options=pc.MatchSubstringOptions(sep)))
                share = float(share.as_py() or 0)
                if share >= 0.3:
                    example = next(v for v in cells.to_pylist() if sep in v)
                    parts = [p.strip() for p in example.split(sep)]
                    flag = (
                        f"--multi {c.name}"
                        if all(p.lstrip("-").isdigit() for p in parts)
                        else f"--multi {c.name}:string"
                    )
                    extra = "" if sep == "|" else f" --multi-separator '{sep}'"
                    c.notices.append(
                        f"column {c.name!r}: {share:.0%} of its cells hold {sep!r}-joined values (e.g. "
                        f"{example[:40]!r}), each hashed as one token: convert with {flag}{extra}"
                    )
                    break
    if c.role in ("id", "dense") and c.distinct == 2 and LABEL_NAMES.match(c.name):
        c.notices.append(
            f"column {c.name!r} looks like a label (0/1, named so) but is read as an input ({c.role}): if it is a "
            f"label, --label {c.name} (an input may leak the answer); else --ignore {c.name} or keep it"
        )


def describe(
    table: pa.Table,
    total_rows: int,
    labels: Sequence[str],
    dense: Sequence[str] = (),
    ignore: Sequence[str] = (),
    max_rows: int = 10_000_000,
    keep: Sequence[str] = (),
    weight: str = "",
) -> list[Column]:
    """One `Column` per column of the sample `table`, its role and settings decided.

    Args:
        table: rows spread over the dataset.
        total_rows: the dataset's rows (tables are sized for them).
        labels: the label columns.
        dense: integer columns to read as dense features.
        ignore: columns to leave out.
        max_rows: the largest table suggested.
        keep: columns to keep that would be left out (constant, a time, a row id).
        weight: the sample-weight column, or "".

    Raises:
        UserError: the text was read as one column (another delimiter).
    """
    n = table.num_rows
    if table.num_columns == 1 and ("\t" in table.column_names[0] or ";" in table.column_names[0]):
        sep = "tab" if "\t" in table.column_names[0] else "semicolon"
        raise UserError(
            f"the data has one column named {table.column_names[0][:60]!r}: the text was read as one column; "
            f"convert it again with --delimiter {sep}"
        )
    out = []
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        c = Column(name, str(col.type), "ignore", col.null_count / max(n, 1), 0)
        if name in ignore:
            c.reason = "--ignore"
            out.append(c)
            continue
        is_list = pa.types.is_list(col.type) or pa.types.is_large_list(col.type)
        if not pa.types.is_dictionary(col.type):
            flat = compute("list_flatten", col) if is_list else col
            c.distinct = int(compute("count_distinct", flat).as_py())
        _decide(c, col, n, labels, dense, keep, weight)
        if c.role in SPARSE:
            _sparse(c, col, n, total_rows, max_rows)
        _notices(c, col)
        out.append(c)
    return out
