"""Pictures of the benchmarks' JSON (`strata bench adam|io|prefetch|rpc --json`).

Usage: python3 bench/plot.py [--kind adam|io|prefetch|rpc] RESULTS.json OUT.png

`strata bench NAME --plot OUT.png` runs this on the run's JSON. The kind is
read from the JSON when not given.

  adam      Gelem/s per variant and thread count: ours, each peer (torch fused,
            DeepSpeed, torch foreach) and the bandwidth limit.
  io        MB/s against block size, one panel per op and queue depth: each of
            our engines, fio, fio with huge-page buffers, DeepSpeed's ds_io;
            plus the ExtentStore swap path against the raw engine.
  prefetch  hit rate and stall fraction against capacity per policy (LRU,
            predictor, Belady's MIN), one row per trace.
  rpc       call latency p50/p99 per call, and the bucket hand-off against
            memcpy.

Needs matplotlib (Debian's python3-matplotlib or the project's venv).
"""
import argparse
import json
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError as e:  # pragma: no cover
    sys.exit(f"plot.py: matplotlib is not importable with {sys.executable} ({e}); "
             "install python3-matplotlib or use the venv (bash scripts/venv.sh)")

PEERS = [("torch_fused", "torch fused (2.x)"), ("deepspeed", "DeepSpeed CPU"),
         ("torch_foreach", "torch foreach (1.13)")]


def detect(j):
    if "kernel_target" in j:
        return "adam"
    if "ds_io" in j or "extent_store" in j or (j.get("results") and "engine" in j["results"][0]):
        return "io"
    if j.get("results") and "policy" in j["results"][0]:
        return "prefetch"
    if "handoff" in j or (j.get("results") and "p99_us" in j["results"][0]):
        return "rpc"
    raise SystemExit("plot.py: cannot tell which benchmark wrote this JSON; pass --kind")


def variant_label(r):
    out = r.get("param_out", "none")
    label = f"{r['algo']} {r['grad_dtype']}" + (f"->{out}" if out != "none" else "")
    return f"{label}\n{r['threads']}T"


