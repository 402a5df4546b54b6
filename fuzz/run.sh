#!/usr/bin/env bash
# Builds every fuzz target with cargo-fuzz (libFuzzer, no sanitizer: `-s none`, which
# stable Rust supports) and runs each for SECONDS (default 30) from the seed corpus
# (seeds.sh). Prints execs/s and total execs per target. Exits non-zero on a crash, a
# timeout or an out-of-memory; the failing input is left under fuzz/artifacts/<target>/.
#
# Usage: fuzz/run.sh [SECONDS] [TARGET...]   (docs/fuzzing.md)
set -uo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-30}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(packet_classify nf_handle tenants_config ebpf_load api_requests)
fi
# cargo-fuzz keeps its own target directory (the instrumented build shares nothing
# with the workspace's); an inherited CARGO_TARGET_DIR would mix the two.
unset CARGO_TARGET_DIR

if ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "cargo-fuzz is missing: cargo install cargo-fuzz --locked" >&2
  exit 2
fi

fuzz/seeds.sh || exit 2
cargo fuzz build -s none || exit 2

status=0
summary=()
for t in "${targets[@]}"; do
  mkdir -p "fuzz/artifacts/$t"
  log="fuzz/artifacts/$t.log"
  echo "== fuzz $t for ${seconds}s"
  # -timeout: one input may take at most 10 s (ebpf_load's verifier budget is 1 s);
  # -rss_limit_mb: libFuzzer's default, written out.
  cargo fuzz run -s none "$t" "fuzz/corpus/$t" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 >"$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  speed=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*')
  corpus=$(ls "fuzz/corpus/$t" | wc -l)
  contained=$(grep -c 'contained verifier panic' "$log" || true)
  if [ "$rc" -eq 0 ]; then
    result="ok"
  else
    result="FAILED (exit $rc; input under fuzz/artifacts/$t/, log $log)"
    grep -E 'panicked|ERROR: libFuzzer|SUMMARY|Test unit written' "$log" | head -5
    status=1
  fi
  line="$t: ${execs:-0} execs, ${speed:-0} execs/s, cov ${cov:-?}, corpus $corpus, contained verifier panics $contained: $result"
  echo "$line"
  summary+=("$line")
done

echo "== fuzz summary (${seconds}s per target)"
printf '%s\n' "${summary[@]}"
exit $status
