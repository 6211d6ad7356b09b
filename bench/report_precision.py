"""bench/report.py's precision part: bench_precision's rows, the plot of AdamW's step time
against the bytes it moves per element for every way of storing params and state, and its table.
"""

import statistics


def human(n):
    """A size as the reports write it: 2^k for a power of two."""
    p = n.bit_length() - 1
    return f"2^{p}" if n == 1 << p else str(n)


def mark_smoke_test(fig):
    """Writes across a --quick run's plot that its numbers are no figures."""
    fig.text(
        0.5,
        0.5,
        "SMOKE TEST\nnot figures",
        ha="center",
        va="center",
        fontsize=44,
        color="red",
        alpha=0.25,
        rotation=20,
        weight="bold",
    )


# bench_precision's variants: label, colour.
PRECISION_VARIANTS = [
    ("f32", "f32 params, f32 state"),
    ("f32_state_bf16", "f32 params, bf16 state"),
    ("f32_state_int8", "f32 params, 8-bit state (state_dtype int8)"),
    ("bf16_master", "bf16 params + f32 master, f32 state"),
    ("bf16_master_bf16", "bf16 params + f32 master, bf16 state"),
    ("bf16_no_master", "bf16 params, no master (torch's way)"),
    ("f16_no_master", "f16 params, no master"),
]


def precision_rows(rows_):
    """{size: {variant: row}} from bench_precision's rows."""
    out = {}
    for b in rows_:
        parts = b["name"].split("/")
        if parts[0] == "Precision" and len(parts) >= 4:
            out.setdefault(int(parts[3]), {})[parts[2]] = b
    return out


def plot_precision(data, png):
    """Step time against bytes per element, one panel per size (the two largest run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {int(k): v for k, v in data["precision"].items()}
    sizes = sorted(by)[-2:]
    m = data["machine"]
    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 6.4), squeeze=False)
    for ax, n in zip(axes[0], sizes):
        xs = []
        for i, (key, label) in enumerate(PRECISION_VARIANTS):
            b = by[n].get(key)
            if not b:
                continue
            x, y, c = b["B_per_elem"], b["step_ms"], b["ceiling_ms"]
            xs.append(x)
            ax.plot(
                [x],
                [y],
                "o",
                ms=7,
                color=f"C{i}",
                label=f"{label}: {y:.3g} ms, {b['share']:.2f} of its ceiling",
            )
            ax.plot([x], [c], "_", ms=16, mew=2, color="k")
            ax.plot([x, x], [c, y], "-", lw=0.8, color=f"C{i}")
        if xs:
            # The ceilings' time per byte, as a line through the origin: what moving fewer bytes
            # can buy at best.
            rate = statistics.median(by[n][k]["ceiling_ms"] / by[n][k]["B_per_elem"] for k in by[n])
            top = max(xs) * 1.1
            ax.plot(
                [0, top],
                [0, rate * top],
                "--",
                color="k",
                lw=0.8,
                label="ceilings (black marks); dashed: median ceiling time per byte",
            )
        ax.set_xlim(0, None)
        ax.set_ylim(0, None)
        ax.set_xlabel("bytes per element per step (param, grad, state, master)")
        ax.set_ylabel("AdamW step time, ms (median)")
        ax.set_title(f"one tensor of {human(n)} elements", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14))  # off the points
    avx = "AVX-512" if m["avx512"] else "no AVX-512"
    load = f", load average {m['loadavg']:.1f}" if m.get("loadavg") is not None else ""
    fig.suptitle(
        f"AdamW step time by precision, {m['cpu']}, {m['cpus']} CPUs, {avx}{load}\n"
        "bench_precision: Optimizer::step(), each step paired with a ceiling step moving "
        "the same bytes",
        fontsize=9,
    )
    if data["quick"]:
        mark_smoke_test(fig)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def precision_table(by, sizes):
    """Markdown: per variant and size, step ms (share of its ceiling) and bytes per element."""
    shown = [n for n in sizes if n in by]
    if not shown:
        return ["(no results)"]
    lines = [
        "| variant | B/element | " + " | ".join(human(n) for n in shown) + " |",
        "|---|---:|" + "---:|" * len(shown),
    ]
    for key, label in PRECISION_VARIANTS:
        cells = [by[n].get(key) for n in shown]
        bpe = next((c["B_per_elem"] for c in cells if c), None)
        if bpe is None:
            continue
        lines.append(
            f"| {label} | {bpe:.0f} | "
            + " | ".join(f"{c['step_ms']:.3g} ms ({c['share']:.2f})" if c else "" for c in cells)
            + " |"
        )
    return lines
