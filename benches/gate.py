#!/usr/bin/env python3
"""Regression gate: compare two criterion baselines and fail on a throughput loss.

    cargo bench --bench multitenancy -- --save-baseline before
    # ... change the code ...
    cargo bench --bench multitenancy -- --save-baseline after
    python3 benches/gate.py before after            # exit 1 on a loss above 5 %

For every benchmark that has both baselines under target/criterion (or
$CARGO_TARGET_DIR/criterion, or --criterion DIR), the rate is throughput elements per
second from criterion's point estimate (the slope when criterion fitted one, else the
mean); the loss is 1 - after/before. A loss above --max-loss (default 0.05) fails,
and so does a benchmark that lost its "after" measurement (a suite that stopped running
must not pass silently). --filter REGEX limits the comparison to matching ids.

Output: one line per benchmark (before, after, change), regressions marked, then a
summary. Standard library only (no critcmp install needed).
"""

import argparse
import json
import os
import re
import sys


def load(root, baseline):
    """{full_id: (rate or time, unit)} for one baseline."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        if os.path.basename(dirpath) != baseline:
            continue
        if "estimates.json" not in files or "benchmark.json" not in files:
            continue
        with open(os.path.join(dirpath, "benchmark.json")) as f:
            meta = json.load(f)
        with open(os.path.join(dirpath, "estimates.json")) as f:
            est = json.load(f)
        point = est.get("slope") or est["mean"]
        ns = point["point_estimate"]
        thr = meta.get("throughput") or {}
        elements = thr.get("Elements") or thr.get("Bytes") or thr.get("BytesDecimal")
        if elements:
            out[meta["full_id"]] = (elements / (ns / 1e9), "/s")
        else:
            # No throughput: compare the inverse of the time (iterations per second).
            out[meta["full_id"]] = (1e9 / ns, "it/s")
    return out


def fmt(rate):
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if rate >= scale:
            return f"{rate / scale:.3f} {unit}"
    return f"{rate:.3f} "


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", help="the baseline to compare against")
    ap.add_argument("after", help="the baseline under test")
    ap.add_argument("--max-loss", type=float, default=0.05,
                    help="largest throughput loss allowed, as a fraction (default 0.05)")
    ap.add_argument("--criterion", help="criterion's output directory")
    ap.add_argument("--filter", help="compare only benchmark ids matching this regex")
    a = ap.parse_args(argv)
    root = a.criterion or os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "criterion")
    if not os.path.isdir(root):
        print(f"gate: {root}: no criterion output (run cargo bench with --save-baseline first)",
              file=sys.stderr)
        return 2
    before, after = load(root, a.before), load(root, a.after)
    pat = re.compile(a.filter) if a.filter else None
    ids = sorted(i for i in before if pat is None or pat.search(i))
    if not ids:
        print(f"gate: no benchmark has the baseline {a.before!r} under {root}", file=sys.stderr)
        return 2
    failed = 0
    for i in ids:
        b, unit = before[i]
        if i not in after:
            print(f"MISSING  {i}: no {a.after!r} measurement")
            failed += 1
            continue
        n, _ = after[i]
        change = n / b - 1.0
        bad = -change > a.max_loss
        failed += bad
        mark = "REGRESSED" if bad else "ok"
        print(f"{mark:<9} {i}: {fmt(b)}{unit} -> {fmt(n)}{unit} ({change:+.1%})")
    print(f"gate: {len(ids)} compared, {failed} failed (max loss {a.max_loss:.0%}, "
          f"{a.before} -> {a.after})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
