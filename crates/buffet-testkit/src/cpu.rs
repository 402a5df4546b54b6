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
