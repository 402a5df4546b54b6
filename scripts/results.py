#!/usr/bin/python3
"""Results as a product: tables and plots of every benchmark suite next to its baseline.

    /usr/bin/python3 scripts/results.py --run           # run every suite, then write
    /usr/bin/python3 scripts/results.py --run --quick   # shorter criterion runs
    /usr/bin/python3 scripts/results.py                 # write from the last runs' data

Reads criterion's JSON (target/criterion/<group>/<function>/<value>/new/) and the CSV
files the bench binaries and `buffet sim` write under target/results/, and writes a
Markdown report (default docs/results/generated.md) with, per suite: our figure, the
baseline measured in the same run, the ratio, the paper's figure, the machine (CPU
model, cores, kernel, rustc) and the exact command; plus one PNG plot per suite
(docs/results/<suite>.png; matplotlib from Debian's python3-matplotlib, so run it with
/usr/bin/python3). With --notes FILE, that file's hand-written prose is appended
unchanged, so regenerating loses nothing.

Absolute numbers on a 2-core VM mean little; the ratios are the result.
"""

import argparse
import csv
import datetime
import json
import os
import platform
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
CRITERION = os.path.join(TARGET, "criterion")
RESULTS = os.path.join(TARGET, "results")

# Criterion suites: (key, title, bench, filter, groups, baseline arm, our arms, paper).
# A baseline `buffet@1` means "our own arm at one tenant" (scale: the slope).
CRITERION_SUITES = [
    ("multitenancy", "Multitenancy overhead (Buffet Fig. 5)", "multitenancy", "multitenancy/",
     ["multitenancy"], "single-tenant", ["buffet", "buffet-layout", "specialised"],
     "Buffet within 4 % of the single-tenant NF at 1-8 tenants (ratio >= 0.96)"),
    ("nfs", "Reference NFs, single-tenant vs Buffet", "nfs", "/(single-tenant|buffet)/",
     ["monitor", "firewall", "ids", "ipsec", "ipsec-inbound", "dpi", "macswap", "policer",
      "l2fwd", "flowfwd"], "single-tenant", ["buffet"],
     "Buffet Fig. 5: monitor, firewall, IDS, IPsec within 4 % of single-tenant"),
    ("isolation", "Protection cost per isolation level (FastPaas Figs. 5-7, NSX-BPF Table 1)",
     "isolation", "", ["monitor", "firewall", "macswap-64B", "macswap-1500B", "policer-64B",
                       "policer-1500B"], "none",
     ["none+guard", "safe", "mpk", "safe+mpk", "ebpf", "ebpf-jit"],
     "FastPaas: MPK protection costs a few percent; NSX-BPF: JIT-ed eBPF close to native"),
    ("ebpf", "eBPF DPI against the native DPI", "ebpf", "", ["dpi"], "native",
     ["ebpf", "ebpf-jit"], "NSX-BPF / REEdge: JIT-ed eBPF within tens of percent of native"),
    ("scale", "Scale to 16,384 tenants (REEdge Fig. 5 / Table 2)", "nfs", "scale-",
     ["scale-l2fwd-64B", "scale-l2fwd-1500B", "scale-flowfwd-64B", "scale-flowfwd-1500B"],
     "buffet@1", ["buffet"], "REEdge: throughput flat up to 4,096 ports"),
]

# CSV suites written by bench binaries: (key, title, file, producer command, paper).
CSV_SUITES = [
    ("sim", "Scheduling simulation (Buffet Figs. 7-8)", "sim.csv",
     "cargo run --release -- sim --csv > target/results/sim.csv",
     "Fig. 7: no scheduling 12.88 % overloaded, optimal and heuristic 0.66 %; Fig. 8: the "
     "optimum's time out of reach at 16 and 20 tenants"),
    ("dispatch_latency", "Dispatch in the NIC path vs on a core (Buffet Fig. 9)",
     "dispatch_latency.csv",
     "BUFFET_FIG9_CSV=target/results/dispatch_latency.csv cargo bench --bench dispatch_latency",
     "SmartNIC dispatch cuts average latency by 14-29 %"),
    ("procs", "Processes per tenant vs Buffet (Buffet Fig. 6)", "procs.csv",
     "BUFFET_PROCS_CSV=target/results/procs.csv cargo bench --bench procs",
     "Buffet up to 3x the throughput and 172x lower latency than a container or VM per tenant"),
    ("noisy", "Noisy neighbours: well-behaved tenants alone and beside noisy ones", "noisy.csv",
     "BUFFET_NOISY_CSV=target/results/noisy.csv cargo bench --bench noisy",
     "Issue 10: the well-behaved keep >= 95 % of their throughput alone and their p99 within 2x"),
]


