#!/usr/bin/env python3
"""Runs the benchmark suites and writes a Markdown summary and a PNG plot of GB/s against size.

    ~/.cache/optfuse/venv/bin/python bench/report.py [--build build] [--out DIR]
        [--quick] [--min-time S] [--max-size N] [--python PY] [--no-torch] [--no-plot]

Run it with the virtual environment's python (made by `bash scripts/python_setup.sh`: torch,
optfuse.torch and matplotlib), or with any python3 and --python pointing at that venv.

What it runs (Google Benchmark JSON and the torch run's JSON kept in --out):
  bench_update         AdamW fused / unfused / 4-read-3-write ceiling per size, 3 repetitions
  bench_matrix         every optimizer x dtype x size: GB/s, ceiling GB/s, share (paired)
  bench_precision      AdamW per precision (f32, bf16 state, bf16 params with and without master
                       weights): step time against bytes per element, each paired with a
                       ceiling that moves the same bytes (the second plot)
  bench_startup        cold compile, Halide runtime compile, warm load, time to first step
  bench_small_tensors  1000 x 1K tensors vs one 1M tensor through Optimizer::step()
  bench/python/bench_torch.py (in the venv's python): torch.optim.AdamW as the for-loop
                       (foreach=False), foreach and fused, optfuse.torch.AdamW and the 4r3w
                       ceiling, one process, interleaved rounds, at every size and on the
                       GPT-2 small and ResNet-50 layouts of examples/specs/ (the plot)
--quick: sizes up to 2^18, model dims / 8, short runs, three optimizers in the matrix (a smoke
test of the whole pipeline, not figures; the image says so).

The plot shows the torch run's lines (median over rounds, whiskers from the slowest to the
fastest round); without a torch run (--no-torch, no venv) it shows bench_update's C++ lines
instead. matplotlib comes from the set-up (scripts/python_setup.sh); this script installs
nothing, and without matplotlib it writes the report without the plot and says why. Figures are
only comparable within one report: run it on a quiet machine.
"""

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys

from report_precision import (
    human,
    mark_smoke_test,
    plot_precision,
    precision_rows,
    precision_table,
)

ALL_SIZES = [1 << p for p in range(10, 27, 2)]
HERE = os.path.dirname(os.path.abspath(__file__))
VENV_PYTHON = os.path.join(
    os.environ.get("OPTFUSE_VENV") or os.path.expanduser("~/.cache/optfuse/venv"), "bin", "python"
)
SETUP_HINT = (
    "run `bash scripts/python_setup.sh`, then `~/.cache/optfuse/venv/bin/python "
    "bench/report.py` (or pass --python)"
)
# bench_torch.py's contenders, as the plot and the table name them, in drawing order.
TORCH_LINES = [
    ("torch AdamW foreach=False (for-loop)", "torch for-loop (foreach=False)"),
    ("torch AdamW foreach=True", "torch foreach=True"),
    ("torch AdamW fused=True", "torch fused=True"),
    ("optfuse.torch.AdamW", "optfuse.torch.AdamW"),
    ("ceiling 4r3w (optfuse kernel)", "ceiling (4-read-3-write)"),
]
LAYOUTS = [("gpt2", "GPT-2 small"), ("resnet50", "ResNet-50")]


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
    return [
        b
        for b in (data or {}).get("benchmarks", [])
        if b.get("run_type", "iteration") == "iteration" and not b.get("error_occurred")
    ]


def gbps(b):
    return b.get("bytes_per_second", 0) / 1e9


