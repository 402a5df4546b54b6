#!/usr/bin/python3
"""Results as a product: tables and plots of every benchmark suite next to its baseline.

    /usr/bin/python3 scripts/results.py --run           # run every suite, then write
    /usr/bin/python3 scripts/results.py --run --quick   # shorter criterion runs
    /usr/bin/python3 scripts/results.py                 # write from the last runs' data

Reads criterion's JSON (target/criterion/<group>/<function>/<value>/new/) and the CSV
files the bench binaries and `buffet sim` write under target/results/, and writes
docs/RESULTS.md with, per suite: our figure, the baseline measured in the same run, the
ratio, the paper's figure, the machine (CPU model, cores, kernel, rustc) and the exact
command; plus one PNG plot per suite (docs/results/<suite>.png; matplotlib from
Debian's python3-matplotlib, so run it with /usr/bin/python3). Suites the last runs
left no data for are listed once, with their commands, instead of a table.

The hand-written prose (setups, readings, measurements taken by hand, numbers from
other machines) lives in docs/results/notes.md; it is included unchanged after the
generated part, so regenerating loses nothing. Edit that file, never RESULTS.md.

The data each table was made from is kept beside it, in docs/results/data/ (criterion's
rates in criterion.csv, the bench binaries' CSV files as they wrote them, and in
sources.csv when and on which machine each was measured). A suite's fresh data under
target/ replaces its kept data (a whole criterion group, or a whole CSV file); a suite
without fresh data is drawn from the kept data. So a clean checkout regenerates the whole
document and its plots, and running one suite again leaves the others as they were. A
suite with neither keeps its section of the previous RESULTS.md, marked as such.

Absolute numbers on a 2-core VM mean little; the ratios are the result.
"""

import argparse
import csv
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
CRITERION = os.path.join(TARGET, "criterion")
RESULTS = os.path.join(TARGET, "results")
DATA = os.path.join(ROOT, "docs", "results", "data")
# The line that marks a section carried over from the previous RESULTS.md.
KEPT = ("_Kept from the previous RESULTS.md: neither target/ nor the kept data hold this "
        "suite's measurements._")
# What follows the machine in the header's "Machine: ..." line (read back by
# previous_sections).
MACHINE_TAIL = ", unless a section names another"

# Criterion suites: (key, title, bench, filter, groups, baseline arm, our arms, paper).
# A baseline `buffet@1` means "our own arm at one tenant" (scale: the slope).
CRITERION_SUITES = [
    ("multitenancy", "Multitenancy overhead (Buffet Fig. 5)", "multitenancy", "multitenancy/",
     ["multitenancy"], "single-tenant", ["buffet", "buffet-layout", "specialised"],
     "Buffet within 4 % of the single-tenant NF at 1-8 tenants (ratio >= 0.96)"),
    ("nfs", "Reference NFs: single-tenant, specialised multi-tenant and Buffet", "nfs",
     "/(single-tenant|specialised|buffet)/",
     ["monitor", "firewall", "ids", "ipsec", "ipsec-inbound", "dpi", "macswap", "policer",
      "l2fwd", "flowfwd"], "single-tenant", ["specialised", "buffet"],
     "Buffet Fig. 5: monitor, firewall, IDS, IPsec within 4 % of single-tenant (the "
     "specialised NF is this project's second baseline; goal: buffet / specialised >= 0.95)"),
    ("isolation", "Protection cost per isolation level (FastPaas Figs. 5-7, NSX-BPF Table 1)",
     "isolation", "", ["monitor", "firewall", "macswap-64B", "macswap-1500B", "policer-64B",
                       "policer-1500B"], "none",
     ["none+guard", "safe", "mpk", "safe+mpk", "ebpf", "ebpf-jit"],
     "FastPaas: MPK protection costs a few percent; NSX-BPF: JIT-ed eBPF close to native"),
    ("ebpf", "eBPF DPI against the native DPI", "ebpf", "", ["dpi"], "native",
     ["ebpf", "ebpf-jit"], "NSX-BPF / REEdge: JIT-ed eBPF within tens of percent of native"),
    ("scale", "Scale to 16,384 tenants (REEdge Fig. 5 / Table 2)", "nfs", "scale-",
     ["scale-l2fwd-64B", "scale-l2fwd-1500B", "scale-flowfwd-64B", "scale-flowfwd-1500B"],
     "buffet@1", ["specialised", "buffet"], "REEdge: throughput flat up to 4,096 ports"),
    ("chains", "Service chains: k stages vs one hand-fused NF, run to completion vs across "
     "threads (FastPaas Fig. 1)", "chains", "chains-f", ["chains-firewall", "chains-flowfwd"],
     "fused", ["chain", "pipelined", "pipelined-2t"],
     "FastPaas Fig. 1: run to completion ahead at every chain length (goal: chain-4 >= 0.95 "
     "of fused-4)"),
    ("chains-batching", "Service chains: path pre-splitting, per burst and with Packet "
     "Buffers (FastPaas Fig. 2)", "chains", "chains-batching", ["chains-batching"], "in-chain",
     ["presplit"], "FastPaas Fig. 2: small per-tenant groups per 128-packet batch; NIC "
     "pre-splitting proposed"),
]

