"""The report of bench_torch.py: its results as Markdown, and as a PNG bar chart of the shares."""

from __future__ import annotations

import statistics


def fmt(v, spec, none="-"):
    return none if v is None else format(v, spec)


def markdown(res):
    m, a = res["machine"], res["args"]
    L = [
        f"# optfuse.torch vs torch.optim AdamW{' — smoke test' if a['quick'] else ''}",
        "",
        f"CPU: {m['cpu']} ({m['cores']} cores, avx512f: {'yes' if m['avx512f'] else 'no'}); "
        f"torch {m['torch']} ({m['torch_threads']} threads); optfuse {m['optfuse']} "
        f"({m['optfuse_threads']} threads, target {m['target']}); Python {m['python']}.",
        f"Load average (1 min) at start / end: {m['loadavg_start']:.1f} / "
        f"{m['loadavg_end']:.1f}"
        + (
            " — the machine was busy: threads wait for cores, so "
            "multi-threaded torch ops pay scheduler delays"
            if m["loadavg_start"] > 0.5 * m["cores"]
            else ""
        )
        + ".",
        f"{a['rounds']} interleaved rounds x {a['steps'] or 'N'} steps (+{a['turn_warmup']} "
        "untimed per turn; N per case: at least 3, enough for ~10 ms of optfuse's steps), median "
        "of round medians. "
        "GB/s at 28 B/element; share = 4r3w ceiling time / time; x optfuse = time / optfuse "
        "time (> 1: optfuse is faster).",
        "",
    ]
    for key, c in res["cases"].items():
        L += [
            f"## {c['label']}: {c['tensors']} tensors, {c['elements'] / 1e6:.2f} M elements "
            f"({c['dtype']})",
            "",
            f"{c['steps']} timed steps per contender per round.",
            "",
            "| contender | ms / step | min | GB/s | share | x optfuse | note |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for r in c["rows"]:
            if r["role"] == "overhead":
                continue
            note = r["note"] or ""
            if r["setup_s"] is not None:
                what = "compile (first call)" if "compile" in r["name"] else "op load / build"
                note = (note + "; " if note else "") + f"{what} {r['setup_s']:.1f} s"
            L.append(
                f"| {r['name']} | {fmt(r.get('ms'), '.3f', 'n/a')} | "
                f"{fmt(r.get('min_ms'), '.3f')} | {fmt(r.get('gbps'), '.1f')} | "
                f"{fmt(r.get('share'), '.2f')} | {fmt(r.get('x_optfuse'), '.2f')} | {note} |"
            )
        o = c["overhead"]
        L.append("")
        if c["best_torch"]:
            L.append(
                f"optfuse's speed-up over the best torch ({c['best_torch']}): "
                f"**{c['optfuse_vs_best_torch']:.2f}x** (< 1: torch is faster)."
            )
        if o:
            L.append(
                f"Python step over the C++ step (same binding, paired per round): "
                f"{o['rebound_ms']:+.3f} ms ({o['rebound_us_per_tensor']:+.2f} us/tensor) "
                f"with new gradients (C++ `set_grads` + `step()`: {o['rebound_cpp_ms']:.3f} "
                f"ms, share {fmt(o['cpp_share'], '.2f')}), {o['same_grads_ms']:+.3f} ms "
                f"({o['same_grads_us_per_tensor']:+.2f} us/tensor) with the same ones "
                f"(C++ `step()`: {o['same_grads_cpp_ms']:.3f} ms)."
            )
        L.append("")
    for layout, s in (res.get("startup") or {}).items():
        med = {
            k: {
                f: statistics.median(x[f] for x in v) for f in ("s", "import_s", "ctor_s", "step_s")
            }
            for k, v in s.items()
        }
        L += [
            f"## Start-up: `import optfuse.torch` to first AdamW step done ({layout})",
            "",
            f"Fresh processes (torch imported first), {len(s['cold'])} run(s), medians, "
            "seconds. torch's constructor imports torch._dynamo (optfuse's does not); "
            "optfuse's kernels are compiled or loaded in the first step, which also makes "
            "the state (zeros) as torch's does.",
            "",
            "| | total | import | constructor | first step | compiled |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for k, label in (
            ("cold", "optfuse, empty cache"),
            ("warm", "optfuse, warm cache"),
            ("torch", "torch.optim.AdamW(fused=True)"),
        ):
            m, x = med[k], s[k][0]
            comp = (
                (
                    f"{x['compiles']} kernels + {x['runtime_compiles']} runtime, "
                    f"{x['disk_hits']} from disk"
                )
                if "compiles" in x
                else ""
            )
            L.append(
                f"| {label} | {m['s']:.3f} | {m['import_s']:.3f} | {m['ctor_s']:.3f} | "
                f"{m['step_s']:.3f} | {comp} |"
            )
        L.append("")
    if res.get("noop"):
        n = res["noop"]
        L += [
            "## Binding per-call cost",
            "",
            f"`optfuse._core.noop(0)`: "
            f"**{n['optfuse._core.noop']:.0f} ns** per call (an empty Python function: "
            f"{n['python def']:.0f} ns).",
            "",
        ]
    return "\n".join(L)


def plot(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(res["cases"].values())
    names = sorted(
        {r["name"] for c in cases for r in c["rows"] if r["role"] in ("main",) and r.get("share")},
        key=lambda n: (not n.startswith("optfuse"), n),
    )
    fig, ax = plt.subplots(figsize=(11, 5))
    w = 0.8 / max(1, len(names))
    top = 0.0
    for i, n in enumerate(names):
        rs = [
            next((r for r in c["rows"] if r["name"] == n and r.get("share")), None) for c in cases
        ]
        ys = [r["share"] if r else 0 for r in rs]
        top = max([top] + ys)
        # spread over rounds: the share at the slowest and at the fastest round
        lo = [r["share"] * r["ms"] / max(r["rounds_ms"]) if r else 0 for r in rs]
        hi = [r["share"] * r["ms"] / min(r["rounds_ms"]) if r else 0 for r in rs]
        ax.bar(
            [k + i * w for k in range(len(cases))],
            ys,
            w,
            label=n,
            yerr=[[y - l for y, l in zip(ys, lo)], [h - y for y, h in zip(ys, hi)]],
            error_kw={"elinewidth": 0.7, "capsize": 2},
        )
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_ylim(0, max(1.5, 1.3 * top))  # whiskers of a noisy run may leave the frame
    ax.set_xticks([k + 0.4 - w / 2 for k in range(len(cases))], [c["label"] for c in cases])
    ax.set_ylabel(
        "share of the 4r3w ceiling (ceiling time / step time)\n"
        "bars: median over rounds, whiskers: slowest..fastest round",
        fontsize=8,
    )
    m = res["machine"]
    ax.set_title(
        ("SMOKE TEST — " if res["args"]["quick"] else "") + f"AdamW step on {m['cpu']} "
        f"(avx512f {'yes' if m['avx512f'] else 'no'}), torch {m['torch']}, "
        f"{m['torch_threads']} threads; load average {m['loadavg_start']:.1f} at the "
        f"start, {m.get('loadavg_end', float('nan')):.1f} at the end",
        fontsize=9,
    )
    ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.07))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