def machine():
    """CPU name (model name, family / model), CPUs, AVX-512 flags: for the report and the plot."""
    info = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    get = lambda k: (re.search(rf"^{k}\s*:\s*(.*)$", info, re.M) or [None, ""])[1].strip()
    name = get("model name") or platform.processor() or platform.machine()
    if get("cpu family"):
        name += f" (family {get('cpu family')}, model {get('model')})"
    avx512 = sorted({f for f in get("flags").split() if f.startswith("avx512")})
    return {
        "cpu": name,
        "cpus": os.cpu_count(),
        "avx512": avx512,
        "loadavg": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def imports(python, modules):
    return (
        subprocess.run(
            [python, "-c", "import " + ", ".join(modules)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ).returncode
        == 0
    )


def find_python(asked, modules):
    """--python, else this interpreter, else the set-up's venv: the first that imports
    `modules`; (python, "") or (None, why)."""
    candidates = [asked] if asked else [sys.executable, VENV_PYTHON]
    for py in candidates:
        if py and os.path.exists(py) and imports(py, modules):
            return py, ""
    return None, (
        f"{' / '.join(c for c in candidates if c)} cannot import {', '.join(modules)}; "
        + SETUP_HINT
    )


def run_torch(python, out_json, sizes, quick, log):
    """bench_torch.py over one tensor per size and the model layouts; its JSON, or None."""
    # --quick makes bench_torch's flatN one tensor of 2^(N-4) and divides model dims by 8.
    flats = [f"flat{n.bit_length() - 1 + (4 if quick else 0)}" for n in sizes]
    cmd = [
        python,
        os.path.join(HERE, "python", "bench_torch.py"),
        "--cases",
        ",".join(flats + [k for k, _ in LAYOUTS]),
        "--no-compile",
        "--no-deepspeed",
        "--no-overhead",
        "--out-json",
        out_json,
    ] + (["--quick"] if quick else [])
    print("report:", " ".join(cmd), file=sys.stderr, flush=True)
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        log.append(f"- `bench_torch.py` failed ({r.returncode}): {r.stderr[-300:]}")
        return None
    with open(out_json) as f:
        return json.load(f)


def torch_series(res):
    """{label: {"sizes": [(n, med, lo, hi)], "layouts": {key: (med, lo, hi)}}}, GB/s at 28 B
    per element; lo / hi from the slowest and the fastest round."""
    out = {label: {"sizes": [], "layouts": {}} for _, label in TORCH_LINES}
    names = dict(TORCH_LINES)
    for key, c in res["cases"].items():
        for r in c["rows"]:
            if r["name"] not in names or not r.get("rounds_ms"):
                continue
            g = lambda ms: 28 * c["elements"] / (ms * 1e-3) / 1e9
            v = (g(r["ms"]), g(max(r["rounds_ms"])), g(min(r["rounds_ms"])))
            if key.startswith("flat"):
                out[names[r["name"]]]["sizes"].append((c["elements"],) + v)
            else:
                out[names[r["name"]]]["layouts"][key] = v
    for s in out.values():
        s["sizes"].sort()
    return out


def cpp_series(update_rows):
    """bench_update's lines in the same shape: median, min and max over repetitions."""
    out = {}
    for key, label in (
        ("AdamW_Unfused", "C++ unfused (8 kernels, torch eager's order)"),
        ("AdamW_Fused", "optfuse fused (C++ Kernel::run)"),
        ("Ceiling_4R3W", "ceiling (4-read-3-write)"),
    ):
        by = {}
        for b in update_rows:
            parts = b["name"].split("/")
            if parts[0] == "BM_" + key:
                by.setdefault(int(parts[1]), []).append(gbps(b))
        out[label] = {
            "sizes": [(n, statistics.median(v), min(v), max(v)) for n, v in sorted(by.items())],
            "layouts": {},
        }
    return out


def plot(data, png):
    """data: {"quick", "machine", "torch" (bench_torch JSON or None), "update_rows", "why"}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res, m = data["torch"], data["machine"]
    series = torch_series(res) if res else cpp_series(data["update_rows"])
    layouts = [(k, lab) for k, lab in LAYOUTS if any(k in s["layouts"] for s in series.values())]
    fig, axes = plt.subplots(
        1,
        2 if layouts else 1,
        figsize=(12 if layouts else 7.5, 5),
        gridspec_kw={"width_ratios": [2.2, 1]} if layouts else None,
        squeeze=False,
    )
    ax = axes[0][0]
    for label, s in series.items():
        if not s["sizes"]:
            continue
        n, med, lo, hi = zip(*s["sizes"])
        ceiling = label.startswith("ceiling")
        ax.errorbar(
            n,
            med,
            yerr=[[a - b for a, b in zip(med, lo)], [b - a for a, b in zip(med, hi)]],
            marker="o",
            ms=4,
            capsize=3,
            lw=1.2,
            label=label,
            ls="--" if ceiling else "-",
            color="k" if ceiling else None,
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("elements in one fp32 tensor")
    ax.set_ylabel("GB/s (AdamW's useful traffic, 28 B/element)")
    ax.set_title("one tensor", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    if layouts:
        bx = axes[0][1]
        names = [lab for lab, s in series.items() if s["layouts"]]
        w = 0.8 / len(names)
        for i, lab in enumerate(names):
            vals = [series[lab]["layouts"].get(k, (0, 0, 0)) for k, _ in layouts]
            med = [v[0] for v in vals]
            bx.bar(
                [j + i * w for j in range(len(layouts))],
                med,
                w,
                label=lab,
                color="k" if lab.startswith("ceiling") else f"C{i}",
                yerr=[[v[0] - v[1] for v in vals], [v[2] - v[0] for v in vals]],
                error_kw={"elinewidth": 0.8, "capsize": 2},
            )
        labels = [
            next(c["label"] for key, c in res["cases"].items() if key == k) for k, _ in layouts
        ]
        bx.set_xticks([j + 0.4 - w / 2 for j in range(len(layouts))], labels, fontsize=8)
        bx.set_title("model layouts (examples/specs/); colours as left", fontsize=10)
        bx.set_ylabel("GB/s (28 B/element)")
        bx.grid(True, axis="y", alpha=0.3)
    what = (
        (
            f"torch {res['machine']['torch']} ({res['machine']['torch_threads']} threads), "
            f"{res['args']['rounds']} interleaved rounds x {res['args']['steps']} steps; "
            "median, whiskers: slowest..fastest round"
        )
        if res
        else (
            "no torch run (" + data["why"][:60] + "): bench_update's C++ lines, "
            "min..max of 3 repetitions"
        )
    )
    avx = "AVX-512" if m["avx512"] else "no AVX-512"
    load = f", load average {m['loadavg']:.1f}" if m.get("loadavg") is not None else ""
    fig.suptitle(f"AdamW step, {m['cpu']}, {m['cpus']} CPUs, {avx}{load}\n{what}", fontsize=9)
    if data["quick"]:
        mark_smoke_test(fig)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def plot_with(python, data, out_dir, png):
    """Plots in `python` (which has matplotlib), running this script's --plot-only mode."""
    path = os.path.join(out_dir, "plot_input.json")
    with open(path, "w") as f:
        json.dump(data, f)
    r = subprocess.run(
        [python, os.path.abspath(__file__), "--plot-only", path, png],
        stderr=subprocess.PIPE,
        text=True,
    )
    return r.returncode == 0, r.stderr[-300:]


def torch_table(res):
    """Markdown: GB/s per case (median, slowest..fastest round) for every torch line."""
    series = torch_series(res)
    labels = [lab for _, lab in TORCH_LINES]
    lines = ["| case | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    fmt = lambda v: f"{v[0]:.3g} ({v[1]:.3g}–{v[2]:.3g})" if v else ""
    for key, c in res["cases"].items():
        if key.startswith("flat"):
            cells = [
                next((v[1:] for v in series[lab]["sizes"] if v[0] == c["elements"]), None)
                for lab in labels
            ]
        else:
            cells = [series[lab]["layouts"].get(key) for lab in labels]
        what = c["label"] if key.startswith("flat") else f"{c['label']} ({c['tensors']} tensors)"
        lines.append(f"| {what} | " + " | ".join(fmt(v) for v in cells) + " |")
    return lines


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
            data = json.load(f)
        (plot_precision if "precision" in data else plot)(data, sys.argv[3])
        return 0
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--build", default="build", help="build directory (default: build)")
    ap.add_argument(
        "--out", default="bench/report", help="output directory (default: bench/report)"
    )
    ap.add_argument("--quick", action="store_true", help="small sizes, short runs (smoke test)")
    ap.add_argument(
        "--min-time",
        type=float,
        default=None,
        help="seconds per benchmark (default 0.2; quick 0.01)",
    )
    ap.add_argument(
        "--max-size", type=int, default=None, help="largest size (default 2^26; quick 2^18)"
    )
    ap.add_argument(
        "--python",
        help="interpreter with torch, optfuse.torch and matplotlib "
        "(default: this one, else ~/.cache/optfuse/venv/bin/python or $OPTFUSE_VENV's)",
    )
    ap.add_argument("--no-torch", action="store_true", help="no torch run (C++ suites only)")
    ap.add_argument("--no-plot", action="store_true", help="no PNG")
    a = ap.parse_args()

    min_time = a.min_time if a.min_time is not None else (0.01 if a.quick else 0.2)
    max_size = a.max_size if a.max_size is not None else (1 << 18 if a.quick else 1 << 26)
    sizes = [n for n in ALL_SIZES if n <= max_size]
    os.makedirs(a.out, exist_ok=True)
    b = os.path.join(a.build, "bench")
    common = [f"--benchmark_min_time={min_time}"]
    log = []
    update = run_bench(
        os.path.join(b, "bench_update"),
        os.path.join(a.out, "update.json"),
        common
        + [
            "--benchmark_repetitions=3",
            "--benchmark_filter=BM_(AdamW_Fused|AdamW_Unfused|Ceiling_4R3W)" + size_filter(sizes),
        ],
        log,
    )
    # Quick: three optimizers in f32 and AdamW in bf16 only (each kernel's compile is most of a
    # quick run's time).
    only = "Matrix/((adamw|sgd|lion)/f32|adamw/bf16)" if a.quick else ""
    matrix = run_bench(
        os.path.join(b, "bench_matrix"),
        os.path.join(a.out, "matrix.json"),
        common + ["--benchmark_filter=" + only + size_filter(sizes)],
        log,
    )
    precision = run_bench(
        os.path.join(b, "bench_precision"),
        os.path.join(a.out, "precision.json"),
        common + ["--benchmark_filter=Precision/.*" + size_filter(sizes)],
        log,
    )
    startup_filter = ["--benchmark_filter=Startup_Warm|FirstStep_Warm"] if a.quick else []
    startup = run_bench(
        os.path.join(b, "bench_startup"), os.path.join(a.out, "startup.json"), startup_filter, log
    )
    small = run_bench(
        os.path.join(b, "bench_small_tensors"), os.path.join(a.out, "small.json"), common, log
    )
    torch_res, torch_why = None, "--no-torch"
    if not a.no_torch:
        tpy, torch_why = find_python(a.python, ["torch", "optfuse.torch"])
        if tpy:
            torch_res = run_torch(tpy, os.path.join(a.out, "torch.json"), sizes, a.quick, log)
            torch_why = "" if torch_res else "bench_torch.py failed"
        else:
            log.append(f"- torch run skipped: {torch_why}")

    m = machine()
    md = [
        f"# optfuse benchmark report{' — smoke test' if a.quick else ''}",
        "",
        f"{datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, {platform.node()}; CPU: {m['cpu']}, "
        f"{m['cpus']} CPUs, AVX-512: {' '.join(m['avx512']) or 'none'}; load average at the "
        f"end {m['loadavg']:.1f}; {'quick (smoke test: not figures)' if a.quick else 'full'} "
        f"run, min time {min_time} s per benchmark, sizes {human(sizes[0])}..{human(sizes[-1])}.",
        "",
    ]
    if matrix:
        ctx = matrix.get("context", {})
        md += [
            f"Machine: {ctx.get('num_cpus')} CPUs at {ctx.get('mhz_per_cpu')} MHz; caches: "
            + ", ".join(f"L{c['level']} {c['size'] >> 10} KiB" for c in ctx.get("caches", [])),
            "",
        ]

    png = os.path.join(a.out, "gbps_vs_size.png")
    urows = rows(update)
    if not a.no_plot and (torch_res or urows):
        python, why = find_python(a.python, ["matplotlib"])
        ok = False
        if python:
            data = {
                "quick": a.quick,
                "machine": m,
                "torch": torch_res,
                "update_rows": urows,
                "why": torch_why,
            }
            ok, why = plot_with(python, data, a.out, png)
        md += [f"![GB/s against size]({os.path.basename(png)})" if ok else f"(no plot: {why})", ""]

    prows = precision_rows(rows(precision))
    ppng = os.path.join(a.out, "time_vs_bytes.png")
    if not a.no_plot and prows:
        python, why = find_python(a.python, ["matplotlib"])
        ok = False
        if python:
            ok, why = plot_with(
                python, {"quick": a.quick, "machine": m, "precision": prows}, a.out, ppng
            )
        md += [
            f"![step time against bytes per element]({os.path.basename(ppng)})"
            if ok
            else f"(no precision plot: {why})",
            "",
        ]

    md += ["## AdamW from PyTorch: torch.optim vs optfuse.torch (GB/s)", ""]
    if torch_res:
        tm = torch_res["machine"]
        md += [
            f"`bench/python/bench_torch.py` in one process: torch {tm['torch']} "
            f"({tm['torch_threads']} threads), {torch_res['args']['rounds']} interleaved rounds "
            f"x {torch_res['args']['steps']} steps, median of round medians (slowest–fastest "
            "round); GB/s at 28 B/element, so ratios are speed ratios. Load average at its "
            f"start / end: {tm['loadavg_start']:.1f} / {tm['loadavg_end']:.1f}.",
            "",
        ]
        md += torch_table(torch_res) + [""]
    else:
        md += [f"(not run: {torch_why})", ""]

    md += ["## AdamW in C++: fused vs unfused vs ceiling (GB/s, median of 3 repetitions)", ""]
    if urows:
        md += [
            "| size | fused | unfused | ceiling | fused / ceiling |",
            "| --- | --- | --- | --- | --- |",
        ]
        cs = {lab: {n: v for n, v, _, _ in s["sizes"]} for lab, s in cpp_series(urows).items()}
        u, f, c = (cs[k] for k in cs)  # unfused, fused, ceiling
        fmt = lambda v: f"{v:.1f}" if v else ""
        for n in sizes:
            fn, un, cn = f.get(n), u.get(n), c.get(n)
            md.append(
                f"| {human(n)} | {fmt(fn)} | {fmt(un)} | {fmt(cn)} | "
                f"{f'{fn / cn:.2f}' if fn and cn else ''} |"
            )
        md.append("")
    else:
        md += ["(no results)", ""]
    md += [
        "## Every optimizer: GB/s (share of the 4-read-3-write ceiling, median of pairs)",
        "",
        "One tensor through `Optimizer::step()`; share is GB/s over the ceiling's GB/s at the same "
        "size, so optimizers moving less than 28 B/element (SGD: 12) cannot reach 1.0.",
        "",
    ]
    md += matrix_table(rows(matrix), sizes) + [""]

    md += [
        "## AdamW by precision: step time (share of a ceiling moving the same bytes)",
        "",
        "`bench_precision`: one tensor through `Optimizer::step()`, every timed step followed "
        "by one timed step of the 4-read-3-write graph with the same precision options and "
        "dtypes (the same loads and stores); median of the pairs' ratios.",
        "",
    ]
    md += precision_table(prows, sizes) + [""]

    md += ["## Start-up (compile and cache latency)", ""]
    srows = rows(startup)
    if srows:
        md += ["| benchmark | ms |", "| --- | --- |"]
        for r in srows:
            ms = r["real_time"] if r["time_unit"] == "ms" else r["real_time"] / 1e6
            md.append(f"| {r['name']} | {ms:.2f} |")
        md.append("")
    else:
        md += ["(no results)", ""]

    md += ["## Many small tensors", ""]
    trows = {r["name"].split("/")[0]: r for r in rows(small)}
    if "BM_Step_ManySmall" in trows and "BM_Step_OneLarge" in trows:
        ms, ol = trows["BM_Step_ManySmall"], trows["BM_Step_OneLarge"]
        md += [
            f"1000 x 1K tensors: {ms['real_time']:.1f} {ms['time_unit']} per step; one 1M tensor: "
            f"{ol['real_time']:.1f} {ol['time_unit']}; "
            f"ratio {ms['real_time'] / ol['real_time']:.2f} "
            "(target <= 2).",
            "",
        ]
        if "BM_Step_ManySmall_NewGrads" in trows:
            ng = trows["BM_Step_ManySmall_NewGrads"]
            md += [
                f"The same with new gradient buffers every step (set_grad x 1000, then step): "
                f"{ng['real_time']:.1f} {ng['time_unit']}.",
                "",
            ]
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
