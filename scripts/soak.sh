#!/usr/bin/env bash
# The soak run (examples/soak.rs, docs/robustness.md): traffic as fast as the machine
# takes it for N seconds (default 600) while tenants are admitted and removed throughout.
# Prints rate, RSS, threads and Memory Manager regions at intervals; fails when a tenant's
# packets do not add up, RSS grows past the limit after the warm-up, or a region or a
# thread leaks.
#
#   scripts/soak.sh [SECONDS] [extra soak arguments, e.g. --max-rss-growth 10 --workers 2]
#
# BUFFET_SOAK_PROFILE=dev builds without --release (quicker to build, slower to run).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-600}"
shift || true
profile=(--release)
if [ "${BUFFET_SOAK_PROFILE:-release}" = dev ]; then
  profile=()
fi
exec cargo run --quiet --locked "${profile[@]}" --example soak -- --seconds "$seconds" "$@"