# Ratios between two of a suite's own arms shown as a column of their own (numerator,
# denominator): Buffet against the specialised multi-tenant NF a provider would write by
# hand (issue 14's fair baseline at large tenant counts).
ARM_RATIOS = {"multitenancy": [("buffet", "specialised")], "nfs": [("buffet", "specialised")],
              "scale": [("buffet", "specialised")]}

# What the value of a criterion suite's benchmark ids counts, where it is not tenants.
X_LABELS = {"chains": "stages in the chain", "chains-batching": "Packet Buffers"}

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
     "BUFFET_PROCS_ROUNDS=3 BUFFET_PROCS_CSV=target/results/procs.csv cargo bench --bench procs",
     "Buffet up to 3x the throughput and 172x lower latency than a container or VM per tenant"),
    ("chains-latency", "Service chains: latency per packet, run to completion vs across threads "
     "(FastPaas Fig. 1)", "chains.csv", "cargo bench --bench chains -- chains-f",
     "FastPaas Fig. 1: the gap grows with the chain's length"),
    ("chains-fragmentation", "Service chains: packets per tenant group on a Zipf 1,000-tenant "
     "trace (FastPaas Fig. 2)", "chains_batching.csv",
     "cargo bench --bench chains -- chains-batching",
     "FastPaas Fig. 2: few packets per AS in each 128-packet batch"),
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
    return f"{model}, {os.cpu_count()} cores, Linux {platform.release()}, {rustc}"


def stamp(mtime):
    return f"{datetime.datetime.fromtimestamp(mtime, datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"


def criterion_rates(data, here):
    """{(group, function, value): elements per second}, {group: time of its newest
    estimate} and {group: machine}: the groups criterion measured under target/, and
    the kept ones (`data`/criterion.csv, unless `data` is empty) for the groups it did
    not. `here` is this machine, which measured what is under target/."""
    out, when = fresh_criterion_rates()
    fresh = set(when)
    where = {g: here for g in fresh}
    path = os.path.join(data, "criterion.csv") if data else None
    if path and os.path.exists(path):
        with open(path) as f:
            for r in csv.DictReader(f):
                g = r["group"]
                if g in fresh:
                    continue  # measured again: the new run replaces the whole group
                out[(g, r["function"], r["value"])] = float(r["elements_per_s"])
                when[g] = max(when.get(g, 0), float(r["measured"]))
                where[g] = r["machine"]
    return out, when, where


def fresh_criterion_rates():
    """{(group, function, value): elements per second} from the latest runs under
    target/, and {group: modification time of its newest estimate}."""
    out = {}
    when = {}
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
        t = os.path.getmtime(os.path.join(dirpath, "estimates.json"))
        when[meta["group_id"]] = max(when.get(meta["group_id"], 0), t)
    return out, when


def value_key(v):
    try:
        return (0, float(v))
    except ValueError:
        return (1, v)


def fmt_rate(r):
    return f"{r / 1e6:.2f}" if r is not None else "—"


