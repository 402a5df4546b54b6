//! Gates for tests that need something this machine may not have.
//!
//! Every gate returns `true` when the test can run. Otherwise it writes one line to the
//! process's stderr and returns `false` (the test then returns early and passes), or it
//! panics, when the environment says that this skip is a failure:
//!
//! | need                                   | skip line                            | a failure when                          |
//! |----------------------------------------|--------------------------------------|-----------------------------------------|
//! | privilege: root, a capability, a tool  | `SKIP (privilege): <test>: <why>`    | `BUFFET_REQUIRE_PRIVILEGED=1` or `CI=true` |
//! | hardware: a CPU with `pku` (Intel MPK) | `SKIP (hardware: no pku): <test>`    | `BUFFET_REQUIRE_PKU=1`                  |
//!
//! The skip line goes straight to file descriptor 2, past libtest's output capture, so it
//! shows in `cargo test` output for passing tests too; CI counts these lines. A hardware
//! skip is never a failure by default: CI runs as root, which provides privileges, but
//! nothing provides a CPU feature, so CI asks for MPK (`BUFFET_REQUIRE_PKU=1`) only on a
//! machine whose /proc/cpuinfo lists `pku`.
//!
//! What this does not do: decide which tests need what (each test calls its gate), or
//! probe anything but /proc (root, capabilities, CPU flags) and the tool it is given.

use std::fmt::Display;
use std::io::Write;
use std::process::Command;

/// Set to `1` to make privilege skips failures (CI runs as root).
pub const REQUIRE_PRIVILEGED_ENV: &str = "BUFFET_REQUIRE_PRIVILEGED";

/// Set to `1` to make hardware (no `pku`) skips failures.
pub const REQUIRE_PKU_ENV: &str = "BUFFET_REQUIRE_PKU";

/// Whether a privilege skip must fail: `BUFFET_REQUIRE_PRIVILEGED=1`, or `CI` is `true`/`1`.
pub fn privileged_required() -> bool {
    let ci = std::env::var("CI").unwrap_or_default();
    ci.eq_ignore_ascii_case("true") || ci == "1" || env_is_one(REQUIRE_PRIVILEGED_ENV)
}

/// Whether a hardware skip (no `pku`) must fail: `BUFFET_REQUIRE_PKU=1`.
pub fn pku_required() -> bool {
    env_is_one(REQUIRE_PKU_ENV)
}

fn env_is_one(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1")
}

/// Writes `line` to fd 2 as one line (inner line breaks become `; `) in one write,
/// bypassing libtest's capture of `eprintln!`.
fn say(line: &str) {
    let mut buf = line
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    buf.push('\n');
    let _ = std::io::stderr().lock().write_all(buf.as_bytes());
}

/// A privilege skip of `test` because of `why`: prints the skip line and returns `false`,
/// or panics when [`privileged_required`].
pub fn skip_privileged(test: &str, why: impl Display) -> bool {
    if privileged_required() {
        panic!("{test}: {REQUIRE_PRIVILEGED_ENV}=1 (or CI) but {why}");
    }
    say(&format!("SKIP (privilege): {test}: {why}"));
    false
}

