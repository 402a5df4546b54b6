#!/usr/bin/env bash
# Runs commands on a CPU with protection keys (`pku`) when this machine has none: inside
# a QEMU guest whose CPU is emulated in software (TCG, `-cpu max`), which implements
# Intel MPK (PKRU, RDPKRU/WRPKRU, protection-key faults with SEGV_PKUERR).
#
# Usage:
#   scripts/mpk-vm.sh tests            build the MPK test groups on this host, then run
#                                      them in the guest under BUFFET_REQUIRE_PKU=1
#   scripts/mpk-vm.sh run -- CMD [ARG...]
#                                      run one command in the guest, in the current
#                                      directory, with the same environment rules
#
# What it does:
#   * boots the newest kernel under /boot (vmlinuz-<version>, with /lib/modules/<version>;
#     MPK_VM_KERNEL=/boot/vmlinuz-<version> picks another) with `-accel tcg -cpu max
#     -smp 2` (never KVM: KVM would hand the guest this host's CPU, without `pku`) and
#     MPK_VM_MEMORY MiB of memory (default 4096);
#   * an initramfs made here of the static busybox (/bin/busybox, package busybox-static),
#     an /init script and the kernel's 9p/virtio modules;
#   * shares this host's root file system read-only over 9p; the guest chroots into it,
#     with proc, sys, dev, a tmpfs on /tmp and /dev/shm, and a tmpfs on each directory
#     named in MPK_VM_WRITABLE (colon-separated; `tests` adds the target's tmp directory,
#     where the C NF tests compile their objects); everything else is read-only, so the
#     guest never builds anything with cargo: the test binaries are built on the host;
#   * a second, writable 9p share (a temporary directory of the host) carries the command
#     in and the exit status and output back; the command's output also streams to the
#     terminal through the guest's serial console;
#   * the guest gets PATH, HOME, CI, CC, RUST_BACKTRACE, CARGO_TARGET_DIR and every
#     BUFFET_* variable of this environment, and BUFFET_REQUIRE_PKU=1 (a hardware skip is a
#     failure: the guest has `pku`), and checks that its /proc/cpuinfo lists `pku` and
#     `ospke` before running anything.
#
# The exit status is the command's (for `tests`: 0 only when every group passed). A
# guest that runs longer than MPK_VM_TIMEOUT seconds (default 3600) is killed, with a
# message saying so, and the status is 124. A missing qemu-system-x86_64, kernel, module
# or busybox is an error (status 2) naming what is missing and the Debian package that
# has it — never a skip.
#
# What it does not do: prove anything about timing (TCG runs code 10-50x slower than the
# host, and its PKRU is a software register), use networking (the guest has loopback
# only), or run on a non-x86-64 host. See docs/isolation.md, "Running the MPK tests without pku".
set -euo pipefail

die() {
  echo "mpk-vm: error: $*" >&2
  exit 2
}

usage() {
  sed -n '5,10p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

repo=$(cd "$(dirname "$0")/.." && pwd)
memory=${MPK_VM_MEMORY:-4096}
timeout_s=${MPK_VM_TIMEOUT:-3600}
case "$memory" in '' | *[!0-9]*) die "MPK_VM_MEMORY must be a number of MiB, not '$memory'" ;; esac
case "$timeout_s" in '' | *[!0-9]*) die "MPK_VM_TIMEOUT must be a number of seconds, not '$timeout_s'" ;; esac

# --- what the guest needs from the host -------------------------------------------------

