//! End to end: what `buffet replay` does with inputs and arguments that used to go
//! wrong — snaplen-truncated captures, an output naming an input, unwritable outputs,
//! absurd worker counts — and that every error prints each cause once, briefly.

#[path = "build.rs"]
mod build;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use etherparse::PacketBuilder;

fn buffet() -> Command {
    Command::new(env!("CARGO_BIN_EXE_buffet"))
}

fn udp(dst: [u8; 4], payload_len: usize) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([192, 168, 1, 10], dst, 64)
        .udp(40000, 53)
        .write(&mut v, &vec![0x5a; payload_len])
        .unwrap();
    v
}

/// A little-endian microsecond pcap: snap length `snaplen`, records `(frame, orig_len)`.
fn pcap(snaplen: u32, records: &[(Vec<u8>, u32)]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    v.extend_from_slice(&2u16.to_le_bytes());
    v.extend_from_slice(&4u16.to_le_bytes());
    v.extend_from_slice(&[0; 8]);
    v.extend_from_slice(&snaplen.to_le_bytes());
    v.extend_from_slice(&1u32.to_le_bytes());
    for (i, (frame, orig)) in records.iter().enumerate() {
        v.extend_from_slice(&1u32.to_le_bytes());
        v.extend_from_slice(&(i as u32 * 1000).to_le_bytes());
        v.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        v.extend_from_slice(&orig.to_le_bytes());
        v.extend_from_slice(frame);
    }
    v
}

/// A directory with `tenants.toml` (tenant 7: 10.7.0.0/16) and `in.pcap` (`n` whole
/// UDP frames to tenant 7).
fn setup(n: usize) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(
        &tenants,
        "[[tenant]]\nid = 7\nname = \"acme\"\nrules = [ { dst_ip = \"10.7.0.0/16\" } ]\n",
    )
    .unwrap();
    let input = dir.path().join("in.pcap");
    let frames: Vec<_> = (0..n)
        .map(|i| {
            let f = udp([10, 7, 0, i as u8], 100);
            let len = f.len() as u32;
            (f, len)
        })
        .collect();
    std::fs::write(&input, pcap(65535, &frames)).unwrap();
    (dir, tenants, input)
}