/// What `started` holds, or, when it failed because a tool is not installed
/// (`missing`), a privilege skip of `test` ([`skip_privileged`]) and `None`. Any other
/// failure panics: the tool is there and did not work.
pub fn started_or_skip<T, E: Display>(
    test: &str,
    started: Result<T, E>,
    missing: impl FnOnce(&E) -> bool,
) -> Option<T> {
    match started {
        Ok(t) => Some(t),
        Err(e) if missing(&e) => {
            skip_privileged(test, e);
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

/// A hardware skip of `test` (this CPU has no `pku`): prints the skip line and returns
/// `false`, or panics when [`pku_required`].
fn skip_no_pku(test: &str) -> bool {
    if pku_required() {
        panic!(
            "{test}: {REQUIRE_PKU_ENV}=1 but this CPU or kernel has no protection keys \
             (no `pku`/`ospke` in /proc/cpuinfo)"
        );
    }
    say(&format!("SKIP (hardware: no pku): {test}"));
    false
}

/// A field of /proc/self/status (`Uid:`, `CapEff:`), without its name.
fn status_field(name: &str) -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .map(|v| v.trim().to_owned())
}

/// This process's effective user id, from /proc/self/status.
pub fn effective_uid() -> Option<u32> {
    status_field("Uid:")?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    effective_uid() == Some(0)
}

/// Linux capabilities the privileged tests need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capability {
    /// `CAP_NET_ADMIN` (veth pairs, XDP attach).
    NetAdmin,
    /// `CAP_SYS_ADMIN`.
    SysAdmin,
    /// `CAP_BPF` (loading BPF programs and maps).
    Bpf,
}

impl Capability {
    fn bit(self) -> u32 {
        match self {
            Capability::NetAdmin => 12,
            Capability::SysAdmin => 21,
            Capability::Bpf => 39,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Capability::NetAdmin => "CAP_NET_ADMIN",
            Capability::SysAdmin => "CAP_SYS_ADMIN",
            Capability::Bpf => "CAP_BPF",
        }
    }
}

/// Whether this process has `cap` in its effective set (/proc/self/status `CapEff`).
pub fn has_capability(cap: Capability) -> bool {
    status_field("CapEff:")
        .and_then(|hex| u64::from_str_radix(&hex, 16).ok())
        .is_some_and(|eff| eff & (1 << cap.bit()) != 0)
}

/// Privilege gate: `true` when this process runs as root.
pub fn require_root(test: &str) -> bool {
    is_root() || skip_privileged(test, "not root")
}

/// Privilege gate: `true` when this process has every capability in `caps`.
pub fn require_capabilities(test: &str, caps: &[Capability]) -> bool {
    match caps.iter().find(|&&c| !has_capability(c)) {
        None => true,
        Some(c) => skip_privileged(test, format_args!("no {}", c.name())),
    }
}

/// Privilege gate: `true` when `probe` (e.g. `clang --version`) runs and succeeds; `what`
/// names the tool, `hint` says how to get it.
pub fn require_tool(test: &str, what: &str, probe: &mut Command, hint: &str) -> bool {
    let why = match probe.output() {
        Ok(o) if o.status.success() => return true,
        // The last line of a tool's complaint says what is missing (a traceback ends with
        // the exception).
        Ok(o) => format!(
            "{} ({})",
            o.status,
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .rfind(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim()
        ),
        Err(e) => e.to_string(),
    };
    skip_privileged(test, format_args!("{what} unusable: {why}; {hint}"))
}

/// Whether /proc/cpuinfo lists both `pku` (the CPU has protection keys) and `ospke` (the
/// kernel enabled them) — the same test CI uses to decide on `BUFFET_REQUIRE_PKU`.
pub fn cpu_has_pku() -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return false;
    };
    info.lines()
        .find(|l| l.starts_with("flags"))
        .is_some_and(|l| {
            let mut flags = l.split_whitespace();
            let (mut pku, mut ospke) = (false, false);
            for f in &mut flags {
                pku |= f == "pku";
                ospke |= f == "ospke";
            }
            pku && ospke
        })
}

/// Hardware gate: `true` when this CPU has `pku`. Without it: the hardware skip line, or a
/// panic under `BUFFET_REQUIRE_PKU=1`.
pub fn require_pku(test: &str) -> bool {
    cpu_has_pku() || skip_no_pku(test)
}

/// Gate of an MPK test: the hardware gate first ([`require_pku`]), then `probe` (the MPK
/// set-up, e.g. `Mpk::get`). A CPU without `pku` is a hardware skip; any other set-up
/// error on a CPU that has it (no free keys, `BUFFET_MPK=off`, a kernel refusing) is a
/// privilege skip, so a failure under `BUFFET_REQUIRE_PRIVILEGED=1`.
pub fn require_mpk<T, E: Display>(test: &str, probe: impl FnOnce() -> Result<T, E>) -> Option<T> {
    if !require_pku(test) {
        return None;
    }
    match probe() {
        Ok(t) => Some(t),
        Err(e) => {
            skip_privileged(
                test,
                format_args!("MPK set-up failed on a CPU with pku: {e}"),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_status_parses() {
        assert!(effective_uid().is_some());
        // The answer depends on the machine; asking must not panic.
        let _ = has_capability(Capability::NetAdmin);
        let _ = cpu_has_pku();
    }
}
