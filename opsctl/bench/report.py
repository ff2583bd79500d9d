"""Tables (rich and Markdown), CSV and the before/after comparison of two sweeps."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from rich.table import Table

from opsctl.bench.floor import Floor
from opsctl.bench.prompts import format_context
from opsctl.bench.runner import ConcurrencyResult, PointResult, RunResult

CSV_FIELDS = (
    "context_requested",
    "prompt_tokens",
    "status",
    "n_valid",
    "ttft_s",
    "prefill_tok_s",
    "decode_tok_s",
    "step_ms",
    "accept_length",
    "decode_ctx_mean",
    "floor_step_ms",
    "x_floor",
    "cached_tokens_max",
    "flags",
    "error",
)


# -- number formats (the seed's table: 0.46s, 17.6s, 51s, 3.1 min; 118.6 tok/s; 8.4 / 159 ms) --


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds:.2f}s"
    if seconds < 30:
        return f"{seconds:.1f}s"
    if seconds < 120:
        return f"{seconds:.0f}s"
    return f"{seconds / 60:.1f} min"


def fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 1000 else f"{value:.1f}"


def fmt_tok_s(value: float | None) -> str:
    """Prefill rates are shown whole (3104, 479)."""
    return "-" if value is None else f"{value:.0f}"


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


def _floor(result: RunResult) -> Floor | None:
    f = result.floor
    return Floor(f["bandwidth_tbs"], f["kv_cell_bytes"], f["label"]) if f else None


def point_flags(point: PointResult) -> list[str]:
    flags = sorted({flag for s in point.samples for flag in s.flags})
    if point.status == "error":
        flags.append("error")
    return flags


def point_row(point: PointResult, floor: Floor | None) -> dict[str, Any]:
    """The numbers of one point as shown in every format."""
    floor_ms = floor.step_ms(point.decode_ctx_mean) if floor and point.decode_ctx_mean else None
    return {
        "context_requested": point.context_requested,
        "prompt_tokens": point.prompt_tokens,
        "status": point.status,
        "n_valid": point.n_valid,
        "ttft_s": point.ttft_s,
        "prefill_tok_s": point.prefill_tok_s,
        "decode_tok_s": point.decode_tok_s,
        "step_ms": point.step_ms,
        "accept_length": point.accept_length,
        "decode_ctx_mean": point.decode_ctx_mean,
        "floor_step_ms": floor_ms,
        "x_floor": point.step_ms / floor_ms if floor_ms and point.step_ms else None,
        "cached_tokens_max": max((s.cached_tokens for s in point.samples), default=0),
        "flags": " ".join(point_flags(point)),
        "error": point.error or "",
    }


def _ctx_label(point: PointResult) -> str:
    return format_context(point.prompt_tokens if point.prompt_tokens else point.context_requested)


def _spread_pct(point: PointResult, metric: str) -> str:
    lo_hi = point.spread.get(metric)
    value = getattr(point, metric)
    if not lo_hi or not value:
        return "-"
    return f"±{(lo_hi[1] - lo_hi[0]) / 2 / value * 100:.1f}%"


def sweep_table(result: RunResult, title: str | None = None) -> Table:
    floor = _floor(result)
    repeats = result.settings.repeats > 1
    table = Table(title=title, title_justify="left")
    for name in ("actual ctx", "TTFT", "prefill tok/s", "decode tok/s", "ms/step", "accept"):
        table.add_column(name, justify="right")
    if repeats:
        table.add_column("n", justify="right")
        table.add_column("step spread", justify="right")
    if floor:
        table.add_column("floor ms", justify="right")
        table.add_column("× floor", justify="right")
    table.add_column("flags")
    for p in result.points:
        row = point_row(p, floor)
        cells = _seed_cells(p) + [f"{p.accept_length:.2f}" if p.accept_length else "-"]
        if repeats:
            cells += [str(p.n_valid), _spread_pct(p, "step_ms")]
        if floor:
            cells += _floor_cells(row)
        cells.append(row["flags"] or "")
        table.add_row(*cells)
    return table


def _seed_cells(p) -> list[str]:
    """The seed's columns: context, TTFT, prefill tok/s, decode tok/s, ms/step."""
    return [_ctx_label(p), fmt_duration(p.ttft_s), fmt_tok_s(p.prefill_tok_s), fmt_rate(p.decode_tok_s),
            fmt_ms(p.step_ms)]


