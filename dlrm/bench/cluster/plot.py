"""findings.png of the cluster experiments: measured (solid) and modelled (dashed) step times and alltoall shares."""

from __future__ import annotations

from dataclasses import dataclass, field

from dlrm.bench.cluster.summaries import DENSE_SYNC, VARIANTS, median, projected, shape_of, train_cell
from dlrm.common.io import figure_png


@dataclass
class Series:
    panel: int  # 0: step time vs Gbit/s (the train shape), 1: step time vs nodes, 2: alltoall share vs Gbit/s
    label: str
    x: list[float]
    y: list[float]
    measured: bool
    color: str = "C0"
    extra: dict = field(default_factory=dict)


PANELS = (
    ("{n} nodes x {k} rank(s): step time vs uplink", "inter-node uplink (Gbit/s)", "step time (ms)"),
    ("weak scaling, 1 rank per node: step time vs nodes", "nodes", "step time (ms)"),
    ("alltoall (embedding exchange) share of the step", "inter-node uplink (Gbit/s)", "share of the step (%)"),
)


def plot_series(results: dict) -> list[Series]:
    """Every line of findings.png: measured ones solid, modelled ones dashed (label says which)."""
    out: list[Series] = []
    n, k = shape_of(results)
    gbits = sorted({r["gbit"] for r in results["runs"] if r["gbit"] is not None})
    for i, v in enumerate(VARIANTS):
        pts = [(g, median(train_cell(results, n, k, g, v, "step_s"))) for g in gbits]
        pts = [(g, s * 1e3) for g, s in pts if s is not None]
        if pts:
            out.append(Series(0, f"{v} (measured)", [p[0] for p in pts], [p[1] for p in pts], True, f"C{i}"))
        if v in DENSE_SYNC:
            mp = [(g, projected(results, g, f"1x{k}", n, DENSE_SYNC[v])) for g in gbits]
            mp = [(g, s * 1e3) for g, s in mp if s is not None]
            if mp:
                out.append(Series(0, f"{v} (modelled)", [p[0] for p in mp], [p[1] for p in mp], False, f"C{i}"))
    one = median(train_cell(results, 1, 1, None, "auto", "step_s"))
    for j, g in enumerate(gbits):
        pts = [(1, one)] + [(n, median(train_cell(results, n, 1, g, "auto", "step_s"))) for n in (2, 4)]
        pts = [(n, s * 1e3) for n, s in pts if s is not None]
        if len(pts) > 1:
            out.append(Series(1, f"{g:g} Gbit/s (measured)", [p[0] for p in pts], [p[1] for p in pts], True, f"C{j}"))
        mp = [(n, projected(results, g, "1x1", n, "allreduce")) for n in (1, 2, 4)]
        mp = [(n, s * 1e3) for n, s in mp if s is not None]
        if len(mp) > 1:
            out.append(Series(1, f"{g:g} Gbit/s (modelled)", [p[0] for p in mp], [p[1] for p in mp], False, f"C{j}"))
    for j, (nodes, rpn, series) in enumerate(
        dict.fromkeys(((n, k, f"1x{k}"), (2, 2, "1x2"), (4, 1, "1x1"), (2, 1, "1x1")))
    ):
        pts = [(g, median(train_cell(results, nodes, rpn, g, "auto", "a2a_share"))) for g in gbits]
        pts = [(g, s * 100) for g, s in pts if s is not None]
        if pts:
            out.append(
                Series(2, f"{nodes} x {rpn}, auto (measured)", [p[0] for p in pts], [p[1] for p in pts], True, f"C{j}")
            )
        mp = [(g, projected(results, g, series, nodes, "allreduce", "a2a_share")) for g in gbits]
        mp = [(g, s * 100) for g, s in mp if s is not None]
        if mp:
            out.append(
                Series(2, f"{nodes} x {rpn}, auto (modelled)", [p[0] for p in mp], [p[1] for p in mp], False, f"C{j}")
            )
    return out


def plot(results: dict) -> bytes:
    """findings.png as PNG bytes: the `PANELS`, measured lines solid and modelled ones dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(18, 6.5))
    shapes = ("s", "^", "v", "D", "P", "X", "*")  # modelled lines that coincide stay visible: nested markers
    drawn = [0, 0, 0]
    for s in plot_series(results):
        ax = axes[s.panel]
        if s.measured:
            ax.plot(s.x, s.y, "-", marker="o", ms=5, lw=2.0, color=s.color, label=s.label)
        else:
            k = drawn[s.panel]
            drawn[s.panel] += 1
            ax.plot(s.x, s.y, "--", marker=shapes[k % len(shapes)], ms=max(4, 11 - 2 * k), mfc="none", lw=1.5,
                    color=s.color, label=s.label)  # fmt: skip
    n, k = shape_of(results)
    for ax, (title, xlabel, ylabel) in zip(axes, PANELS, strict=True):
        ax.set(title=title.format(n=n, k=k), xlabel=xlabel, ylabel=ylabel)
        ax.grid(True, alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=8, title="solid: measured, dashed: modelled", title_fontsize=8, ncol=2,
                      loc="upper center", bbox_to_anchor=(0.5, -0.13))  # fmt: skip
    gbits = sorted({r["gbit"] for r in results["runs"] if r["gbit"] is not None})
    for ax in (axes[0], axes[2]):
        ax.set_xscale("log", base=2)
        if gbits:
            ax.set_xticks(gbits, [f"{g:g}" for g in gbits])
            ax.set_xlim(min(gbits) / 1.4, max(gbits) * 1.4)
    axes[1].set_xticks([1, 2, 4], ["1", "2", "4"])
    for ax in axes:
        ax.set_ylim(bottom=0)
    fig.suptitle("DLRM on the emulated cluster (network namespaces, tc tbf uplinks; Gloo, 2 shared CPU cores)")
    return figure_png(fig)