def machine():
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        rustc = subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.strip()
    except OSError:
        rustc = "rustc unknown"
    return (f"{model}, {os.cpu_count()} cores, Linux {platform.release()}, {rustc}; "
            f"written {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")


def criterion_rates():
    """{(group, function, value): elements per second} from the latest runs."""
    out = {}
    for dirpath, _dirs, files in os.walk(CRITERION):
        if os.path.basename(dirpath) != "new" or "estimates.json" not in files:
            continue
        with open(os.path.join(dirpath, "benchmark.json")) as f:
            meta = json.load(f)
        with open(os.path.join(dirpath, "estimates.json")) as f:
            est = json.load(f)
        ns = (est.get("slope") or est["mean"])["point_estimate"]
        thr = meta.get("throughput") or {}
        elements = thr.get("Elements") or thr.get("Bytes") or 1
        out[(meta["group_id"], meta["function_id"], meta.get("value_str") or "")] = elements / ns * 1e9
    return out


def value_key(v):
    try:
        return (0, float(v))
    except ValueError:
        return (1, v)


def fmt_rate(r):
    return f"{r / 1e6:.2f}" if r is not None else "—"


def criterion_section(suite, rates, plots_dir, plt):
    key, title, bench, filt, groups, base, ours, paper = suite
    cmd = f"cargo bench --bench {bench}" + (f" -- '{filt}'" if filt else "")
    lines = [f"## {title}", "", f"Command: `{cmd}`. Paper: {paper}.", ""]
    series = {}
    any_row = False
    for g in groups:
        values = sorted({v for (gg, _f, v) in rates if gg == g}, key=value_key)
        arms = [a for a in ours if any((g, a, v) in rates for v in values)]
        if not values or not arms:
            continue
        any_row = True
        base_name = "buffet/1" if base == "buffet@1" else base
        head = f"| {g} | {base_name} Mpps | " + " | ".join(f"{a} Mpps | {a} ratio" for a in arms) + " |"
        lines += [head, "|" + "---|" * (2 + 2 * len(arms))]
        for v in values:
            b = rates.get((g, "buffet", "1")) if base == "buffet@1" else rates.get((g, base, v))
            cells = [f"n={v}", fmt_rate(b)]
            for a in arms:
                r = rates.get((g, a, v))
                ratio = (r / b) if (r is not None and b) else None
                cells += [fmt_rate(r), f"{ratio:.3f}" if ratio is not None else "—"]
                if ratio is not None:
                    series.setdefault(f"{g} {a}", []).append((v, ratio))
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    if not any_row:
        lines += [f"No data: run `{cmd}` (or `scripts/results.py --run`).", ""]
        return lines
    if plt is not None and series:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for label, pts in series.items():
            xs = [p[0] for p in pts]
            ax.plot(range(len(xs)), [p[1] for p in pts], marker="o", label=label)
            ax.set_xticks(range(len(xs)), xs)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xlabel("tenants")
        ax.set_ylabel(f"rate / {'buffet at 1 tenant' if base == 'buffet@1' else base}")
        ax.set_title(title)
        ax.legend(fontsize="x-small", ncol=2)
        fig.tight_layout()
        png = os.path.join(plots_dir, f"{key}.png")
        fig.savefig(png, dpi=110)
        plt.close(fig)
        lines += [f"![{title}]({key}.png)", ""]
    return lines