def criterion_command(suite):
    """The command that measures a criterion suite."""
    _key, _title, bench, filt = suite[:4]
    return f"cargo bench --bench {bench}" + (f" -- '{filt}'" if filt else "")


def measured_text(times, machines, here):
    """" Measured <when>[ on <machine>]." for data taken at `times` on `machines` (the
    machine is named when it is not `here`, the machine of the document's header)."""
    if not times:
        return ""
    text = f" Measured {stamp(min(times))}" + (
        f" to {stamp(max(times))}" if max(times) - min(times) > 60 else "")
    if set(machines) - {here}:
        text += " on " + " and on ".join(sorted(set(machines)))
    return text + "."


def criterion_section(suite, measured, plots_dir, link, plt, here):
    """The suite's Markdown lines, or None when there is no data for it."""
    rates, when, where = measured
    key, title, bench, filt, groups, base, ours, paper = suite
    cmd = criterion_command(suite)
    times = [when[g] for g in groups if g in when]
    ran = measured_text(times, [where[g] for g in groups if g in where], here)
    lines = [f"## {title}", "", f"Command: `{cmd}`. Paper: {paper}.{ran}", ""]
    series = {}
    origin = {}  # series label -> (group, arm)
    any_row = False
    for g in groups:
        values = sorted({v for (gg, _f, v) in rates if gg == g}, key=value_key)
        arms = [a for a in ours if any((g, a, v) in rates for v in values)]
        if not values or not arms:
            continue
        any_row = True
        base_name = "buffet/1" if base == "buffet@1" else base
        pairs = [(x, y) for (x, y) in ARM_RATIOS.get(key, []) if x in arms and y in arms]
        head = (f"| {g} | {base_name} Mpps | " + " | ".join(f"{a} Mpps | {a} ratio" for a in arms)
                + "".join(f" | {x} / {y}" for (x, y) in pairs) + " |")
        lines += [head, "|" + "---|" * (2 + 2 * len(arms) + len(pairs))]
        for v in values:
            b = rates.get((g, "buffet", "1")) if base == "buffet@1" else rates.get((g, base, v))
            cells = [f"n={v}", fmt_rate(b)]
            for a in arms:
                r = rates.get((g, a, v))
                ratio = (r / b) if (r is not None and b) else None
                cells += [fmt_rate(r), f"{ratio:.3f}" if ratio is not None else "—"]
                if ratio is not None:
                    series.setdefault(f"{g} {a}", []).append((v, ratio))
                    origin[f"{g} {a}"] = (g, a)
            for x, y in pairs:
                rx, ry = rates.get((g, x, v)), rates.get((g, y, v))
                cells.append(f"{rx / ry:.3f}" if rx is not None and ry else "—")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    if not any_row:
        return None
    if plt is not None and series:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        if all(len(pts) == 1 for pts in series.values()):
            # One tenant count per group (the isolation levels, the eBPF DPI): grouped
            # bars, one group per benchmark group, one bar per arm.
            present = [g for g in groups if any(l.startswith(g + " ") for l in series)]
            arms = [a for a in ours if any(f"{g} {a}" in series for g in present)]
            width = 0.8 / len(arms)
            for i, a in enumerate(arms):
                xs = [x for x, g in enumerate(present) if f"{g} {a}" in series]
                ys = [series[f"{present[x]} {a}"][0][1] for x in xs]
                if xs:
                    ax.bar([x + i * width for x in xs], ys, width=width, label=a)
            ax.set_xticks([x + (len(arms) - 1) * width / 2 for x in range(len(present))],
                          present, fontsize="small")
        elif any(value_key(p[0])[0] for pts in series.values() for p in pts):
            # Named cases rather than counts (e.g. per burst / with Packet Buffers): bars.
            values = sorted({p[0] for pts in series.values() for p in pts}, key=value_key)
            width = 0.8 / len(series)
            for i, (label, pts) in enumerate(series.items()):
                ax.bar([values.index(p[0]) + i * width for p in pts], [p[1] for p in pts],
                       width=width, label=label)
            ax.set_xticks([x + (len(series) - 1) * width / 2 for x in range(len(values))],
                          values)
            ax.set_xlabel(X_LABELS.get(key, ""))
        else:
            values = sorted({p[0] for pts in series.values() for p in pts}, key=value_key)
            # One colour per benchmark group, one marker and line style per arm (Buffet,
            # or the suite's first arm, solid).
            colours = plt.get_cmap("tab20" if len(groups) > 10 else "tab10")
            styles = ["-", "--", ":", "-."]
            markers = ["o", "s", "^", "D", "v", "X", "P"]
            main = "buffet" if "buffet" in ours else ours[0]
            other_arms = [a for a in ours if a != main]
            for label, pts in series.items():
                g, a = origin[label]
                style = "-" if a == main else styles[1 + other_arms.index(a) % 3]
                # A single group: its arms take the colours.
                c = ours.index(a) if len({gg for gg, _ in origin.values()}) == 1 \
                    else groups.index(g)
                ax.plot([values.index(p[0]) for p in pts], [p[1] for p in pts],
                        marker=markers[ours.index(a) % len(markers)], color=colours(c),
                        linestyle=style, label=label)
            ax.set_xticks(range(len(values)), values)
            ax.set_xlabel(X_LABELS.get(key, "tenants"))
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_ylabel(f"rate / {'buffet at 1 tenant' if base == 'buffet@1' else base}")
        ax.set_title(title, fontsize="medium")
        ax.legend(fontsize="x-small", ncol=2)
        fig.tight_layout()
        png = os.path.join(plots_dir, f"{key}.png")
        fig.savefig(png, dpi=110)
        plt.close(fig)
        lines += [f"![{title}]({link(key)})", ""]
    return lines


