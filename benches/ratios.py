#!/usr/bin/env python3
"""Order-independent runs of a criterion bench group: one process per tenant count.

Criterion measures the functions of a group one after another in one process, and on a
small machine what ran before (heap layout, caches, the other core's load) moves a
function's rate by up to 2x. This runner starts the bench binary once per (round, tenant
count, binary), runs only that count's functions (a regex filter), reads criterion's
estimates and reports, per binary and tenant count, each function's rate and its ratio to
the baseline *measured in the same process*, as the median and the range over the rounds.
Several binaries (for example the same bench built from two commits) are interleaved
round by round, in alternating order, so slow drifts of the machine hit both alike.

    python3 benches/ratios.py --bin after=target/release/deps/multitenancy-HASH \
        [--bin before=OTHER] [--group multitenancy] [--counts 1,8,64,1024,10000] \
        [--rounds 5] [--measurement-time 2] [--warm-up-time 1] [--cpu 1] [--json OUT] \
        [--functions 'none|ebpf-jit']

Build the binary with `cargo bench --bench multitenancy --no-run` (cargo prints its
path). Nothing here needs root; `taskset` (util-linux) pins the run when `--cpu` is given.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", action="append", required=True, metavar="LABEL=PATH",
                   help="a criterion bench binary, labelled (repeat to compare)")
    p.add_argument("--group", default="multitenancy")
    p.add_argument("--baseline", default="single-tenant",
                   help="the function every other one is divided by")
    p.add_argument("--counts", default="1,8,64,1024,10000")
    p.add_argument("--functions", default="[^/]+",
                   help="regex of the functions to run (default: all; include the baseline)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--measurement-time", type=float, default=2.0)
    p.add_argument("--warm-up-time", type=float, default=1.0)
    p.add_argument("--cpu", default="1", help="pin to this CPU with taskset ('' = no pin)")
    p.add_argument("--elements", type=int, default=32 * 1024,
                   help="elements (packets) per iteration, for the rate")
    p.add_argument("--json", help="also write every measurement here")
    a = p.parse_args()
    bins = []
    for b in a.bin:
        label, sep, path = b.partition("=")
        if not sep or not label or not path:
            p.error(f"--bin wants LABEL=PATH, got {b!r}")
        if not os.access(path, os.X_OK):
            p.error(f"--bin {label}: {path} is not an executable file")
        bins.append((label, path))
    a.bins = bins
    try:
        a.counts = [int(c) for c in a.counts.split(",") if c]
    except ValueError:
        p.error(f"--counts wants comma-separated integers, got {a.counts!r}")
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    return a


def run_once(path, group, count, a):
    """Runs one process for one tenant count; returns {function: ns per iteration}."""
    home = tempfile.mkdtemp(prefix="buffet-ratios-")
    try:
        cmd = []
        if a.cpu:
            cmd += ["taskset", "-c", a.cpu]
        cmd += [path, "--bench", "--noplot",
                "--warm-up-time", str(a.warm_up_time),
                "--measurement-time", str(a.measurement_time),
                f"^{re.escape(group)}/({a.functions})/{count}$"]
        env = dict(os.environ, CRITERION_HOME=home)
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        if r.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed (exit {r.returncode}):\n{r.stdout[-2000:]}")
        out = {}
        gdir = os.path.join(home, group)
        if not os.path.isdir(gdir):
            sys.exit(f"{path}: no results for {group}/*/{count} (does the group exist?)")
        for fn in sorted(os.listdir(gdir)):
            est = os.path.join(gdir, fn, str(count), "new", "estimates.json")
            if os.path.exists(est):
                with open(est) as f:
                    out[fn] = json.load(f)["mean"]["point_estimate"]
        return out
    finally:
        shutil.rmtree(home, ignore_errors=True)


def fmt_range(xs, digits=2):
    med = statistics.median(xs)
    return f"{med:.{digits}f} ({min(xs):.{digits}f}–{max(xs):.{digits}f})"


def main():
    a = parse_args()
    # results[label][count][function] = [ns per iteration, one per round]
    results = {label: {c: {} for c in a.counts} for label, _ in a.bins}
    total = a.rounds * len(a.counts) * len(a.bins)
    done = 0
    for rnd in range(a.rounds):
        order = a.bins if rnd % 2 == 0 else list(reversed(a.bins))
        for count in a.counts:
            for label, path in order:
                done += 1
                print(f"[{done}/{total}] round {rnd + 1}, {count} tenants, {label}",
                      file=sys.stderr, flush=True)
                for fn, ns in run_once(path, a.group, count, a).items():
                    results[label][count].setdefault(fn, []).append(ns)

    print(f"\n{a.group}: median (min–max) over {a.rounds} rounds, one process per "
          f"round, tenant count and binary; Mpps = {a.elements} packets / mean time\n")
    print("| binary | tenants | function | Mpps | / " + a.baseline + " (same process) |")
    print("|---|---:|---|---|---|")
    for label, _ in a.bins:
        for count in a.counts:
            fns = results[label][count]
            base = fns.get(a.baseline)
            for fn in sorted(fns, key=lambda f: (f != a.baseline, f)):
                mpps = [a.elements / ns * 1e3 for ns in fns[fn]]
                ratio = "—"
                if base and fn != a.baseline:
                    ratio = fmt_range([b / t for t, b in zip(fns[fn], base)])
                print(f"| {label} | {count} | {fn} | {fmt_range(mpps, 1)} | {ratio} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"group": a.group, "rounds": a.rounds, "results": results}, f,
                      indent=1)


if __name__ == "__main__":
    main()
