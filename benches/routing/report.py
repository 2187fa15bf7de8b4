#!/usr/bin/env python3
"""Turns a routing benchmark's results.jsonl into tables (report.md) and a plot
of TTFT p90 against request rate per contender (ttft_p90.png).

Usage: python report.py RUN_DIR [RUN_DIR...] [--plot-out PATH] [--md-out PATH]
Several run directories (runs of other workloads, or of one workload through another client) are
reported together; the outputs go to the first unless named.
Every figure is the mean over the repeats of one point; the "spread" column is
(max - min) / mean of TTFT p90 over those repeats, the run-to-run noise.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from statistics import mean

ORDER = ["epp", "epp-latency", "reference", "epp-scraped-only", "epp-kv-scraped", "epp-lora", "round-robin", "sglang-cache-aware",
         "sglang-power-of-two", "vllm-cache-aware"]
LABELS = {
    "epp": "Envoy + epp (default)",
    "epp-latency": "Envoy + epp (learned latency)",
    "reference": "Envoy + reference picker (GIE v1.5.0, same config)",
    "epp-scraped-only": "Envoy + epp (default, countDispatched: false)",
    "epp-kv-scraped": "Envoy + epp (default, KV countDispatched: false)",
    "epp-lora": "Envoy + epp (default + lora-affinity-scorer)",
    "round-robin": "Envoy round-robin",
    "sglang-cache-aware": "sglang-router cache_aware",
    "sglang-power-of-two": "sglang-router power_of_two",
    "vllm-cache-aware": "vllm-router cache_aware",
}
STYLE = {
    "epp": dict(color="#d62728", marker="o", linewidth=2.5),
    "epp-latency": dict(color="#ff7f0e", marker="P", linewidth=2.5),
    "reference": dict(color="#000000", marker="X", linewidth=2),
    "epp-scraped-only": dict(color="#ff9896", marker="o", linestyle="--"),
    "epp-kv-scraped": dict(color="#e377c2", marker="o", linestyle=":"),
    "epp-lora": dict(color="#9467bd", marker="o", linestyle="-."),
    "round-robin": dict(color="#7f7f7f", marker="s", linestyle="--"),
    "sglang-cache-aware": dict(color="#1f77b4", marker="^"),
    "sglang-power-of-two": dict(color="#17becf", marker="v", linestyle=":"),
    "vllm-cache-aware": dict(color="#2ca02c", marker="D"),
}


def lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load(run_dir: Path) -> tuple[dict, list[dict]]:
    meta = json.loads((run_dir / "meta.json").read_text()) if (run_dir / "meta.json").exists() else {}
    return meta, lines(run_dir / "results.jsonl")


def avg(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return mean(values) if values else None


def fmt(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "—"
    return f"{v:,.{digits}f}"


def group(rows: list[dict]) -> dict:
    """workload -> contender -> rate -> [rows]"""
    g: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in rows:
        g[r["workload"]][r["contender"]][r["rate"]].append(r)
    return g


def table(workload: str, by_contender: dict) -> str:
    out = [
        "| req/s | contender | runs | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | spread p90 | TPOT p50 ms "
        "| out tok/s | hit rate | busiest server | errors |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rates = sorted({rate for c in by_contender.values() for rate in c})
    for rate in rates:
        for c in sorted(by_contender, key=lambda c: ORDER.index(c) if c in ORDER else 99):
            runs = by_contender[c].get(rate)
            if not runs:
                continue
            p90s = [r["ttft_p90_ms"] for r in runs if r["ttft_p90_ms"] is not None]
            spread = (max(p90s) - min(p90s)) / mean(p90s) if len(p90s) > 1 and mean(p90s) > 0 else None
            shares = []
            for r in runs:
                total = sum(r["served_per_sim"])
                if total:
                    shares.append(max(r["served_per_sim"]) / total)
            errors = sum(r["errors"] for r in runs)
            out.append(
                f"| {rate:g} | {LABELS.get(c, c)} | {len(runs)} | {fmt(avg([r['ttft_p50_ms'] for r in runs]))} "
                f"| {fmt(avg(p90s))} | {fmt(avg([r['ttft_p99_ms'] for r in runs]))} "
                f"| {fmt(spread * 100 if spread is not None else None)}{'%' if spread is not None else ''} "
                f"| {fmt(avg([r['tpot_p50_ms'] for r in runs]), 1)} "
                f"| {fmt(avg([r['output_tokens_per_s'] for r in runs]))} "
                f"| {fmt(avg([r['hit_rate'] for r in runs]), 3)} "
                f"| {fmt(avg(shares) * 100 if shares else None)}{'%' if shares else ''} | {errors} |"
            )
    return "\n".join(out)


def plot(g: dict, meta: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = [w for w in ["shared-prefix", "no-sharing", "lora-mix"] if w in g] + [
        w for w in g if w not in ("shared-prefix", "no-sharing", "lora-mix")
    ]
    cols = min(len(workloads), 4)
    rows = -(-len(workloads) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(max(8.0, 6.2 * cols), 5.4 * rows), squeeze=False)
    for ax in axes.flat[len(workloads):]:
        ax.set_visible(False)
    for ax, w in zip(axes.flat, workloads):
        for c in sorted(g[w], key=lambda c: ORDER.index(c) if c in ORDER else 99):
            rates = sorted(g[w][c])
            ys, lo, hi, xs = [], [], [], []
            for rate in rates:
                p90s = [r["ttft_p90_ms"] for r in g[w][c][rate] if r["ttft_p90_ms"] is not None]
                if not p90s:
                    continue
                m = mean(p90s)
                xs.append(rate)
                ys.append(m)
                lo.append(m - min(p90s))
                hi.append(max(p90s) - m)
            if xs:
                ax.errorbar(xs, ys, yerr=[lo, hi], label=LABELS.get(c, c), capsize=3, **STYLE.get(c, {}))
        ax.set_yscale("log")
        ax.set_xlabel("request rate (req/s, poisson)")
        ax.set_ylabel("TTFT p90 (ms, log scale)")
        ax.set_title(w)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"TTFT p90 vs request rate on 4 simulated vLLM servers (epp-sim); mean of runs, bars = min-max\n"
        f"{meta.get('cpus', '?')}-core {meta.get('cpu_model', '')}, git {meta.get('git', '?')}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dirs", type=Path, nargs="+", metavar="run_dir")
    ap.add_argument("--plot-out", type=Path)
    ap.add_argument("--md-out", type=Path)
    args = ap.parse_args()
    first = args.run_dirs[0]
    metas, rows, predictions = [], [], []
    for run_dir in args.run_dirs:
        meta, run_rows = load(run_dir)
        if not run_rows:
            sys.exit(f"no results in {run_dir}/results.jsonl")
        metas.append((run_dir, meta))
        rows += run_rows
        predictions += lines(run_dir / "predictions.jsonl")
    meta = metas[0][1]
    described = {w: d for _, m in metas for w, d in m.get("workloads", {}).items()}
    gits = sorted({m.get("git", "?") for _, m in metas})
    g = group(rows)
    md = [f"Run {run_dir.name}: `{m.get('command', '?')}` (git {m.get('git', '?')}, "
          f"{m.get('cpus', '?')} cores, {m.get('cpu_model', '?')})." for run_dir, m in metas] + [""]
    for w in g:
        desc = described.get(w, {}).get("description", "")
        md += [f"### {w}", "", desc, "", table(w, g[w]), ""]
    if predictions:
        md += ["### TTFT prediction error", "",
               "Per run of a contender whose epp learns latencies: the median of |predicted - observed| / "
               "observed over every TTFT sample of the run (each predicted by the endpoint's own model, once "
               "warm, before it was learned), and the share within 25 %.", "",
               "| workload | contender | run | samples | median relative error | within 25 % |",
               "|---|---|---:|---:|---:|---:|"]
        for p in predictions:
            md.append(f"| {p['workload']} | {LABELS.get(p['contender'], p['contender'])} | {p['repeat']} "
                      f"| {p['samples']} | {fmt(p['ttft_median_rel_error'], 3)} "
                      f"| {fmt(p['ttft_within_25pct'] * 100)} % |")
        md.append("")
    text = "\n".join(md)
    (args.md_out or first / "report.md").write_text(text)
    print(text)
    try:
        plot(g, {**meta, "git": ", ".join(gits)}, args.plot_out or first / "ttft_p90.png")
    except ImportError as e:
        print(f"no plot: {e} (scripts/setup-routing-bench.sh installs matplotlib)", file=sys.stderr)


if __name__ == "__main__":
    main()
