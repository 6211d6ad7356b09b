#!/usr/bin/env python3
"""Runs the benchmark suites and writes a Markdown summary and a PNG plot of GB/s against size.

    python3 bench/report.py [--build build] [--out bench/report] [--quick] [--min-time S]
                            [--max-size N] [--no-install] [--no-plot]

What it runs (all from the build directory, Google Benchmark JSON output kept in --out):
  bench_update         AdamW fused / unfused / 4-read-3-write ceiling per size (the plot)
  bench_matrix         every optimizer x dtype x size: GB/s, ceiling GB/s, share (paired)
  bench_startup        cold compile, Halide runtime compile, warm load, time to first step
  bench_small_tensors  1000 x 1K tensors vs one 1M tensor through Optimizer::step()
--quick: sizes up to 2^18, short runs, three optimizers in the matrix (a smoke test of the
whole pipeline, not figures).

The PNG needs matplotlib: if it is missing and we are root on Debian, `apt-get install -y
python3-matplotlib` is tried once (idempotent; --no-install skips it); without it the report is
written without the plot and says so. Figures are only comparable within one report: run it on
a quiet machine.
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys

ALL_SIZES = [1 << p for p in range(10, 27, 2)]


def run_bench(binary, out_json, args, log):
    if not os.path.exists(binary):
        log.append(f"- `{os.path.basename(binary)}`: not built (skipped)")
        return None
    cmd = [binary, f"--benchmark_out={out_json}", "--benchmark_out_format=json"] + args
    print("report:", " ".join(cmd), file=sys.stderr, flush=True)
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        log.append(f"- `{os.path.basename(binary)}` failed ({r.returncode}): {r.stderr[-300:]}")
        return None
    try:
        with open(out_json) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        log.append(f"- `{os.path.basename(binary)}`: no results ({e})")
        return None


def size_filter(sizes):
    # Names end in the size, or the size then "/real_time" or "/manual_time".
    return "/(" + "|".join(str(n) for n in sizes) + ")(/|$)"


def rows(data):
    return [b for b in (data or {}).get("benchmarks", []) if b.get("run_type", "iteration") == "iteration"
            and not b.get("error_occurred")]


def gbps(b):
    return b.get("bytes_per_second", 0) / 1e9


def human(n):
    p = n.bit_length() - 1
    return f"2^{p}" if n == 1 << p else str(n)


def has_matplotlib(python):
    return subprocess.run([python, "-c", "import matplotlib"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


def matplotlib_python(allow_install):
    """An interpreter that imports matplotlib (this one, or Debian's after apt-get), or None."""
    candidates = [sys.executable, "/usr/bin/python3"]
    for py in candidates:
        if os.path.exists(py) and has_matplotlib(py):
            return py, ""
    if not allow_install:
        return None, "matplotlib missing (--no-install)"
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return None, "matplotlib missing; install python3-matplotlib (apt-get) for the plot"
    print("report: installing python3-matplotlib ...", file=sys.stderr, flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "--no-install-recommends", "python3-matplotlib"]
    r = subprocess.run(install, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    if r.returncode != 0:  # stale package lists: update once and retry
        subprocess.run(["apt-get", "update"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        r = subprocess.run(install, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    for py in candidates:  # Debian's package serves Debian's python3
        if os.path.exists(py) and has_matplotlib(py):
            return py, ""
    return None, "matplotlib could not be installed: " + r.stderr[-200:]


def plot_with(python, update_json, png):
    """Plots in `python` (which has matplotlib), running this script's --plot-only mode."""
    r = subprocess.run([python, os.path.abspath(__file__), "--plot-only", update_json, png],
                       stderr=subprocess.PIPE, text=True)
    return r.returncode == 0, r.stderr[-300:]


def plot(update_rows, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    series = {"AdamW_Fused": "fused (optfuse)", "AdamW_Unfused": "unfused (8 kernels, torch eager)",
              "Ceiling_4R3W": "ceiling (4-read-3-write)"}
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for key, label in series.items():
        pts = sorted((int(b["name"].split("/")[1]), gbps(b)) for b in update_rows
                     if b["name"].split("/")[0] == "BM_" + key)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("elements per tensor (fp32)")
    ax.set_ylabel("GB/s (AdamW useful traffic, 28 B/element)")
    ax.set_title("AdamW step: fused vs unfused vs the machine's limit")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def matrix_table(matrix_rows, sizes):
    by = {}
    for b in matrix_rows:
        _, opt, dtype, n = b["name"].split("/")[:4]
        by.setdefault((opt, dtype), {})[int(n)] = b
    if not by:
        return ["(no results)"]
    head = "| optimizer | dtype | " + " | ".join(human(n) for n in sizes) + " |"
    lines = [head, "|" + " --- |" * (2 + len(sizes))]
    for (opt, dtype), cells in sorted(by.items()):
        vals = []
        for n in sizes:
            b = cells.get(n)
            vals.append(f"{b['GBps']:.1f} ({b['share']:.2f})" if b else "")
        lines.append(f"| {opt} | {dtype} | " + " | ".join(vals) + " |")
    return lines


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--plot-only":  # internal: see plot_with
        with open(sys.argv[2]) as f:
            plot(rows(json.load(f)), sys.argv[3])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="build directory (default: build)")
    ap.add_argument("--out", default="bench/report", help="output directory (default: bench/report)")
    ap.add_argument("--quick", action="store_true", help="small sizes, short runs (smoke test)")
    ap.add_argument("--min-time", type=float, default=None, help="seconds per benchmark (default 0.2; quick 0.01)")
    ap.add_argument("--max-size", type=int, default=None, help="largest size (default 2^26; quick 2^18)")
    ap.add_argument("--no-install", action="store_true", help="never apt-get install matplotlib")
    ap.add_argument("--no-plot", action="store_true", help="no PNG")
    a = ap.parse_args()

    min_time = a.min_time if a.min_time is not None else (0.01 if a.quick else 0.2)
    max_size = a.max_size if a.max_size is not None else (1 << 18 if a.quick else 1 << 26)
    sizes = [n for n in ALL_SIZES if n <= max_size]
    os.makedirs(a.out, exist_ok=True)
    b = os.path.join(a.build, "bench")
    common = [f"--benchmark_min_time={min_time}"]
    log = []
    update = run_bench(os.path.join(b, "bench_update"), os.path.join(a.out, "update.json"),
                       common + ["--benchmark_filter=BM_(AdamW_Fused|AdamW_Unfused|Ceiling_4R3W)"
                                 + size_filter(sizes)], log)
    # Quick: three optimizers in f32 and AdamW in bf16 only (each kernel's compile is most of a
    # quick run's time).
    only = "Matrix/((adamw|sgd|lion)/f32|adamw/bf16)" if a.quick else ""
    matrix = run_bench(os.path.join(b, "bench_matrix"), os.path.join(a.out, "matrix.json"),
                       common + ["--benchmark_filter=" + only + size_filter(sizes)], log)
    startup_filter = ["--benchmark_filter=Startup_Warm|FirstStep_Warm"] if a.quick else []
    startup = run_bench(os.path.join(b, "bench_startup"), os.path.join(a.out, "startup.json"),
                        startup_filter, log)
    small = run_bench(os.path.join(b, "bench_small_tensors"), os.path.join(a.out, "small.json"),
                      common, log)

    md = [f"# optfuse benchmark report", "",
          f"{datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"{os.cpu_count()} CPUs; {'quick (smoke test: not figures)' if a.quick else 'full'} run, "
          f"min time {min_time} s per benchmark, sizes {human(sizes[0])}..{human(sizes[-1])}.", ""]
    if matrix:
        ctx = matrix.get("context", {})
        md += [f"Machine: {ctx.get('num_cpus')} CPUs at {ctx.get('mhz_per_cpu')} MHz; caches: " +
               ", ".join(f"L{c['level']} {c['size'] >> 10} KiB" for c in ctx.get("caches", [])), ""]

    png = os.path.join(a.out, "gbps_vs_size.png")
    md += ["## AdamW: fused vs unfused vs ceiling (GB/s)", ""]
    urows = rows(update)
    if urows:
        md += ["| size | fused | unfused | ceiling | fused / ceiling |", "| --- | --- | --- | --- | --- |"]
        for n in sizes:
            get = {k: next((gbps(r) for r in urows if r["name"].split("/")[:2] == [f"BM_{k}", str(n)]), None)
                   for k in ("AdamW_Fused", "AdamW_Unfused", "Ceiling_4R3W")}
            f, u, c = get["AdamW_Fused"], get["AdamW_Unfused"], get["Ceiling_4R3W"]
            fmt = lambda v: f"{v:.1f}" if v else ""
            md.append(f"| {human(n)} | {fmt(f)} | {fmt(u)} | {fmt(c)} | {f / c:.2f} |" if f and c
                      else f"| {human(n)} | {fmt(f)} | {fmt(u)} | {fmt(c)} | |")
        md.append("")
        if not a.no_plot:
            python, why = matplotlib_python(not a.no_install)
            ok = False
            if python:
                ok, why = plot_with(python, os.path.join(a.out, "update.json"), png)
            md += [f"![GB/s against size]({os.path.basename(png)})" if ok else f"(no plot: {why})", ""]
    else:
        md += ["(no results)", ""]

    md += ["## Every optimizer: GB/s (share of the 4-read-3-write ceiling, median of pairs)", "",
           "One tensor through `Optimizer::step()`; share is GB/s over the ceiling's GB/s at the same "
           "size, so optimizers moving less than 28 B/element (SGD: 12) cannot reach 1.0.", ""]
    md += matrix_table(rows(matrix), sizes) + [""]

    md += ["## Start-up (compile and cache latency)", ""]
    srows = rows(startup)
    if srows:
        md += ["| benchmark | ms |", "| --- | --- |"]
        for r in srows:
            md.append(f"| {r['name']} | {r['real_time'] if r['time_unit'] == 'ms' else r['real_time'] / 1e6:.2f} |")
        md.append("")
    else:
        md += ["(no results)", ""]

    md += ["## Many small tensors", ""]
    trows = {r["name"].split("/")[0]: r for r in rows(small)}
    if "BM_Step_ManySmall" in trows and "BM_Step_OneLarge" in trows:
        ms, ol = trows["BM_Step_ManySmall"], trows["BM_Step_OneLarge"]
        md += [f"1000 x 1K tensors: {ms['real_time']:.1f} {ms['time_unit']} per step; one 1M tensor: "
               f"{ol['real_time']:.1f} {ol['time_unit']}; ratio {ms['real_time'] / ol['real_time']:.2f} "
               "(target <= 2).", ""]
        if "BM_Step_ManySmall_NewGrads" in trows:
            ng = trows["BM_Step_ManySmall_NewGrads"]
            md += [f"The same with new gradient buffers every step (set_grad x 1000, then step): "
                   f"{ng['real_time']:.1f} {ng['time_unit']}.", ""]
    else:
        md += ["(no results)", ""]
    if log:
        md += ["## Problems", ""] + log + [""]
    report = os.path.join(a.out, "report.md")
    with open(report, "w") as f:
        f.write("\n".join(md))
    print(report)
    return 0 if not log else 1


if __name__ == "__main__":
    sys.exit(main())
