//! The documentation works when followed: every ```sh, ```bash, ```shell and ```console
//! block of README.md and docs/*.md runs, as written, from a copy of the repository, and
//! exits with status 0.
//!
//! How: each document gets a fresh copy of the repository (without `target/` and `.git/`)
//! in a temporary directory, and its blocks run there in order, each with
//! `bash -euo pipefail`, so that a block can use what an earlier one built (`make`, then
//! `buffet replay`). `buffet` is the binary under test (a directory holding it is first
//! on PATH), and `cargo run --release --` in a block is replaced by `buffet`, the same
//! program. In a ```console block only the lines starting with `$ ` are commands.
//!
//! A block that cannot run here says so in an HTML comment on the line before its fence
//! (blank lines between are allowed):
//!
//! * `<!-- doc-test: skip (reason) -->` — never run (a benchmark of minutes, the test
//!   suite itself, a command that needs root or a NIC); listed with its reason;
//! * `<!-- doc-test: needs pku -->` — runs only on a CPU with protection keys; elsewhere
//!   it is a hardware skip (`SKIP (hardware: no pku): …`, a failure only under
//!   `BUFFET_REQUIRE_PKU=1`, as for the MPK tests);
//! * `<!-- doc-test: needs TOOL -->` (e.g. `needs clang`) — runs when `TOOL --version`
//!   does; elsewhere a privilege skip (`SKIP (privilege): …`, a failure under
//!   `BUFFET_REQUIRE_PRIVILEGED=1` or in CI, as for the eBPF tests).
//!
//! `BUFFET_DOC_BLOCKS=needs-pku` runs only the blocks marked `needs pku` (every other
//! block is listed as skipped): scripts/mpk-vm.sh sets it to run them on an emulated CPU
//! with protection keys, where the rest — which `cargo test` runs on the host — would
//! take many times as long. Each such block then runs without the document's earlier
//! blocks, so a `needs pku` block builds what it uses itself.
//!
//! At the end it lists, on stderr (visible in `cargo test` output), every block it ran
//! and every block it skipped, with the reason.
//!
//! What this does not do: check a block's output (blocks show it in comments), or run
//! blocks of other languages (TOML, JSON and Rust listings are data or code, not commands).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one block may run.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(90);

/// Names which blocks run: unset (every block) or `needs-pku`.
const SELECT_ENV: &str = "BUFFET_DOC_BLOCKS";

/// Whether only the blocks marked `needs pku` run ([`SELECT_ENV`]); any other value than
/// `needs-pku` is refused.
fn only_pku_blocks() -> bool {
    match std::env::var(SELECT_ENV) {
        Err(std::env::VarError::NotPresent) => false,
        Ok(v) if v == "needs-pku" => true,
        Ok(v) => panic!("{SELECT_ENV}={v:?}: the only selection is `needs-pku`"),
        Err(e) => panic!("{SELECT_ENV}: {e}"),
    }
}

/// Languages whose blocks are commands.
const SHELL_LANGS: [&str; 4] = ["sh", "bash", "shell", "console"];

#[derive(Debug, Clone, PartialEq, Eq)]
enum Mark {
    Run,
    Skip(String),
    NeedsPku,
    NeedsTool(String),
}

#[derive(Debug)]
struct Block {
    /// `docs/cli.md:39`: the document and the line of the opening fence.
    at: String,
    script: String,
    mark: Mark,
}

/// The marker in `line`, if it is one.
fn marker(line: &str, at: &str) -> Option<Mark> {
    let inner = line
        .trim()
        .strip_prefix("<!--")?
        .strip_suffix("-->")?
        .trim()
        .strip_prefix("doc-test:")?
        .trim();
    if inner == "needs pku" {
        return Some(Mark::NeedsPku);
    }
    if let Some(tool) = inner.strip_prefix("needs ").map(str::trim) {
        if !tool.is_empty() && !tool.contains(char::is_whitespace) {
            return Some(Mark::NeedsTool(tool.to_owned()));
        }
    }
    let reason = inner
        .strip_prefix("skip")
        .map(str::trim)
        .and_then(|r| r.strip_prefix('('))
        .and_then(|r| r.strip_suffix(')'))
        .filter(|r| !r.trim().is_empty());
    match reason {
        Some(r) => Some(Mark::Skip(r.trim().to_owned())),
        None => {
            panic!(
                "{at}: unknown doc-test marker {line:?}: use `skip (reason)`, `needs pku` or \
                 `needs TOOL`"
            )
        }
    }
}

/// The shell blocks of one Markdown document.
fn blocks(doc: &str, text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(info) = lines[i].trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let lang = info.split_whitespace().next().unwrap_or("");
        let start = i;
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && !lines[i].trim_start().starts_with("```") {
            body.push(lines[i]);
            i += 1;
        }
        i += 1;
        if !SHELL_LANGS.contains(&lang) {
            continue;
        }
        let at = format!("{doc}:{}", start + 1);
        let mark = lines[..start]
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .and_then(|l| marker(l, &at))
            .unwrap_or(Mark::Run);
        let script = if lang == "console" {
            body.iter()
                .filter_map(|l| l.strip_prefix("$ "))
                .collect::<Vec<_>>()
                .join("\n")
        } else {
            body.join("\n")
        };
        out.push(Block {
            at,
            script: script.replace("cargo run --release --", "buffet"),
            mark,
        });
    }
    out
}

/// The documents: README.md and docs/*.md, in name order.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    docs.insert(0, root.join("README.md"));
    docs
}

