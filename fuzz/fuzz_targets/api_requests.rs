//! Fuzz target: buffetd's HTTP API, in process. One daemon (firewall NF, a generator port
//! with a few tenants' traffic, a temporary data directory) serves every input; an input
//! is up to eight requests, each a method, a route from the API's table with a fuzzed
//! tenant or worker id, an Authorization header (none, the admin token, a wrong token,
//! or fuzzed bytes) and a fuzzed body. The requests go through the router the daemon
//! serves (`Daemon::router`), with its body limit, auth and validation.
//!
//! Every request must be answered without a panic and without a server error (5xx other
//! than 503, which the Agent answers while it refuses new tenants), and the daemon must
//! still answer `/healthz` afterwards. Bad requests get a 4xx; good ones change the
//! daemon's state, which later inputs then build on.
#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use axum::body::Body;
use axum::http::{Method, Request};
use buffet_daemon::{Daemon, DaemonConfig};
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

const ADMIN: &str = "admin-token-for-the-api-fuzz-target-01";

const ROUTES: &[&str] = &[
    "/v1/tenants",
    "/v1/tenants?dry_run=true",
    "/v1/tenants/{n}",
    "/v1/tenants/{n}/stats",
    "/v1/tenants/{n}/tokens",
    "/v1/tenants/{n}/release",
    "/v1/stats",
    "/v1/workers",
    "/v1/workers/{n}",
    "/v1/openapi.json",
    "/metrics",
    "/healthz",
    "/readyz",
    "/v1/nothing/{n}",
];

const METHODS: &[Method] = &[
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::PATCH,
];

struct Fixture {
    daemon: Daemon,
    rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let text = format!(
            "data_dir = \"{d}/data\"\n[api]\nlisten = \"127.0.0.1:0\"\nmax_body_bytes = 8192\n\
             [nf]\nname = \"firewall\"\n[dataplane]\nworkers = 1\nmax_workers = 2\n\
             tenant_slots = 32\narena_mib = 64\n\
             [[port]]\nkind = \"generator\"\ntenants = 4\nrate_pps = 2000\n",
            d = dir.path().display()
        );
        std::env::set_var("BUFFETD_ADMIN_TOKEN", ADMIN);
        let cfg = DaemonConfig::parse(Path::new("fuzz.toml"), &text).expect("the config");
        let daemon = Daemon::start(cfg, Path::new("fuzz.toml")).expect("buffetd starts");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        Fixture {
            daemon,
            rt,
            _dir: dir,
        }
    })
}

fn send(f: &Fixture, req: Request<Body>) -> u16 {
    let res = f
        .rt
        .block_on(f.daemon.router().oneshot(req))
        .expect("the router is infallible");
    res.status().as_u16()
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let mut rest = data;
    for _ in 0..8 {
        let [m, r, n, a, len_hi, len_lo, tail @ ..] = rest else {
            break;
        };
        let len = (usize::from(*len_hi) << 8 | usize::from(*len_lo)).min(tail.len());
        let (body, tail) = tail.split_at(len);
        rest = tail;
        let method = METHODS[usize::from(*m) % METHODS.len()].clone();
        let route = ROUTES[usize::from(*r) % ROUTES.len()];
        // Ids 0..=7 and a few far ones (absent tenants, ids past the Tenant Table).
        let id = match n % 12 {
            8 => u32::MAX,
            9 => 1 << 20,
            10 => 100,
            11 => 33,
            k => u32::from(k),
        };
        let uri = route.replace("{n}", &id.to_string());
        // GET on the event stream would never end; the table leaves it out.
        let mut req = Request::builder().method(method).uri(uri);
        match a % 4 {
            0 => {}
            1 => req = req.header("Authorization", format!("Bearer {ADMIN}")),
            2 => req = req.header("Authorization", "Bearer wrong-token-0123456789abcdef"),
            _ => {
                if let Ok(v) = axum::http::HeaderValue::from_bytes(&body[..body.len().min(48)]) {
                    req = req.header("Authorization", v);
                }
            }
        }
        let req = req
            .header("Content-Type", "application/json")
            .body(Body::from(body.to_vec()))
            .expect("a request");
        let status = send(f, req);
        assert!(
            status < 500 || status == 503,
            "server error {status} for {:?}",
            String::from_utf8_lossy(data)
        );
    }
    let health = Request::builder()
        .uri("/healthz")
        .body(Body::empty())
        .expect("a request");
    assert_eq!(send(f, health), 200, "the daemon stopped answering");
});
