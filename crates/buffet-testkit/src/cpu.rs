//! How much CPU a process has used, for the tests that check an idle process sleeps.

/// The CPU time process `pid` has used, in seconds: utime + stime of /proc/PID/stat
/// (`std::process::id()` for this process). Panics where /proc cannot be read.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces): state is field 3, utime 14,
    // stime 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    let hz = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .unwrap()
        .stdout;
    let hz: f64 = String::from_utf8(hz).unwrap().trim().parse().unwrap();
    ticks as f64 / hz
}

/// The cores process `pid` used, on average, over the next `span` (this call sleeps
/// through it): CPU time over wall time.
pub fn cores_used_over(pid: u32, span: std::time::Duration) -> f64 {
    let (c0, t0) = (cpu_seconds(pid), std::time::Instant::now());
    std::thread::sleep(span);
    (cpu_seconds(pid) - c0) / t0.elapsed().as_secs_f64()
}