/// Copies the repository at `from` into `to`, without build output, version control and
/// the fuzzers' local corpus and findings (`fuzz/corpus`, `fuzz/artifacts`: ignored by
/// git, and tens of megabytes after a fuzzing run).
fn copy_repo(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    let in_fuzz = from.file_name().is_some_and(|n| n == "fuzz");
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        if name == "target" || name == ".git" {
            continue;
        }
        if in_fuzz && (name == "corpus" || name == "artifacts" || name == "coverage") {
            continue;
        }
        let ty = e.file_type().unwrap();
        if ty.is_dir() {
            copy_repo(&e.path(), &to.join(&name));
        } else if ty.is_file() {
            std::fs::copy(e.path(), to.join(&name)).unwrap();
        }
    }
}

/// Runs `script` in `cwd`; `Err` with what it printed on failure or timeout.
fn run(script: &str, cwd: &Path, path_env: &str) -> Result<Duration, String> {
    let dir = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let started = Instant::now();
    let mut child = Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(cwd)
        .env("PATH", path_env)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("running bash");
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if started.elapsed() > BLOCK_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = || {
        format!(
            "--- stdout\n{}--- stderr\n{}",
            std::fs::read_to_string(&out_path).unwrap_or_default(),
            std::fs::read_to_string(&err_path).unwrap_or_default()
        )
    };
    match status {
        Some(s) if s.success() => Ok(started.elapsed()),
        Some(s) => Err(format!("exit status {s}\n{}", output())),
        None => Err(format!(
            "still running after {BLOCK_TIMEOUT:?}\n{}",
            output()
        )),
    }
}

#[test]
fn every_shell_block_of_the_docs_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_buffet"), bin.path().join("buffet")).unwrap();
    let path_env = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let (mut ran, mut skipped, mut failed) = (Vec::new(), Vec::new(), Vec::new());
    let only_pku = only_pku_blocks();
    for doc in documents(root) {
        let name = doc.strip_prefix(root).unwrap().display().to_string();
        let text = std::fs::read_to_string(&doc).unwrap();
        let blocks = blocks(&name, &text);
        if blocks.is_empty() {
            continue;
        }
        // Copied when its first block runs: a document whose blocks all skip needs none.
        let mut copy: Option<tempfile::TempDir> = None;
        for b in blocks {
            match &b.mark {
                Mark::Skip(reason) => {
                    skipped.push(format!("{}: {reason}", b.at));
                    continue;
                }
                mark if only_pku && *mark != Mark::NeedsPku => {
                    skipped.push(format!("{}: not selected ({SELECT_ENV}=needs-pku)", b.at));
                    continue;
                }
                Mark::NeedsPku if !buffet_testkit::require_pku(&format!("doc block {}", b.at)) => {
                    skipped.push(format!("{}: needs a CPU with pku", b.at));
                    continue;
                }
                Mark::NeedsTool(tool)
                    if !buffet_testkit::require_tool(
                        &format!("doc block {}", b.at),
                        tool,
                        Command::new(tool).arg("--version"),
                        "install it (.ci/run lists the packages)",
                    ) =>
                {
                    skipped.push(format!("{}: needs {tool}", b.at));
                    continue;
                }
                _ => {}
            }
            let copy = copy.get_or_insert_with(|| {
                let copy = tempfile::tempdir().unwrap();
                copy_repo(root, copy.path());
                copy
            });
            match run(&b.script, copy.path(), &path_env) {
                Ok(took) => ran.push(format!("{} ({:.1} s)", b.at, took.as_secs_f64())),
                Err(why) => failed.push(format!("{}:\n{}\n{why}", b.at, b.script)),
            }
        }
    }
    // Straight to the process's stderr, past libtest's output capture: the list shows in
    // `cargo test` output (and CI logs) when the test passes too.
    let mut summary = format!("doc blocks run ({}):\n", ran.len());
    for r in &ran {
        summary.push_str(&format!("  {r}\n"));
    }
    summary.push_str(&format!("doc blocks skipped ({}):\n", skipped.len()));
    for s in &skipped {
        summary.push_str(&format!("  {s}\n"));
    }
    let _ = std::io::stderr().write_all(summary.as_bytes());
    assert!(!ran.is_empty(), "no shell block ran");
    assert!(
        failed.is_empty(),
        "{} doc block(s) failed:\n\n{}",
        failed.len(),
        failed.join("\n\n")
    );
}

#[test]
fn markers_and_console_prompts_are_read_as_documented() {
    let doc =
        "intro\n\n<!-- doc-test: skip (a benchmark of minutes) -->\n```sh\ncargo bench\n```\n\
               <!-- doc-test: needs pku -->\n\n```bash\nbuffet x\n```\n\
               <!-- doc-test: needs clang -->\n```sh\nclang\n```\n\
               ```console\n$ cargo run --release -- demo\noutput line\n$ echo ok\n```\n\
               ```toml\n[[tenant]]\n```\n";
    let b = blocks("d.md", doc);
    assert_eq!(b.len(), 4, "{b:?}");
    assert_eq!(b[0].at, "d.md:4");
    assert_eq!(b[0].mark, Mark::Skip("a benchmark of minutes".into()));
    assert_eq!(b[1].mark, Mark::NeedsPku);
    assert_eq!(b[2].mark, Mark::NeedsTool("clang".into()));
    assert_eq!(b[3].mark, Mark::Run);
    assert_eq!(b[3].script, "buffet demo\necho ok");
}

#[test]
#[should_panic(expected = "unknown doc-test marker")]
fn a_skip_without_a_reason_is_refused() {
    blocks("d.md", "<!-- doc-test: skip -->\n```sh\ntrue\n```\n");
}