def csv_source(name, data, kept, here):
    """Where a CSV suite's data is: (path, time measured, machine) of the file a bench
    wrote under target/results/, else of the kept copy in `data` (`kept`: its
    `kept_sources`); None without either."""
    path = os.path.join(RESULTS, name)
    if os.path.exists(path):
        return path, os.path.getmtime(path), here
    kept = kept.get(name)
    if kept and os.path.exists(os.path.join(data, name)):
        return os.path.join(data, name), kept[0], kept[1]
    return None


def kept_sources(data):
    """{file: (time measured, machine)} of the kept data (`data`/sources.csv; none when
    `data` is empty)."""
    path = os.path.join(data, "sources.csv") if data else None
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        return {r["file"]: (float(r["measured"]), r["machine"]) for r in csv.DictReader(f)}


def csv_section(suite, source, plots_dir, link, plt, here):
    """The suite's Markdown lines, or None when its CSV is missing or empty."""
    key, title, name, cmd, paper = suite
    if source is None:
        return None
    path, measured, machine = source
    ran = measured_text([measured], [machine], here)
    lines = [f"## {title}", "", f"Command: `{cmd}`. Paper: {paper}.{ran}", ""]
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return None
    cols = list(rows[0].keys())
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(r[c] for c in cols) + " |" for r in rows]
    lines.append("")
    if plt is not None:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        if key == "sim":
            # Fig. 7 (overloaded cases) beside Fig. 8 (compute time per case, log).
            plt.close(fig)
            fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
            for pol in sorted({r["policy"] for r in rows}):
                pts = [r for r in rows if r["policy"] == pol]
                xs = [r["tenants"] for r in pts]
                ax.plot(range(len(xs)), [float(r["overload_pct"]) for r in pts], marker="o",
                        label=pol)
                ax2.plot(range(len(xs)), [max(float(r["mean_us"]), 1e-3) for r in pts],
                         marker="o", label=pol)
                ax.set_xticks(range(len(xs)), xs)
                ax2.set_xticks(range(len(xs)), xs)
            ax.set_xlabel("tenants")
            ax.set_ylabel("cases overloaded after scheduling (%)")
            ax2.set_xlabel("tenants")
            ax2.set_ylabel("mean compute time per case (µs, log)")
            ax2.set_yscale("log")
        elif key == "dispatch_latency":
            nfs = sorted({r["nf"] for r in rows})
            for i, mode in enumerate(["software", "xdp"]):
                ys = [float(next((r["p50_us"] for r in rows if r["nf"] == nf and r["dispatch"] == mode), "nan"))
                      for nf in nfs]
                ax.bar([x + i * 0.4 for x in range(len(nfs))], ys, width=0.4, label=f"{mode} p50")
            ax.set_xticks([x + 0.2 for x in range(len(nfs))], nfs)
            ax.set_ylabel("latency p50 (µs)")
        elif key == "chains-latency":
            # Fig. 1's latency: p99 per packet against the chain's length, per NF and arm.
            for (nf, arm) in sorted({(r["nf"], r["arm"]) for r in rows}):
                pts = [r for r in rows if r["nf"] == nf and r["arm"] == arm]
                ax.plot([int(r["stages"]) for r in pts], [float(r["p99_ns"]) / 1e3 for r in pts],
                        marker="o", label=f"{nf} {arm}")
            ax.set_xticks(sorted({int(r["stages"]) for r in rows}))
            ax.set_xlabel("stages in the chain")
            ax.set_ylabel("p99 latency per packet (µs, log)")
            ax.set_yscale("log")
        elif key == "chains-fragmentation":
            # Fig. 2: mean packets per group of the first stage, per buffering and split.
            pts = [r for r in rows if r["what"] == "stage0-groups"]
            for i, split in enumerate(["no", "yes"]):
                sel = [r for r in pts if r["presplit"] == split]
                ax.bar([x + i * 0.4 for x in range(len(sel))], [float(r["mean"]) for r in sel],
                       width=0.4, label="pre-split" if split == "yes" else "split in the chain")
                ax.set_xticks([x + 0.2 for x in range(len(sel))], [r["buffers"] for r in sel])
            ax.set_xlabel("Packet Buffers' latency bound (none: groups cut per 128-packet burst)")
            ax.set_ylabel("mean packets per group (first stage)")
        elif key == "procs":
            # One column per NF, one line per arm, as the paper's Fig. 6 puts Buffet beside
            # containers/VMs: each arm at its own saturation (aggregate throughput on top,
            # p99 latency below), then every arm at the same offered load (the highest
            # measured, a fraction of the processes' rate): p99 and p50 (log).
            plt.close(fig)
            nfs = sorted({r["nf"] for r in rows})
            arms = sorted({r["arm"] for r in rows})
            # CSVs from before the offered loads have no `load` column: all saturated.
            sat = [r for r in rows if r.get("load", "window") in ("window", None)]
            loads = sorted({r["load"] for r in rows if r.get("load") not in ("window", None)},
                           key=float)
            at = [r for r in rows if loads and r.get("load") == loads[-1]]
            # CSVs from before the least-served share have no `least_share` column.
            fair = bool(sat) and "least_share" in sat[0]
            panels = (4 if at else 2) + fair
            fig, axes = plt.subplots(panels, len(nfs), figsize=(3.2 * len(nfs), 3 * panels),
                                     squeeze=False)
            for c, nf in enumerate(nfs):
                for arm in arms:
                    pts = [r for r in sat if r["nf"] == nf and r["arm"] == arm]
                    xs = [r["tenants"] for r in pts]
                    line, = axes[0][c].plot(range(len(xs)), [float(r["kpps"]) for r in pts],
                                            marker="o", label=arm)
                    axes[1][c].plot(range(len(xs)), [float(r["p99_us"]) for r in pts],
                                    marker="o", label=arm)
                    if pts and int(pts[0].get("rounds") or 1) > 1:
                        # Several rounds: the medians above, the rounds' range shaded.
                        for ax_, lo, hi in ((axes[0][c], "kpps_min", "kpps_max"),
                                            (axes[1][c], "p99_min_us", "p99_max_us")):
                            ax_.fill_between(range(len(xs)), [float(r[lo]) for r in pts],
                                             [float(r[hi]) for r in pts],
                                             color=line.get_color(), alpha=0.15)
                    for ax_ in (axes[0][c], axes[1][c]):
                        ax_.set_xticks(range(len(xs)), xs)
                    if fair:
                        axes[panels - 1][c].plot(range(len(xs)),
                                                 [float(r["least_share"]) for r in pts],
                                                 marker="o", color=line.get_color(), label=arm)
                        axes[panels - 1][c].set_xticks(range(len(xs)), xs)
                        axes[panels - 1][c].set_ylim(0, 1.05)
                    if at:
                        lp = [r for r in at if r["nf"] == nf and r["arm"] == arm]
                        lx = [r["tenants"] for r in lp]
                        for ax_, col in ((axes[2][c], "p99_us"), (axes[3][c], "p50_us")):
                            ax_.plot(range(len(lx)), [max(float(r[col]), 0.1) for r in lp],
                                     marker="o", color=line.get_color(), label=arm)
                            ax_.set_xticks(range(len(lx)), lx)
                            ax_.set_yscale("log")
                axes[0][c].set_title(nf)
                axes[1][c].set_yscale("log")
                axes[panels - 1][c].set_xlabel("tenants")
            if at:
                axes[2][0].set_ylabel(f"p99 at {loads[-1]} load (µs, log)")
                axes[3][0].set_ylabel(f"p50 at {loads[-1]} load (µs, log)")
            if fair:
                axes[panels - 1][0].set_ylabel("least-served tenant's share,\nsaturated")
            axes[0][0].set_ylabel("aggregate throughput (kpps)")
            axes[1][0].set_ylabel("p99 saturated (µs, log)")
            axes[0][0].legend(fontsize="x-small")
            fig.suptitle(title)
            fig.tight_layout()
            fig.savefig(os.path.join(plots_dir, f"{key}.png"), dpi=110)
            plt.close(fig)
            return lines + [f"![{title}]({link(key)})", ""]
        elif key == "noisy":
            for arm in ["alone", "crowd"]:
                pts = [float(r["p99_us"]) for r in rows if r["arm"] == arm]
                ax.plot(range(1, len(pts) + 1), pts, marker="o", label=f"{arm} p99")
                ax.set_xticks(range(1, len(pts) + 1))
            ax.set_xlabel("round")
            ax.set_ylabel("well-behaved latency p99 (µs)")
        ax.set_title(title, fontsize="medium")
        ax.legend(fontsize="x-small", ncol=2)
        fig.tight_layout()
        fig.savefig(os.path.join(plots_dir, f"{key}.png"), dpi=110)
        plt.close(fig)
        lines += [f"![{title}]({link(key)})", ""]
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
        (["cargo", "bench", "--bench", "chains", "--"] + crit, env),
        (["cargo", "bench", "--bench", "dispatch_latency"],
         dict(env, BUFFET_FIG9_CSV=os.path.join(RESULTS, "dispatch_latency.csv"))),
        (["cargo", "bench", "--bench", "procs"],
         dict(env, BUFFET_PROCS_ROUNDS="3", BUFFET_PROCS_CSV=os.path.join(RESULTS, "procs.csv"))),
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
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "RESULTS.md"))
    ap.add_argument("--plots", default=os.path.join(ROOT, "docs", "results"),
                    help="directory for the PNG plots (linked relative to --out)")
    ap.add_argument("--notes", default=os.path.join(ROOT, "docs", "results", "notes.md"),
                    help="hand-written prose included unchanged ('' for none)")
    ap.add_argument("--data", default=DATA,
                    help="directory of the kept data the tables are made from ('' for none)")
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
    plots_dir = os.path.abspath(a.plots)
    os.makedirs(plots_dir, exist_ok=True)
    link = lambda key: os.path.relpath(os.path.join(plots_dir, f"{key}.png"), out_dir)
    here = machine()
    previous = previous_sections(a.out)
    measured = criterion_rates(a.data, here)
    kept = kept_sources(a.data)
    lines = ["# Measured results", "",
             "<!-- Generated by scripts/results.py; edit docs/results/notes.md instead. -->", "",
             "The first part is generated by `/usr/bin/python3 scripts/results.py` from the "
             "last benchmark runs, or the data kept from them in docs/results/data/ (`--run` "
             "runs every suite first, `--quick` shortens the criterion runs). Rates are "
             "criterion point estimates in million packets per second; ratios compare two "
             "arms of the same group measured in the same run. On a 2-core VM the ratios are "
             "the result, not the absolute numbers. The second part is hand-written: setups, "
             "readings, and measurements taken by hand, each with its command.", "",
             f"Machine: {here}{MACHINE_TAIL}; written "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC.", ""]
    missing = []
    sources = {}
    for s in CRITERION_SUITES:
        sec = criterion_section(s, measured, plots_dir, link, plt, here)
        if sec is None:
            sec = kept_section(previous, s[1], here)
        if sec is None:
            missing.append((s[1], criterion_command(s)))
        else:
            lines += sec
    for s in CSV_SUITES:
        source = csv_source(s[2], a.data, kept, here)
        sec = csv_section(s, source, plots_dir, link, plt, here)
        if sec is not None:
            sources[s[2]] = source
        else:
            sec = kept_section(previous, s[1], here)
        if sec is None:
            missing.append((s[1], s[3]))
        else:
            lines += sec
    if missing:
        lines += ["## Suites without data in the last runs", ""]
        lines += [f"- {title}: `{cmd}`" for title, cmd in missing]
        lines.append("")
    if a.notes:
        with open(a.notes) as f:
            lines += ["---", "", f.read()]
    with open(a.out, "w") as f:
        f.write("\n".join(lines).rstrip() + "\n")
    print(f"results: wrote {a.out}", file=sys.stderr)
    if a.data:
        keep_data(a.data, measured, sources)
        print(f"results: kept the data in {a.data}", file=sys.stderr)
    return 0


def previous_sections(path):
    """({title: lines} of the generated sections of the document at `path`, the machine
    its header names): what a suite without data keeps. ({}, None) without a document."""
    if not os.path.exists(path):
        return {}, None
    with open(path) as f:
        text = f.read()
    generated = text.split("\n---\n", 1)[0].split("\n")
    out = {}
    title = None
    where = None
    for line in generated:
        if line.startswith("## "):
            title = line[3:]
            out[title] = []
        if title is not None:
            out[title].append(line)
        elif line.startswith("Machine: "):
            where = line[len("Machine: "):].split(MACHINE_TAIL)[0]
        elif line.startswith("Machine of the generated part: "):
            where = line[len("Machine of the generated part: "):].split("; written")[0]
    return out, where


def kept_section(previous, title, here):
    """The previous document's section `title`, marked as kept (once), or None. Its
    command line names the machine it was measured on, if the header named another."""
    sections, where = previous
    sec = sections.get(title)
    if not sec:
        return None
    body = list(sec)
    if KEPT in body:
        # Kept before: drop the mark and the blank line after it; it goes back below.
        at = body.index(KEPT)
        del body[at:at + 2]
    for i, line in enumerate(body[:4]):
        head, sep, measured = line.rpartition(" Measured ")
        if line.startswith("Command: ") and sep and where and where != here \
                and " on " not in measured:
            body[i] = f"{head}{sep}{measured.rstrip('.')} on {where}."
    # After the heading, the blank line, the command line and its blank line.
    at = min(4, len(body))
    return body[:at] + [KEPT, ""] + body[at:]


def keep_data(data, measured, sources):
    """Writes the data the tables were made from to `data`: criterion's rates with when
    and where each group was measured, the CSV suites' files and where they came from."""
    os.makedirs(data, exist_ok=True)
    rates, when, where = measured
    with open(os.path.join(data, "criterion.csv"), "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["group", "function", "value", "elements_per_s", "measured", "machine"])
        for (g, fn, v) in sorted(rates, key=lambda k: (k[0], k[1], value_key(k[2]))):
            w.writerow([g, fn, v, f"{rates[(g, fn, v)]:.1f}", f"{when[g]:.0f}", where[g]])
    for name, (path, _t, _m) in sources.items():
        dest = os.path.join(data, name)
        if os.path.abspath(path) != os.path.abspath(dest):
            shutil.copyfile(path, dest)
    with open(os.path.join(data, "sources.csv"), "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["file", "measured", "machine"])
        for name in sorted(sources):
            _p, t, m = sources[name]
            w.writerow([name, f"{t:.0f}", m])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