def plot_adam(j, out):
    rows = j["results"]
    series = [("ours (strata)", [r["elements_per_s"] / 1e9 for r in rows])]
    for key, name in PEERS:
        vals = [((r.get("peers") or {}).get(key) or 0) / 1e9 for r in rows]
        if any(vals):
            series.append((name, vals))
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(rows)), 5))
    width = 0.8 / len(series)
    xs = range(len(rows))
    for k, (name, vals) in enumerate(series):
        ax.bar([x - 0.4 + width * (k + 0.5) for x in xs], vals, width, label=name)
    ax.scatter([x for x in xs], [r["limit_elements_per_s"] / 1e9 for r in rows], marker="_", s=900,
               color="black", zorder=5, label="bandwidth limit")
    for x, r in zip(xs, rows):
        if r.get("speedup_vs_best_peer"):
            top = max([r["elements_per_s"], r["limit_elements_per_s"]] +
                      [v or 0 for v in (r.get("peers") or {}).values()]) / 1e9
            ax.annotate(f"{r['speedup_vs_best_peer']:.2f}x", (x, top * 1.03), ha="center", va="bottom",
                        fontsize=8, fontweight="bold")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([variant_label(r) for r in rows], fontsize=8)
    ax.set_ylabel("Gelem/s (fastest step)")
    ax.set_title(f"strata bench adam: {rows[0]['elements'] / 1e6:.0f}M elements, kernels {j['kernel_target']}"
                 " (labels: ours / best peer)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_io(j, out):
    results = j.get("results", [])
    ds = j.get("ds_io", [])
    store = j.get("extent_store")
    ops = sorted({r["op"] for r in results} | {d["op"] for d in ds})
    depths = sorted({r["queue_depth"] for r in results} | {d["queue_depth"] for d in ds})
    ncols = max(1, len(depths))
    nrows = max(1, len(ops)) + (1 if store else 0)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.4 * nrows), squeeze=False)
    for i, op in enumerate(ops):
        for k, qd in enumerate(depths):
            ax = axes[i][k]
            engines = sorted({r["engine"] for r in results if r["op"] == op and r["queue_depth"] == qd})
            for e in engines:
                pts = sorted((r for r in results if r["op"] == op and r["queue_depth"] == qd and r["engine"] == e),
                             key=lambda r: r["block_size"])
                bs = [r["block_size"] / 2**20 for r in pts]
                line, = ax.plot(bs, [r["mbps"] for r in pts], "o-", label=f"ours {e}")
                if any(r.get("fio_mbps") for r in pts):
                    ax.plot(bs, [r.get("fio_mbps") or float("nan") for r in pts], "s--", color=line.get_color(),
                            alpha=0.6, label=f"fio {e}")
                if any(r.get("fio_huge_mbps") for r in pts):
                    ax.plot(bs, [r.get("fio_huge_mbps") or float("nan") for r in pts], "^:",
                            color=line.get_color(), alpha=0.6, label=f"fio-huge {e}")
            dpts = sorted((d for d in ds if d["op"] == op and d["queue_depth"] == qd), key=lambda d: d["block_size"])
            if dpts:
                ax.plot([d["block_size"] / 2**20 for d in dpts], [d["ds_io_mbps"] for d in dpts], "D-",
                        color="black", label="ds_io (DeepSpeed aio)")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{op}, queue depth {qd}", fontsize=9)
            ax.set_xlabel("block size (MiB)", fontsize=8)
            ax.set_ylabel("MB/s", fontsize=8)
            ax.grid(alpha=0.3)
            if i == 0 and k == 0:
                ax.legend(fontsize=6)
    if store:
        ax = axes[nrows - 1][0]
        names = ["write", "read"]
        ax.bar([0, 2], [store["raw_write_mbps"], store["raw_read_mbps"]], 0.8, label="raw engine")
        ax.bar([1, 3], [store["write_mbps"], store["read_mbps"]], 0.8,
               label=f"ExtentStore + {store['checksum']}")
        for x, name in zip([1, 3], names):
            ratio = store.get(f"{name}_ratio") or store[f"{name}_mbps"] / store[f"raw_{name}_mbps"]
            if ratio:
                ax.annotate(f"{ratio:.3f}x", (x, store[f"{name}_mbps"]), ha="center", va="bottom", fontsize=8)
        ax.set_xticks([0.5, 2.5])
        ax.set_xticklabels(names)
        ax.set_ylabel("MB/s", fontsize=8)
        ax.set_title("swap path: store vs raw (target >= 0.97x)", fontsize=9)
        ax.legend(fontsize=6)
        for k in range(1, ncols):
            axes[nrows - 1][k].axis("off")
    load = j.get("config", {}).get("load_average_at_start")
    fig.suptitle(f"strata bench io ({j.get('config', {}).get('dir', '')}; load at start "
                 f"{load[0]:.1f})" if load else "strata bench io", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_prefetch(j, out):
    rows = j["results"]
    traces = sorted({r["trace"] for r in rows})
    fig, axes = plt.subplots(len(traces), 2, figsize=(10, 3.4 * len(traces)), squeeze=False)
    for i, trace in enumerate(traces):
        for policy in sorted({r["policy"] for r in rows if r["trace"] == trace}):
            pts = sorted((r for r in rows if r["trace"] == trace and r["policy"] == policy),
                         key=lambda r: r["capacity"])
            style = "k--" if policy == "belady" else "o-"
            caps = [r["capacity"] for r in pts]
            axes[i][0].plot(caps, [r.get("hit_rate_steady", r["hit_rate"]) for r in pts], style,
                            label=policy + (" (MIN)" if policy == "belady" else ""))
            axes[i][1].plot(caps, [r.get("stall_fraction_steady", r["stall_fraction"]) for r in pts], style,
                            label=policy)
        axes[i][0].set_title(f"{trace}: hit rate (steady state)", fontsize=9)
        axes[i][1].set_title(f"{trace}: stall fraction (steady state)", fontsize=9)
        for ax in axes[i]:
            ax.set_xlabel("capacity (fraction of the working set)", fontsize=8)
            ax.grid(alpha=0.3)
        axes[i][0].legend(fontsize=7)
    fig.suptitle("strata bench prefetch: policies vs Belady's MIN", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_rpc(j, out):
    rows = j["results"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 1]})
    xs = range(len(rows))
    a.bar([x - 0.2 for x in xs], [r["p50_us"] for r in rows], 0.4, label="p50")
    a.bar([x + 0.2 for x in xs], [r["p99_us"] for r in rows], 0.4, label="p99")
    a.set_xticks(list(xs))
    a.set_xticklabels([r["call"] for r in rows], fontsize=8, rotation=20)
    a.set_ylabel("microseconds")
    a.set_yscale("log")
    a.axhline(50, color="black", ls="--", lw=1, label="grad_ready p99 target 50 us")
    a.legend(fontsize=7)
    a.grid(axis="y", alpha=0.3)
    a.set_title("call latency", fontsize=9)
    h = j.get("handoff")
    if h:
        b.bar([0, 1], [h["memcpy_s"] * 1e3, h["handoff_s"] * 1e3], 0.6, color=["gray", "tab:blue"])
        b.set_xticks([0, 1])
        b.set_xticklabels(["memcpy", "hand-off"])
        b.set_ylabel("ms per bucket")
        b.set_title(f"{h['bucket_bytes'] / 2**20:.0f} MiB bucket: {j.get('handoff_vs_memcpy', 0):.2f}x memcpy",
                    fontsize=9)
    else:
        b.axis("off")
    fig.suptitle("strata bench rpc", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=["adam", "io", "prefetch", "rpc"])
    ap.add_argument("json")
    ap.add_argument("png")
    args = ap.parse_args()
    with open(args.json) as f:
        j = json.load(f)
    kind = args.kind or detect(j)
    {"adam": plot_adam, "io": plot_io, "prefetch": plot_prefetch, "rpc": plot_rpc}[kind](j, args.png)
    print(f"wrote {args.png} ({kind})")


if __name__ == "__main__":
    main()
