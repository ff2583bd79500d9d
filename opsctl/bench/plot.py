"""PNG plot of a sweep: step time and TTFT against context, with the bandwidth floor.

matplotlib is an optional extra (`pip install 'dflash-ops[plot]'`); `PlotUnavailable` says so.
"""

from __future__ import annotations

from pathlib import Path

from opsctl.bench.floor import Floor
from opsctl.bench.prompts import format_context
from opsctl.bench.runner import RunResult

INSTALL_HINT = "the plot needs matplotlib: pip install 'dflash-ops[plot]' (or pip install matplotlib)"


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotUnavailable(INSTALL_HINT) from exc
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def plot_sweep(result: RunResult, path: str | Path, title: str | None = None) -> Path:
    """Write the PNG: left, ms per step (log scale) with fit and floor; right, TTFT (log)."""
    plt = _pyplot()
    points = [p for p in result.points if p.status == "ok" and p.step_ms and p.decode_ctx_mean]
    if not points:
        raise ValueError("no measured points to plot")
    ctx_k = [p.decode_ctx_mean / 1000 for p in points]
    step = [p.step_ms for p in points]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8), dpi=110)

    ax1.plot(ctx_k, step, "o-", color="tab:blue", label="measured ms/step")
    if result.fit:
        f = result.fit
        # Over the measured range only, and only where positive (the axis is logarithmic).
        lo, hi = min(ctx_k), max(ctx_k)
        xs = [lo + (hi - lo) * i / 50 for i in range(51)]
        fit_xy = [(x, f["ms_at_zero"] + f["ms_per_1k"] * x) for x in xs]
        fit_xy = [(x, y) for x, y in fit_xy if y > 0]
        ax1.plot(
            [x for x, _ in fit_xy],
            [y for _, y in fit_xy],
            "--",
            color="tab:gray",
            label=f"linear fit: {f['ms_at_zero']:.1f} ms + {f['ms_per_1k']:.2f} ms per 1k",
        )
    if result.floor:
        floor = Floor(result.floor["bandwidth_tbs"], result.floor["kv_cell_bytes"], result.floor["label"])
        xs = [0.5] + ctx_k
        ax1.plot(
            xs,
            [floor.step_ms(x * 1000) for x in xs],
            ":",
            color="tab:red",
            linewidth=2,
            label=f"bandwidth floor ({floor.label}, {floor.kv_cell_bytes:,} B/token)",
        )
        for x, y in zip(ctx_k, step, strict=True):
            ax1.annotate(
                f"{y / floor.step_ms(x * 1000):.0f}×",
                (x, y),
                textcoords="offset points",
                xytext=(4, 6),
                fontsize=8,
                color="tab:red",
            )
    ax1.set_yscale("log")
    ax1.set_xlabel("context (thousand tokens)")
    ax1.set_ylabel("ms per decode/verify step (log)")
    ax1.set_title("step time vs context (× = distance from the floor)")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8, loc="lower right")

    ttft_pts = [p for p in result.points if p.status == "ok" and p.ttft_s and p.prompt_tokens]
    ax2.plot(
        [p.prompt_tokens / 1000 for p in ttft_pts],
        [p.ttft_s for p in ttft_pts],
        "s-",
        color="tab:orange",
        label="TTFT",
    )
    for p in ttft_pts:
        ax2.annotate(
            f"{p.prefill_tok_s:.0f} tok/s",
            (p.prompt_tokens / 1000, p.ttft_s),
            textcoords="offset points",
            xytext=(4, -12),
            fontsize=8,
            color="tab:orange",
        )
    ax2.set_yscale("log")
    ax2.set_xlabel("prompt (thousand tokens)")
    ax2.set_ylabel("time to first token, s (log)")
    ax2.set_title("TTFT vs context (labels: prefill tok/s)")
    ax2.grid(True, which="both", alpha=0.3)

    meta = result.meta or {}
    subtitle = ", ".join(
        x
        for x in (
            f"gen {result.settings.gen}",
            f"repeats {result.settings.repeats}",
            f"sglang {meta['server_version']}" if meta.get("server_version") else "",
            meta.get("date", "")[:10],
        )
        if x
    )
    span = f"{format_context(points[0].prompt_tokens)}..{format_context(points[-1].prompt_tokens)}"
    fig.suptitle(f"{title or 'opsctl bench'}: {span} ({subtitle})", fontsize=11)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