fn replay(tenants: &Path, input: &Path, extra: &[&str]) -> Output {
    buffet()
        .args(["replay", "--nf", "monitor", "--no-pin", "--tenants"])
        .arg(tenants)
        .arg("--input")
        .arg(input)
        .args(extra)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The one `error: ` line of a failed run.
fn error_line(o: &Output) -> String {
    assert!(!o.status.success(), "the run should have failed");
    let err = stderr(o);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    lines[0].to_owned()
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn snaplen_truncated_captures_are_replayed_and_counted() {
    let (dir, tenants, _) = setup(0);
    // Snap length 60: five frames cut to 60 bytes (as `editcap -s 60` writes them), and
    // one that fits whole.
    let mut records: Vec<_> = (0..5)
        .map(|i| {
            let f = udp([10, 7, 0, i], 200);
            let orig = f.len() as u32;
            (f[..60].to_vec(), orig)
        })
        .collect();
    let small = udp([10, 7, 1, 1], 10);
    let small_len = small.len() as u32;
    records.push((small, small_len));
    let input = dir.path().join("snap60.pcap");
    std::fs::write(&input, pcap(60, &records)).unwrap();
    let stats = dir.path().join("stats.json");
    let out = replay(&tenants, &input, &["--stats-json", stats.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let j = json(&stats);
    assert_eq!(j["input"]["truncated"], 5, "{}", j["input"]);
    assert_eq!(j["input"]["packets"], 6);
    assert_eq!(j["global"]["input_packets"], 6);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("5 of 6 records truncated"), "{stdout}");

    // A record longer than the snap length is still refused, naming the record.
    records[3].0 = udp([10, 7, 0, 3], 200);
    let bad = dir.path().join("bad.pcap");
    std::fs::write(&bad, pcap(60, &records)).unwrap();
    let line = error_line(&replay(&tenants, &bad, &[]));
    assert!(
        line.contains("bad.pcap") && line.contains("record 3") && line.contains("snap length 60"),
        "{line}"
    );

    // The same with a capture cut by editcap, when it is installed.
    let whole = dir.path().join("whole.pcap");
    let frames: Vec<_> = (0..4)
        .map(|i| {
            let f = udp([10, 7, 0, i], 300);
            let len = f.len() as u32;
            (f, len)
        })
        .collect();
    std::fs::write(&whole, pcap(65535, &frames)).unwrap();
    let cut = dir.path().join("cut.pcap");
    match Command::new("editcap")
        .args(["-F", "pcap", "-s", "40"])
        .arg(&whole)
        .arg(&cut)
        .output()
    {
        Ok(o) if o.status.success() => {
            let out = replay(&tenants, &cut, &["--stats-json", stats.to_str().unwrap()]);
            assert!(out.status.success(), "{}", stderr(&out));
            assert_eq!(json(&stats)["input"]["truncated"], 4);
        }
        _ => eprintln!("SKIP editcap part of snaplen_truncated_captures: editcap is not installed"),
    }
}

#[test]
fn an_output_naming_an_input_is_refused_and_the_input_kept() {
    let (dir, tenants, input) = setup(10);
    let before = std::fs::read(&input).unwrap();
    let link = dir.path().join("link.pcap");
    std::os::unix::fs::symlink(&input, &link).unwrap();
    let dotted = dir.path().join(".").join("in.pcap");
    for out in [&input, &link, &dotted] {
        let o = replay(&tenants, &input, &["--output", out.to_str().unwrap()]);
        let line = error_line(&o);
        assert!(
            line.contains("is the same file as --input"),
            "{}: {line}",
            out.display()
        );
        assert!(o.stdout.is_empty(), "nothing ran");
        assert_eq!(std::fs::read(&input).unwrap(), before, "{}", out.display());
    }
    // The stats file may not be the tenants file either.
    let o = replay(
        &tenants,
        &input,
        &["--stats-json", tenants.to_str().unwrap()],
    );
    assert!(error_line(&o).contains("--tenants"));
    assert!(std::fs::read_to_string(&tenants).unwrap().contains("acme"));
    // Nothing but the inputs and the link is left in the directory.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3);
}

#[test]
fn outputs_are_checked_before_the_run_and_replaced_only_on_success() {
    let (dir, tenants, input) = setup(10);
    // A directory that does not exist: refused before anything runs.
    let o = replay(
        &tenants,
        &input,
        &["--stats-json", "/nonexistent-dir/stats.json"],
    );
    let line = error_line(&o);
    assert!(line.contains("/nonexistent-dir/stats.json"), "{line}");
    assert!(
        o.stdout.is_empty(),
        "refused after the run: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    let o = replay(&tenants, &input, &["--output", "/nonexistent-dir/out.pcap"]);
    assert!(error_line(&o).contains("/nonexistent-dir/out.pcap"));
    assert!(o.stdout.is_empty());

    // /dev/full: the error names the file.
    let o = replay(&tenants, &input, &["--stats-json", "/dev/full"]);
    let line = error_line(&o);
    assert!(
        line.contains("/dev/full") && line.contains("os error 28"),
        "{line}"
    );

    // A run that fails leaves an existing output as it was, and no temporary file.
    let out = dir.path().join("out.pcap");
    std::fs::write(&out, b"previous").unwrap();
    std::fs::write(
        dir.path().join("bad.toml"),
        "[[tenant]]\nid = 7\nrules = []\nbogus = 1\n",
    )
    .unwrap();
    let o = replay(
        &dir.path().join("bad.toml"),
        &input,
        &["--output", out.to_str().unwrap()],
    );
    assert!(!o.status.success());
    assert_eq!(std::fs::read(&out).unwrap(), b"previous");
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 4, "{names:?}");

    // A run that succeeds replaces it.
    let o = replay(&tenants, &input, &["--output", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        std::fs::read(&out).unwrap().len(),
        std::fs::read(&input).unwrap().len()
    );
}

#[test]
fn worker_counts_are_bounded() {
    let (_dir, tenants, input) = setup(1);
    let start = std::time::Instant::now();
    let line = error_line(&replay(&tenants, &input, &["--workers", "65535"]));
    assert!(line.contains("256"), "{line}");
    let line = error_line(&replay(
        &tenants,
        &input,
        &["--workers", "65535", "--allow-oversubscribe"],
    ));
    assert!(line.contains("256"), "{line}");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores < 255 {
        let too_many = (cores.max(2) + 1).to_string();
        let line = error_line(&replay(&tenants, &input, &["--workers", &too_many]));
        assert!(
            line.contains(&format!("{cores} cores")) && line.contains("--allow-oversubscribe"),
            "{line}"
        );
        let o = replay(
            &tenants,
            &input,
            &["--workers", &too_many, "--allow-oversubscribe"],
        );
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let line = error_line(
        &buffet()
            .args(["demo", "--workers", "65535"])
            .output()
            .unwrap(),
    );
    assert!(line.contains("256"), "{line}");
    assert!(start.elapsed().as_secs() < 60);
}

/// `line` holds `needle` exactly once.
fn once(line: &str, needle: &str) {
    assert_eq!(line.matches(needle).count(), 1, "{needle:?} in {line}");
}

#[test]
fn errors_print_each_cause_once_and_briefly() {
    let (dir, tenants, input) = setup(3);
    // A missing input, a missing tenants file.
    let line = error_line(&replay(&tenants, &dir.path().join("missing.pcap"), &[]));
    once(&line, "(os error 2)");
    assert!(line.contains("missing.pcap"), "{line}");
    let line = error_line(&replay(&dir.path().join("missing.toml"), &input, &[]));
    once(&line, "(os error 2)");
    // A policy the NF rejects.
    let bad = dir.path().join("policy.toml");
    std::fs::write(
        &bad,
        "[[tenant]]\nid = 7\nrules = [ { dst_ip = \"10.7.0.0/16\" } ]\n[tenant.policy]\nflow_capacity = 0\n",
    )
    .unwrap();
    let line = error_line(&replay(&bad, &input, &[]));
    once(&line, "must be at least 1");
    // A corrupt record.
    let mut bytes = std::fs::read(&input).unwrap();
    bytes[24 + 8..24 + 12].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
    let corrupt = dir.path().join("corrupt.pcap");
    std::fs::write(&corrupt, &bytes).unwrap();
    let line = error_line(&replay(&tenants, &corrupt, &[]));
    once(&line, "record 0");
    once(&line, "corrupt.pcap");
    assert!(!line.contains("port "), "{line}");
    // A file cut in the middle of a record: named once, with the record.
    let bytes = std::fs::read(&input).unwrap();
    let cut = dir.path().join("cut.pcap");
    std::fs::write(&cut, &bytes[..bytes.len() - 10]).unwrap();
    let line = error_line(&replay(&tenants, &cut, &[]));
    once(&line, "cut.pcap");
    assert!(line.contains("record") && !line.contains("port "), "{line}");
    // Huge values are cut.
    let huge = dir.path().join("huge.toml");
    std::fs::write(
        &huge,
        format!(
            "[[tenant]]\nid = 7\nname = \"{}\"\nrules = [ {{ dst_ip = \"{}\" }} ]\n",
            "n".repeat(1 << 20),
            "x".repeat(1 << 20)
        ),
    )
    .unwrap();
    let o = replay(&huge, &input, &[]);
    let line = error_line(&o);
    assert!(
        stderr(&o).len() < 1000,
        "{} bytes: {line:.300}",
        stderr(&o).len()
    );
    assert!(line.contains("(1048576 bytes)"), "{line}");
    // A header-only pcap says so.
    let empty = dir.path().join("empty.pcap");
    std::fs::write(&empty, pcap(65535, &[])).unwrap();
    let line = error_line(&replay(&tenants, &empty, &[]));
    assert!(
        line.contains("empty.pcap") && line.contains("no packets"),
        "{line}"
    );
    // The verifier's message, once.
    let Some(obj) = build::object("errors_print_each_cause_once", "reject_loop") else {
        return;
    };
    let o = buffet()
        .args(["replay", "--no-pin", "--nf-ebpf"])
        .arg(&obj)
        .arg("--tenants")
        .arg(&tenants)
        .arg("--input")
        .arg(&input)
        .output()
        .unwrap();
    let line = error_line(&o);
    once(&line, "Loop counter is too large");
    once(&line, "rejected by the verifier");
}

/// `buffet run --duration` beyond what a `Duration` holds (1e300 s) is a one-line error
/// naming the flag, not a panic; so are zero, negative and non-finite values. Checked
/// before any port is opened, so no privilege is needed to see it.
#[test]
fn run_duration_out_of_range_is_an_error_naming_the_flag() {
    let (_dir, tenants, _) = setup(0);
    for (d, says) in [
        (
            "1e300",
            "--duration must be at most 18446744073709551615 seconds, not 1e300",
        ),
        (
            "0",
            "--duration must be a positive number of seconds, not 0",
        ),
        (
            "-3",
            "--duration must be a positive number of seconds, not -3",
        ),
        (
            "inf",
            "--duration must be a positive number of seconds, not inf",
        ),
        (
            "NaN",
            "--duration must be a positive number of seconds, not NaN",
        ),
    ] {
        let o = buffet()
            .args([
                "run",
                "--iface",
                "buffet-nope0",
                "--nf",
                "monitor",
                "--tenants",
            ])
            .arg(&tenants)
            .arg(format!("--duration={d}"))
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "--duration {d}: {e}");
        assert!(e.contains(says), "--duration {d}: {e}");
        assert!(!e.contains("panicked"), "--duration {d}: {e}");
        assert_eq!(
            e.trim_end().lines().count(),
            1,
            "--duration {d}: one line\n{e}"
        );
    }
}