check_tools() {
  command -v qemu-system-x86_64 >/dev/null 2>&1 ||
    die "qemu-system-x86_64 not found (Debian: apt-get install --no-install-recommends qemu-system-x86)"
  [ -x /bin/busybox ] && [[ $'\n'$(/bin/busybox --list 2>/dev/null)$'\n' == *$'\ncpio\n'* ]] ||
    die "/bin/busybox (static, with cpio) not found (Debian: apt-get install busybox-static)"
  file_is_static /bin/busybox || die "/bin/busybox is not statically linked (Debian: busybox-static)"
  if [ -n "${MPK_VM_KERNEL:-}" ]; then
    kernel=$MPK_VM_KERNEL
    [ -f "$kernel" ] || die "MPK_VM_KERNEL=$kernel: no such file"
  else
    kernel=$(ls -1 /boot/vmlinuz-* 2>/dev/null | sort -V | tail -n 1 || true)
  fi
  [ -n "$kernel" ] && [ -f "$kernel" ] ||
    die "no kernel image /boot/vmlinuz-* (Debian: apt-get install --no-install-recommends linux-image-amd64)"
  [ -r "$kernel" ] || die "$kernel is not readable (run as root)"
  kver=${kernel##*/vmlinuz-}
  moddir=/lib/modules/$kver
  [ -d "$moddir/kernel" ] || die "$moddir/kernel not found: the modules of kernel $kver (package linux-image-$kver)"
  if [ -f "/boot/config-$kver" ] && ! grep -q '^CONFIG_X86_INTEL_MEMORY_PROTECTION_KEYS=y' "/boot/config-$kver"; then
    die "kernel $kver is built without CONFIG_X86_INTEL_MEMORY_PROTECTION_KEYS"
  fi
}

# Whether the ELF executable $1 has no PT_INTERP program header (no dynamic loader): it
# runs in the initramfs, which has no libc.
file_is_static() {
  local phoff phentsize phnum i type
  phoff=$(od -An -t u8 -j 32 -N 8 "$1" | tr -d ' ')
  phentsize=$(od -An -t u2 -j 54 -N 2 "$1" | tr -d ' ')
  phnum=$(od -An -t u2 -j 56 -N 2 "$1" | tr -d ' ')
  for ((i = 0; i < phnum; i++)); do
    type=$(od -An -t u4 -j $((phoff + i * phentsize)) -N 4 "$1" | tr -d ' ')
    [ "$type" -eq 3 ] && return 1
  done
  return 0
}

# The 9p client and the virtio transport, in load order (netfs before fscache).
MODULES=(virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci netfs fscache 9pnet 9pnet_virtio 9p)

build_initramfs() {
  local root=$1 out=$2 m f
  # $root/mods may hold the run's files already (exchange, writable).
  mkdir -p "$root"/{bin,dev,proc,sys,host,mods}
  cp /bin/busybox "$root/bin/busybox"
  for m in "${MODULES[@]}"; do
    f=$(find "$moddir/kernel" -name "$m.ko" -o -name "$m.ko.xz" -o -name "$m.ko.zst" | head -n 1)
    if [ -z "$f" ]; then
      grep -q "/$m.ko\$" "$moddir/modules.builtin" 2>/dev/null && continue
      die "kernel module $m not found under $moddir (nor built in)"
    fi
    case "$f" in
      *.xz) xz -dc "$f" >"$root/mods/$m.ko" || die "cannot decompress $f (xz-utils)" ;;
      *.zst) zstd -qdc "$f" >"$root/mods/$m.ko" || die "cannot decompress $f (zstd)" ;;
      *) cp "$f" "$root/mods/$m.ko" ;;
    esac
  done
  cat >"$root/init" <<'EOF'
#!/bin/busybox sh
# Guest side of scripts/mpk-vm.sh: mount the host's root (read-only) and the exchange
# share (writable), chroot, run /exchange/run.sh, record its status, power off.
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
# Loopback up: tests that serve HTTP on 127.0.0.1 (buffetd) run in the guest too.
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up
fail() { echo "mpk-vm guest: $*"; poweroff -f; }
for m in $(cat /mods/order); do
  [ -f /mods/$m.ko ] || continue
  insmod /mods/$m.ko || fail "insmod $m failed"
done
opts=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o $opts,ro,cache=loose host /host || fail "cannot mount the host's root over 9p"
xch=$(cat /mods/exchange)
mount -t proc proc /host/proc || fail "cannot mount /proc"
mount -t sysfs sys /host/sys || fail "cannot mount /sys"
mount -t devtmpfs dev /host/dev || fail "cannot mount /dev"
mkdir -p /host/dev/shm /host/dev/pts
mount -t tmpfs -o mode=1777 shm /host/dev/shm || fail "cannot mount /dev/shm"
mount -t devpts devpts /host/dev/pts || fail "cannot mount /dev/pts"
# The guest's /tmp is its own tmpfs; what the run needs from the host's /tmp (a checkout
# or a target directory there, listed in /mods/keep) is bound back into it.
mkdir -p /hosttmp
mount -o bind /host/tmp /hosttmp || fail "cannot keep the host's /tmp in view"
mount -t tmpfs -o mode=1777,size=75% tmp /host/tmp || fail "cannot mount /tmp"
for p in $(cat /mods/keep); do
  mkdir -p "/host$p" || fail "cannot make $p in the guest's /tmp"
  mount -o bind "/hosttmp${p#/tmp}" "/host$p" || fail "cannot show the host's $p in the guest"
