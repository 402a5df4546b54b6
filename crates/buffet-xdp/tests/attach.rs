//! Attaching the XDP Packet Dispatcher to a veth: a program a dead Buffet run left on the
//! interface (attached through netlink, as `ip link set … xdpgeneric` does, by a process
//! that is gone) is replaced; the operator's own program and one a live dispatcher holds
//! are not; dropping the dispatcher detaches it. Needs root, `ip` and clang; skipped otherwise (a failure in CI).

use std::process::Command;

use buffet_dispatch::{Match, TenantSlot, WorkerId};
use buffet_testkit::gate;
use buffet_xdp::{AttachError, AttachMode, XdpConfig, XdpDispatcher};

fn ready(test: &str) -> bool {
    if let Some(why) = buffet_xdp::UNAVAILABLE {
        return gate::skip_privileged(test, format_args!("xdp engine unavailable: {why}"));
    }
    gate::require_root(test)
        && gate::require_tool(
            test,
            "ip (iproute2)",
            Command::new("ip").arg("-V"),
            "install iproute2",
        )
        && gate::require_tool(
            test,
            "clang",
            Command::new("clang").arg("--version"),
            "install clang",
        )
}

fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A veth pair, deleted on drop.
struct Veth(String);

impl Veth {
    fn new() -> Veth {
        let a = format!("bfx{}", std::process::id() % 100_000);
        let _ = Command::new("ip").args(["link", "del", &a]).output();
        ip(&[
            "link",
            "add",
            &a,
            "type",
            "veth",
            "peer",
            "name",
            &format!("{a}p"),
        ]);
        ip(&["link", "set", &a, "up"]);
        Veth(a)
    }

    fn xdp_attached(&self) -> bool {
        ip(&["-d", "link", "show", "dev", &self.0]).contains("prog/xdp")
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.0]).output();
    }
}

/// Compiles a one-instruction XDP program whose function (and so the program's name in
/// the kernel) is `name` into `dir`, and returns the object's path.
fn pass_program(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(
        &src,
        format!(
            "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\n\
             SEC(\"xdp\") int {name}(struct xdp_md *c) {{ return XDP_PASS; }}\n\
             char LICENSE[] SEC(\"license\") = \"GPL\";\n"
        ),
    )
    .unwrap();
    let obj = dir.join(format!("{name}.o"));
    let cc = Command::new("clang")
        .args([
            "-target",
            "bpf",
            "-O2",
            "-I",
            "/usr/include/x86_64-linux-gnu",
            "-c",
        ])
        .arg(&src)
        .arg("-o")
        .arg(&obj)
        .output()
        .unwrap();
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    obj
}

/// Attaches `obj` to `iface` through netlink, as a process that then exits (`ip`): what a
/// run killed before it could detach leaves behind.
fn attach_with_ip(iface: &str, obj: &std::path::Path) {
    ip(&[
        "link",
        "set",
        "dev",
        iface,
        "xdpgeneric",
        "obj",
        obj.to_str().unwrap(),
        "sec",
        "xdp",
    ]);
}

#[test]
fn leftover_is_replaced_live_one_is_not_and_drop_detaches() {
    let test = "leftover_is_replaced_live_one_is_not_and_drop_detaches";
    if !ready(test) {
        return;
    }
    let veth = Veth::new();
    let dir = tempfile::tempdir().unwrap();
    let shown = || ip(&["-d", "link", "show", "dev", &veth.0]);

    // The operator's own program is never taken away, and the refusal names it.
    attach_with_ip(&veth.0, &pass_program(dir.path(), "operator_prog"));
    let mut d = XdpDispatcher::load(XdpConfig::default()).unwrap();
    d.add_worker(100).unwrap();
    match d.attach(&veth.0, AttachMode::Generic) {
        Err(e @ AttachError::Busy { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("\"operator_prog\"") && msg.contains("not a leftover of a Buffet run"),
                "{msg}"
            );
            assert!(
                msg.contains(&format!("ip link set dev {} xdp off", veth.0)),
                "{msg}"
            );
        }
        r => panic!("{r:?}"),
    }
    assert!(!d.replaced_leftover());
    assert!(shown().contains("operator_prog"), "{}", shown());
    ip(&["link", "set", "dev", &veth.0, "xdpgeneric", "off"]);

    // A dispatcher program no live process holds (its run died): replaced.
    attach_with_ip(&veth.0, &pass_program(dir.path(), "buffet_dispatch"));
    d.attach(&veth.0, AttachMode::Generic).unwrap();
    assert!(d.replaced_leftover());
    assert_eq!(d.attached_to(), Some(veth.0.as_str()));
    d.detach().unwrap();
    assert!(!veth.xdp_attached(), "{}", shown());

    // The AF_XDP port's redirect program of a run whose pid no longer exists (pid_max is
    // at most 2^22): replaced.
    attach_with_ip(&veth.0, &pass_program(dir.path(), "bfxsk_7ffffff0"));
    let mut d = XdpDispatcher::load(XdpConfig::default()).unwrap();
    d.add_worker(100).unwrap();
    d.attach(&veth.0, AttachMode::Generic).unwrap();
    assert!(d.replaced_leftover());
    let now = shown();
    assert!(
        now.contains("buffet_dispatch") && !now.contains("bfxsk_7ffffff0"),
        "{now}"
    );

    // A second dispatcher must not take the hook from a live one (this process holds it).
    let mut other = XdpDispatcher::load(XdpConfig::default()).unwrap();
    match other.attach(&veth.0, AttachMode::Generic) {
        Err(e @ AttachError::Busy { .. }) => {
            let msg = e.to_string();
            assert!(msg.starts_with(&format!("{} already has", veth.0)), "{msg}");
            assert!(
                msg.contains(&format!(
                    "by this process (pid {}); this process attached it already",
                    std::process::id()
                )),
                "{msg}"
            );
        }
        r => panic!("{r:?}"),
    }
    assert!(!other.replaced_leftover());
    assert!(ip(&["-d", "link", "show", "dev", &veth.0]).contains("buffet_dispatch"));
    drop(other);

    // Dropping the dispatcher detaches it.
    drop(d);
    assert!(
        !veth.xdp_attached(),
        "{}",
        ip(&["-d", "link", "show", "dev", &veth.0])
    );

    // An interface that does not exist.
    let mut d = XdpDispatcher::load(XdpConfig::default()).unwrap();
    match d.attach("bfx-none0", AttachMode::Generic) {
        Err(e @ AttachError::NoSuchInterface(_)) => {
            assert!(e.to_string().contains("bfx-none0"), "{e}")
        }
        r => panic!("{r:?}"),
    }
}