def _floor_cells(row: dict) -> list[str]:
    return [f"{row['floor_step_ms']:.2f}" if row["floor_step_ms"] else "-",
            f"{row['x_floor']:.0f}×" if row["x_floor"] else "-"]


def fit_line(result: RunResult) -> str | None:
    if not result.fit:
        return None
    f = result.fit
    text = (
        f"step time ≈ {f['ms_at_zero']:.2f} ms + {f['ms_per_1k']:.3f} ms per 1k tokens of context "
        f"(r² {f['r2']:.4f}, {f['n_points']} points)"
    )
    floor = _floor(result)
    if floor:
        text += f"; bandwidth floor {floor.ms_per_1k():.4f} ms per 1k ({floor.label})"
    return text


def markdown_table(result: RunResult) -> str:
    """The seed's table shape: | actual ctx | TTFT | prefill tok/s | decode tok/s | ms/step |."""
    floor = _floor(result)
    head = ["actual ctx", "TTFT", "prefill tok/s", "decode tok/s", "ms/step"]
    if floor:
        head += ["floor ms/step", "× floor"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in result.points:
        cells = _seed_cells(p)
        if floor:
            cells += _floor_cells(point_row(p, floor))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_csv(result: RunResult, path: str | Path) -> None:
    """One row per point (medians of the valid samples)."""
    floor = _floor(result)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for p in result.points:
            writer.writerow({k: ("" if v is None else v) for k, v in point_row(p, floor).items()})


# -- compare -------------------------------------------------------------------------------

COMPARED = (
    ("ttft_s", "TTFT"),
    ("prefill_tok_s", "prefill tok/s"),
    ("decode_tok_s", "decode tok/s"),
    ("step_ms", "ms/step"),
)


def _ratio(a: float | None, b: float | None) -> float | None:
    return b / a if a and b is not None else None


def compare(a: RunResult, b: RunResult) -> dict[str, Any]:
    """B / A per point and metric, matched by requested context. Times: < 1 means B is faster."""
    warnings = []
    for key in ("gen", "prompt_mode", "flush"):
        va, vb = getattr(a.settings, key), getattr(b.settings, key)
        if va != vb:
            warnings.append(f"{key} differs: A {va!r}, B {vb!r}")
    rows = []
    for pa in a.points:
        pb = b.point(pa.context_requested)
        if pb is None or pa.status != "ok" or pb.status != "ok":
            continue
        if pa.prompt_tokens and pb.prompt_tokens and abs(pb.prompt_tokens / pa.prompt_tokens - 1) > 0.02:
            warnings.append(
                f"{format_context(pa.context_requested)}: prompt lengths differ "
                f"({pa.prompt_tokens:.0f} vs {pb.prompt_tokens:.0f})"
            )
        row: dict[str, Any] = {
            "context_requested": pa.context_requested,
            "prompt_tokens_a": pa.prompt_tokens,
            "prompt_tokens_b": pb.prompt_tokens,
        }
        for metric, _ in COMPARED:
            row[f"{metric}_a"] = getattr(pa, metric)
            row[f"{metric}_b"] = getattr(pb, metric)
            row[f"{metric}_ratio"] = _ratio(getattr(pa, metric), getattr(pb, metric))
        rows.append(row)
    only_a = [c for c in a.settings.contexts if b.point(c) is None]
    only_b = [c for c in b.settings.contexts if a.point(c) is None]
    if only_a or only_b:
        warnings.append(
            "unmatched points: "
            + ", ".join(
                [f"{format_context(c)} only in A" for c in only_a]
                + [f"{format_context(c)} only in B" for c in only_b]
            )
        )
    geomean = {}
    for metric, _ in COMPARED:
        ratios = [r[f"{metric}_ratio"] for r in rows if r[f"{metric}_ratio"]]
        geomean[metric] = math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else None
    return {
        "schema": "opsctl.bench/1",
        "kind": "compare",
        "points": rows,
        "geomean_ratio": geomean,
        "warnings": warnings,
    }


def compare_table(cmp: dict[str, Any], title: str | None = None) -> Table:
    table = Table(
        title=title,
        title_justify="left",
        caption="ratios are B / A: times below 1 and rates above 1 mean B is faster",
    )
    table.add_column("ctx", justify="right")
    for _, label in COMPARED:
        table.add_column(f"{label} B/A", justify="right")
    for r in cmp["points"]:
        cells = [format_context(r["prompt_tokens_a"] or r["context_requested"])]
        cells += [f"{r[f'{m}_ratio']:.3f}" if r[f"{m}_ratio"] else "-" for m, _ in COMPARED]
        table.add_row(*cells)
    g = cmp["geomean_ratio"]
    table.add_row("geomean", *[f"{g[m]:.3f}" if g[m] else "-" for m, _ in COMPARED], style="bold")
    return table


def concurrency_table(res: ConcurrencyResult) -> Table:
    table = Table(
        title=f"{res.streams} streams at {format_context(res.context_requested)}, {res.gen} tokens each"
        + (f" (stopped: {len(res.samples)} finished)" if res.stopped else ""),
        title_justify="left",
        caption=(
            f"aggregate: {res.output_tok_s:.1f} output tok/s over {fmt_duration(res.wall_s)}; "
            f"sum of decode rates {res.decode_tok_s_sum:.1f} tok/s; "
            f"TTFT median {fmt_duration(res.ttft_s_median)}, "
            f"max {fmt_duration(res.ttft_s_max)}"
        ),
    )
    for name in ("stream", "prompt tok", "TTFT", "decode tok/s", "ms/step", "flags"):
        table.add_column(name, justify="right")
    for s in res.samples:
        table.add_row(
            str(s.repeat),
            str(s.prompt_tokens),
            fmt_duration(s.ttft_s),
            fmt_rate(s.decode_tok_s),
            fmt_ms(s.step_ms),
            " ".join(s.flags),
        )
    return table


# -- lab simulator ---------------------------------------------------------------------------


def to_model_time(result: RunResult, time_factor: float) -> RunResult:
    """A copy with every duration divided by the simulator's time factor (rates multiplied).

    The lab simulator sleeps `model seconds * SGLANG_SIM_TIME_FACTOR`; dividing by the factor
    shows what its model says a real node would take. Meaningless for a real server.
    """
    import copy

    if time_factor <= 0:
        raise ValueError("the time factor must be positive")
    out = copy.deepcopy(result)
    f = time_factor
    durations = ("ttft_s", "step_ms", "decode_window_s", "e2e_latency_s", "wall_s")
    rates = ("prefill_tok_s", "decode_tok_s")

    def scale(obj) -> None:
        for name in durations:
            if getattr(obj, name, None) is not None:
                setattr(obj, name, getattr(obj, name) / f)
        for name in rates:
            if getattr(obj, name, None) is not None:
                setattr(obj, name, getattr(obj, name) * f)

    for p in out.points:
        scale(p)
        for s in p.samples:
            scale(s)
        for name, (lo, hi) in list(p.spread.items()):
            p.spread[name] = (
                [lo * f, hi * f] if name in rates else [lo / f, hi / f] if name in durations else [lo, hi]
            )
    if out.fit:
        out.fit = dict(out.fit, ms_per_1k=out.fit["ms_per_1k"] / f, ms_at_zero=out.fit["ms_at_zero"] / f)
    out.meta = dict(out.meta, time_factor=f, time_base="model (simulator time factor divided out)")
    return out