def csv_section(suite, plots_dir, plt):
    key, title, name, cmd, paper = suite
    path = os.path.join(RESULTS, name)
    lines = [f"## {title}", "", f"Command: `{cmd}`. Paper: {paper}.", ""]
    if not os.path.exists(path):
        return lines + [f"No data: `{path}` is missing.", ""]
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return lines + ["No rows.", ""]
    cols = list(rows[0].keys())
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(r[c] for c in cols) + " |" for r in rows]
    lines.append("")
    if plt is not None:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        if key == "sim":
            for pol in sorted({r["policy"] for r in rows}):
                pts = [(r["tenants"], float(r["overload_pct"])) for r in rows if r["policy"] == pol]
                ax.plot(range(len(pts)), [p[1] for p in pts], marker="o", label=pol)
                ax.set_xticks(range(len(pts)), [p[0] for p in pts])
            ax.set_xlabel("tenants")
            ax.set_ylabel("cases overloaded after scheduling (%)")
        elif key == "dispatch_latency":
            nfs = sorted({r["nf"] for r in rows})
            for i, mode in enumerate(["software", "xdp"]):
                ys = [float(next((r["p50_us"] for r in rows if r["nf"] == nf and r["dispatch"] == mode), "nan"))
                      for nf in nfs]
                ax.bar([x + i * 0.4 for x in range(len(nfs))], ys, width=0.4, label=f"{mode} p50")
            ax.set_xticks([x + 0.2 for x in range(len(nfs))], nfs)
            ax.set_ylabel("latency p50 (µs)")
        elif key == "procs":
            for (nf, arm) in sorted({(r["nf"], r["arm"]) for r in rows}):
                pts = [(r["tenants"], float(r["kpps"])) for r in rows if r["nf"] == nf and r["arm"] == arm]
                ax.plot(range(len(pts)), [p[1] for p in pts], marker="o", label=f"{nf} {arm}")
                ax.set_xticks(range(len(pts)), [p[0] for p in pts])
            ax.set_xlabel("tenants")
            ax.set_ylabel("aggregate throughput (kpps)")
        elif key == "noisy":
            for arm in ["alone", "crowd"]:
                pts = [float(r["p99_us"]) for r in rows if r["arm"] == arm]
                ax.plot(range(1, len(pts) + 1), pts, marker="o", label=f"{arm} p99")
            ax.set_xlabel("round")
            ax.set_ylabel("well-behaved latency p99 (µs)")
        ax.set_title(title)
        ax.legend(fontsize="x-small", ncol=2)
        fig.tight_layout()
        fig.savefig(os.path.join(plots_dir, f"{key}.png"), dpi=110)
        plt.close(fig)
        lines += [f"![{title}]({key}.png)", ""]
    return lines


def run_all(quick):
    os.makedirs(RESULTS, exist_ok=True)
    crit = ["--warm-up-time", "0.3", "--measurement-time", "1"] if quick else []
    env = dict(os.environ)
    steps = [
        (["cargo", "bench", "--bench", "multitenancy", "--", "multitenancy/"] + crit, env),
        (["cargo", "bench", "--bench", "nfs", "--"] + crit, env),
        (["cargo", "bench", "--bench", "isolation", "--"] + crit, env),
        (["cargo", "bench", "--bench", "ebpf", "--"] + crit, env),
        (["cargo", "bench", "--bench", "dispatch_latency"],
         dict(env, BUFFET_FIG9_CSV=os.path.join(RESULTS, "dispatch_latency.csv"))),
        (["cargo", "bench", "--bench", "procs"],
         dict(env, BUFFET_PROCS_CSV=os.path.join(RESULTS, "procs.csv"))),
        (["cargo", "bench", "--bench", "noisy"],
         dict(env, BUFFET_NOISY_CSV=os.path.join(RESULTS, "noisy.csv"))),
    ]
    for i, (cmd, e) in enumerate(steps, 1):
        print(f"results: [{i}/{len(steps) + 1}] {' '.join(cmd)}", file=sys.stderr, flush=True)
        subprocess.run(cmd, cwd=ROOT, env=e, check=True)
    print(f"results: [{len(steps) + 1}/{len(steps) + 1}] buffet sim --csv", file=sys.stderr, flush=True)
    with open(os.path.join(RESULTS, "sim.csv"), "w") as f:
        subprocess.run(["cargo", "run", "--release", "--", "sim", "--csv"], cwd=ROOT, stdout=f,
                       check=True)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="store_true", help="run every suite first")
    ap.add_argument("--quick", action="store_true", help="with --run: shorter criterion runs")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "generated.md"))
    ap.add_argument("--notes", help="hand-written prose appended unchanged")
    ap.add_argument("--no-plots", action="store_true")
    a = ap.parse_args(argv)
    if a.run:
        run_all(a.quick)
    plt = None
    if not a.no_plots:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("results: no matplotlib (install python3-matplotlib and use /usr/bin/python3); "
                  "writing tables only", file=sys.stderr)
    out_dir = os.path.dirname(os.path.abspath(a.out))
    os.makedirs(out_dir, exist_ok=True)
    rates = criterion_rates()
    lines = ["# Measured results", "",
             "Generated by `scripts/results.py` from the last benchmark runs; do not edit by "
             "hand (hand-written prose lives in the notes file it includes). Rates are "
             "criterion point estimates in million packets per second; ratios compare two "
             "arms of the same group measured in the same run. On a 2-core VM the ratios "
             "are the result, not the absolute numbers.", "",
             f"Machine: {machine()}.", ""]
    for s in CRITERION_SUITES:
        lines += criterion_section(s, rates, out_dir, plt)
    for s in CSV_SUITES:
        lines += csv_section(s, out_dir, plt)
    if a.notes:
        with open(a.notes) as f:
            lines += ["---", "", f.read()]
    with open(a.out, "w") as f:
        f.write("\n".join(lines).rstrip() + "\n")
    print(f"results: wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