/// A network namespace with one end of a veth pair, the other end here; deleted on drop.
struct NsVeth {
    ns: String,
    here: String,
}

impl NsVeth {
    fn new() -> NsVeth {
        let id = std::process::id() % 100_000;
        let (ns, here, there) = (
            format!("bfxns{id}"),
            format!("bfy{id}"),
            format!("bfy{id}p"),
        );
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        let _ = Command::new("ip").args(["link", "del", &here]).output();
        ip(&["netns", "add", &ns]);
        let v = NsVeth { ns, here };
        ip(&[
            "link", "add", &v.here, "type", "veth", "peer", "name", &there,
        ]);
        ip(&["link", "set", &there, "netns", &v.ns]);
        ip(&["addr", "add", "10.99.0.1/24", "dev", &v.here]);
        ip(&["link", "set", &v.here, "up"]);
        ip(&["-n", &v.ns, "addr", "add", "10.99.0.2/24", "dev", &there]);
        ip(&["-n", &v.ns, "link", "set", &there, "up"]);
        // Static neighbours: ARP is not IP, and the dispatcher drops what it cannot parse.
        let mac = |args: &[&str]| -> String {
            let s = ip(args);
            let at = s.find("link/ether ").expect("a MAC") + 11;
            s[at..at + 17].to_string()
        };
        let mac_here = mac(&["link", "show", "dev", &v.here]);
        let mac_there = mac(&["-n", &v.ns, "link", "show", "dev", &there]);
        ip(&[
            "neigh",
            "replace",
            "10.99.0.2",
            "lladdr",
            &mac_there,
            "dev",
            &v.here,
        ]);
        ip(&[
            "-n",
            &v.ns,
            "neigh",
            "replace",
            "10.99.0.1",
            "lladdr",
            &mac_here,
            "dev",
            &there,
        ]);
        v
    }
}

impl Drop for NsVeth {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.here])
            .output();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

/// The attached program on live traffic (clock time, no AF_XDP socket: XDP_PASS to the
/// stack): datagrams from the other namespace are classified to their tenant, counted
/// in the Tenant Table and the Worker Table, and passed.
#[test]
fn attached_program_classifies_and_counts_live_traffic() {
    let test = "attached_program_classifies_and_counts_live_traffic";
    if !ready(test) {
        return;
    }
    let v = NsVeth::new();
    let mut d = XdpDispatcher::load(XdpConfig {
        shift: 40, // ~18 minutes: the whole test in one timeslot
        threshold: 3,
        tag_dscp: true,
        metadata: true,
        ..XdpConfig::default()
    })
    .unwrap();
    d.add_worker(1000).unwrap();
    let rule = Match {
        src_ip: Some("10.99.0.2/32".parse().unwrap()),
        ..Match::default()
    };
    d.admit(TenantSlot(5), &[(1, rule)], 0, WorkerId(0))
        .unwrap();
    d.attach(&v.here, AttachMode::Generic).unwrap();
    // Five UDP datagrams from the tenant's address (python3: no ping needed).
    let send = Command::new("ip")
        .args(["netns", "exec", &v.ns, "python3", "-c"])
        .arg(
            "import socket\n\
             s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
             for i in range(5): s.sendto(b'buffet', ('10.99.0.1', 9))\n",
        )
        .output()
        .unwrap();
    assert!(
        send.status.success(),
        "{}",
        String::from_utf8_lossy(&send.stderr)
    );
    std::thread::sleep(std::time::Duration::from_millis(200));
    let st = d.stats().unwrap();
    assert!(st.passed >= 5, "{st:?}");
    let (worker, pkts) = d.tenant_row(TenantSlot(5)).unwrap();
    assert_eq!(worker, WorkerId(0));
    assert!(pkts >= 5, "tenant row counted {pkts}");
    assert_eq!(st.passed, d.worker_row(WorkerId(0)).unwrap().0);
}
