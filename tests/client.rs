//! What the `buffet` client of buffetd says when a request goes wrong: the daemon's
//! message once (never its raw JSON), and what to do — a missing or unknown token, a
//! tenant token without `--tenant`, a tenants file given to `tenant add --file`, an update
//! that left out the fields it replaces; a bare `host:port` as `--api` is taken as http.

use std::path::Path;
use std::process::{Command, Output, Stdio};

mod common;
use common::daemon::{config_head, free_port, write_config, Daemon};

const ADMIN: &str = "client-test-admin-token-0123456789";

/// buffetd running the firewall over the generator, with the admin token [`ADMIN`].
fn start(dir: &Path) -> Daemon {
    let port = free_port();
    let cfg = write_config(
        dir,
        &format!(
            "{}[dataplane]\nworkers = 1\narena_mib = 64\ntenant_slots = 64\n\
             [[port]]\nkind = \"generator\"\ntenants = 4\nrate_pps = 1000\n",
            config_head(&dir.join("data"), port, "firewall")
        ),
    );
    Daemon::start(&cfg, port, ADMIN, Stdio::null())
}

/// `buffet ARGS` with `BUFFET_API` set to the daemon and `BUFFET_TOKEN` to `token`.
fn buffet(d: &Daemon, token: Option<&str>, args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_buffet"));
    c.args(args)
        .env("BUFFET_API", &d.api)
        .env_remove("BUFFET_TOKEN")
        .stdin(Stdio::null());
    if let Some(t) = token {
        c.env("BUFFET_TOKEN", t);
    }
    c.output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The one error line of a failed command.
fn error_line(out: &Output) -> String {
    assert!(!out.status.success(), "{}", stderr(out));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(out));
    let e = stderr(out);
    assert_eq!(e.lines().count(), 1, "{e}");
    e
}

#[test]
fn client_errors_say_what_is_wrong_once_and_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());

    // No token: events as every other command, the daemon's message without its JSON,
    // and where a token comes from.
    for args in [&["events"][..], &["stats"]] {
        let e = error_line(&buffet(&d, None, args));
        assert!(
            e.starts_with("error: buffetd: 401: missing or unknown bearer token"),
            "{args:?}: {e}"
        );
        assert!(!e.contains("{\""), "{args:?}: raw JSON: {e}");
        assert!(
            e.contains("set BUFFET_TOKEN or pass --token") && e.contains("<data_dir>/admin.token"),
            "{args:?}: {e}"
        );
    }
    let e = error_line(&buffet(&d, Some("not-a-token"), &["stats"]));
    assert!(e.contains("buffetd does not know the token given"), "{e}");

    // A bare host:port is http.
    let bare = format!("127.0.0.1:{}", d.port);
    let out = buffet(&d, Some(ADMIN), &["stats", "--api", &bare]);
    assert!(out.status.success(), "{}", stderr(&out));

    // A tenants file given as one tenant's document.
    let tenants = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tenants.toml");
    let e = error_line(&buffet(
        &d,
        Some(ADMIN),
        &["tenant", "add", "--file", tenants.to_str().unwrap()],
    ));
    assert!(
        e.contains("--file takes one tenant as JSON") && e.contains("buffet tenant apply FILE"),
        "{e}"
    );
    let json_file = dir.path().join("tenants.json");
    std::fs::write(
        &json_file,
        r#"{ "tenant": [ { "id": 1, "rules": [ { "dst_ip": "10.0.0.0/24" } ] } ] }"#,
    )
    .unwrap();
    let e = error_line(&buffet(
        &d,
        Some(ADMIN),
        &["tenant", "add", "--file", json_file.to_str().unwrap()],
    ));
    assert!(e.contains("buffet tenant apply FILE"), "{e}");

    // An update from flags replaces the whole document: the refusal says so.
    let out = buffet(
        &d,
        Some(ADMIN),
        &["tenant", "add", "--id", "2", "--rule", "dst_ip=10.0.1.0/24"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let e = error_line(&buffet(
        &d,
        Some(ADMIN),
        &["tenant", "update", "--id", "2", "--max-nb", "10"],
    ));
    assert!(e.starts_with("error: buffetd: 422: "), "{e}");
    assert!(
        e.contains("sends the tenant's whole new document") && e.contains("buffet tenant show 2"),
        "{e}"
    );

    // A tenant token reads its own tenant, and needs --tenant to say which.
    let out = buffet(&d, Some(ADMIN), &["tenant", "token", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let token = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let e = error_line(&buffet(&d, Some(&token), &["stats"]));
    assert!(
        e.starts_with("error: buffetd: 403: this token may not do that; ")
            && e.contains("pass --tenant ID"),
        "{e}"
    );
    let out = buffet(&d, Some(&token), &["stats", "--tenant", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn events_follow_is_accepted_and_not_offered() {
    let help = Command::new(env!("CARGO_BIN_EXE_buffet"))
        .args(["events", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    assert!(!help.contains("--follow"), "{help}");
    assert!(!help.contains("the only mode"), "{help}");
    // Still parsed: the failure is the unreachable daemon's, not a usage error.
    let out = Command::new(env!("CARGO_BIN_EXE_buffet"))
        .args(["events", "--follow", "--api", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).starts_with("error: cannot reach buffetd at http://127.0.0.1:1"),
        "{}",
        stderr(&out)
    );
}

/// A stored tenant kept not running after a restart (no Tenant Table slot left for it),
/// shown with `buffet tenant show` and passed back as shown to `buffet tenant update
/// --file` (its `state` and `reason` included), is admitted once a slot is free.
#[test]
fn a_not_restored_tenant_shown_and_sent_back_as_is_is_admitted_once_it_fits() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let start = |slots: u32| {
        let cfg = write_config(
            dir.path(),
            &format!(
                "{}[dataplane]\nworkers = 1\narena_mib = 64\ntenant_slots = {slots}\n\
                 [[port]]\nkind = \"generator\"\ntenants = 4\nrate_pps = 1000\n",
                config_head(&dir.path().join("data"), port, "firewall")
            ),
        );
        Daemon::start(&cfg, port, ADMIN, Stdio::null())
    };
    let ok = |d: &Daemon, args: &[&str]| {
        let out = buffet(d, Some(ADMIN), args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let d = start(64);
    for (id, prefix) in [("1", "dst_ip=10.0.0.0/24"), ("2", "dst_ip=10.0.1.0/24")] {
        ok(&d, &["tenant", "add", "--id", id, "--rule", prefix]);
    }
    drop(d);
    let d = start(1);
    let shown = ok(&d, &["tenant", "show", "2"]);
    assert!(shown.contains("\"not_restored\""), "{shown}");
    let file = dir.path().join("tenant2.json");
    std::fs::write(&file, &shown).unwrap();
    let file = file.to_str().unwrap();
    // Still no slot: refused for that, naming it.
    let e = error_line(&buffet(
        &d,
        Some(ADMIN),
        &["tenant", "update", "--file", file],
    ));
    assert!(e.starts_with("error: buffetd: 409: "), "{e}");
    assert!(e.contains("too many tenants"), "{e}");
    ok(&d, &["tenant", "rm", "1"]);
    let out = ok(&d, &["tenant", "update", "--file", file]);
    assert_eq!(out, "updated tenant 2\n");
    let shown = ok(&d, &["tenant", "show", "2"]);
    assert!(
        !shown.contains("state") && !shown.contains("reason"),
        "{shown}"
    );
}