done
for d in $(cat /mods/writable); do
  mount -t tmpfs -o mode=1777 writable "/host$d" || fail "cannot mount a tmpfs on $d"
done
mkdir -p "/host$xch"
mount -t 9p -o $opts exchange "/host$xch" || fail "cannot mount the exchange share"
stty -onlcr 2>/dev/null
chroot /host /bin/bash "$xch/run.sh"
sync
umount "/host$xch"
poweroff -f
EOF
  chmod +x "$root/init"
  printf '%s\n' "${MODULES[@]}" >"$root/mods/order"
  (cd "$root" && find . | /bin/busybox cpio -o -H newc >"$out" 2>/dev/null) ||
    die "cannot build the initramfs"
}

# --- the guest run ------------------------------------------------------------------------

# run_in_guest SCRIPT: runs the shell script text SCRIPT in the guest (cwd: this
# directory); its exit status becomes this function's.
run_in_guest() {
  local script=$1 xch rc var
  check_tools
  work=$(mktemp -d /tmp/mpk-vm.XXXXXX)
  # Nothing of the exchange share is needed after the run.
  trap 'rm -rf "$work"' EXIT
  xch=$work/exchange
  mkdir -p "$xch" "$work/initramfs/mods"
  echo "$xch" >"$work/initramfs/mods/exchange"
  printf '%s\n' ${MPK_VM_WRITABLE:+${MPK_VM_WRITABLE//:/ }} >"$work/initramfs/mods/writable"
  # The guest mounts its own /tmp: the working directory and the target directory, when
  # they live under the host's /tmp (a CI checkout there), are bound back into it.
  local keep=() p
  for p in "$PWD" "${CARGO_TARGET_DIR:-}"; do
    case "$p" in /tmp/?*) keep+=("$p") ;; esac
  done
  printf '%s\n' "${keep[@]}" >"$work/initramfs/mods/keep"
  build_initramfs "$work/initramfs" "$work/initramfs.cpio"
  {
    echo "set -u"
    echo "export MPK_VM_EXCHANGE=$(printf %q "$xch")"
    for var in PATH HOME CI CC RUST_BACKTRACE CARGO_TARGET_DIR $(compgen -e | grep '^BUFFET_' || true); do
      [ -n "${!var+x}" ] && printf 'export %s=%q\n' "$var" "${!var}"
    done
    echo "export BUFFET_REQUIRE_PKU=1 TMPDIR=/tmp"
    printf 'cd %q || exit 125\n' "$PWD"
    cat <<'EOF'
if ! grep -qw pku /proc/cpuinfo || ! grep -qw ospke /proc/cpuinfo; then
  echo "mpk-vm guest: the emulated CPU lists no pku/ospke in /proc/cpuinfo"
  echo 125 >"$MPK_VM_EXCHANGE/status"
  exit 0
fi
echo "mpk-vm guest: $(uname -r), $(grep -c ^processor /proc/cpuinfo) CPUs (TCG), pku and ospke in /proc/cpuinfo"
( bash "$MPK_VM_EXCHANGE/command.sh"; echo $? >"$MPK_VM_EXCHANGE/pipestatus" ) 2>&1 | tee "$MPK_VM_EXCHANGE/output"
echo "$(cat "$MPK_VM_EXCHANGE/pipestatus" 2>/dev/null || echo 125)" >"$MPK_VM_EXCHANGE/status"
EOF
  } >"$xch/run.sh"
  printf '%s\n' "$script" >"$xch/command.sh"

  echo "mpk-vm: booting $kernel under QEMU TCG (-cpu max, emulated pku), ${memory} MiB, time limit ${timeout_s} s"
  local started=$SECONDS
  set +e
  timeout -k 10 "$timeout_s" qemu-system-x86_64 \
    -accel tcg,thread=multi -cpu max -smp 2 -m "$memory" \
    -display none -vga none -monitor none -serial stdio -nic none -no-reboot \
    -kernel "$kernel" -initrd "$work/initramfs.cpio" \
    -append "console=ttyS0 quiet loglevel=3 panic=-1" \
    -virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap \
    -virtfs local,path="$xch",mount_tag=exchange,security_model=none \
    </dev/null
  rc=$?
  set -e
  echo "mpk-vm: guest ran $((SECONDS - started)) s"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "mpk-vm: error: the guest was still running after ${timeout_s} s (MPK_VM_TIMEOUT) and was killed" >&2
    return 124
  fi
  if [ "$rc" -ne 0 ]; then
    echo "mpk-vm: error: qemu-system-x86_64 exited with status $rc" >&2
    return 2
  fi
  if [ ! -s "$xch/status" ]; then
    echo "mpk-vm: error: the guest powered off without an exit status (a kernel panic or a failed mount: see its console above)" >&2
    return 2
  fi
  return "$(cat "$xch/status")"
}

# --- the MPK test groups ------------------------------------------------------------------

# Test binaries: cargo's JSON messages -> "<target name> <executable>" lines.
executables() {
  /usr/bin/env python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m.get("profile", {}).get("test"):
        print(m["target"]["name"], m["executable"])
'
}

# The seven groups .ci/run names: package | cargo target selection | target name | filter |
# environment. The filter keeps a binary that holds other tests to its MPK ones, and
# docs_blocks runs only the doc blocks marked `needs pku`: the rest run on the host in
# `cargo test --workspace`, and under TCG the demo's block alone outlasts the block time
# limit.
TEST_GROUPS=(
  "buffet-memory|--lib|buffet_memory|mpk::"
  "buffet-config|--lib|buffet_config|guard_tests::under_mpk"
  "buffet-worker|--test mpk|mpk|"
  "buffet-cnf|--test containment|containment|"
  "buffet|--test replay_cnf|replay_cnf|"
  "buffet|--test chains|chains|mpk"
  "buffet|--test docs_blocks|docs_blocks|every_shell_block|BUFFET_DOC_BLOCKS=needs-pku"
)

run_tests() {
  command -v cargo >/dev/null 2>&1 || die "cargo not found (the test binaries are built on this host)"
  command -v python3 >/dev/null 2>&1 || die "python3 not found (it reads cargo's JSON messages)"
  local target_dir=${CARGO_TARGET_DIR:-$repo/target} g pkg sel name filter env exe dir script=""
  case "$target_dir" in /*) ;; *) target_dir=$PWD/$target_dir ;; esac
  export CARGO_TARGET_DIR=$target_dir
  cd "$repo"
  for g in "${TEST_GROUPS[@]}"; do
    IFS='|' read -r pkg sel name filter env <<<"$g"
    echo "mpk-vm: building $pkg $sel (cargo test --no-run)"
    # shellcheck disable=SC2086
    exe=$(cargo test --locked -p "$pkg" $sel --no-run --message-format=json | executables |
      awk -v n="$name" '$1 == n { print $2 }' | tail -n 1)
    [ -n "$exe" ] || die "cargo built no test binary $name for $pkg $sel"
    dir=$(cargo metadata --format-version 1 --no-deps --locked | python3 -c '
import json, sys
pkgs = json.load(sys.stdin)["packages"]
print(next(p["manifest_path"] for p in pkgs if p["name"] == sys.argv[1]).rsplit("/", 1)[0])' "$pkg")
    # cargo runs a test binary in its package's directory; so does the guest.
    script+="echo; echo \"== MPK group: $pkg $sel${filter:+ (filter $filter)}${env:+ ($env)}\"
cd '$dir' && $env '$exe' ${filter:+'$filter'} --test-threads=2
s=\$?; [ \$s -eq 0 ] || failed=\"\$failed
  $pkg $sel: exit \$s\"
"
  done
  # Under TCG the guest's CPU runs many times slower than the host's: on one host the
  # portblock example's buffet_state_init ran past the watchdog's default 10 ms of CPU
  # time, so the groups run with a larger budget (docs/isolation.md, "Watchdog").
  script="failed=''
export BUFFET_CNF_WATCHDOG_MS=${BUFFET_CNF_WATCHDOG_MS:-250}
$script
if [ -n \"\$failed\" ]; then echo; echo \"MPK groups FAILED under emulated pku:\$failed\"; exit 1; fi
echo; echo 'every MPK group passed under emulated pku (QEMU TCG)'"
  MPK_VM_WRITABLE="${MPK_VM_WRITABLE:+$MPK_VM_WRITABLE:}$target_dir/tmp"
  mkdir -p "$target_dir/tmp"
  run_in_guest "$script"
}

case "${1:-}" in
  tests)
    [ $# -eq 1 ] || usage
    run_tests
    ;;
  run)
    shift
    [ "${1:-}" = "--" ] && shift
    [ $# -ge 1 ] || usage
    cmd=$(printf '%q ' "$@")
    run_in_guest "$cmd"
    ;;
  *) usage ;;
esac
