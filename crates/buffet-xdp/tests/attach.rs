//! Attaching the XDP Packet Dispatcher to a veth: a program left on the interface by an
//! earlier run (attached through netlink, as `ip link set … xdpgeneric` does) is
//! replaced, a program another live dispatcher holds is not, and dropping the dispatcher
//! detaches it. Needs root, `ip` and clang; skipped otherwise (a failure in CI).

use std::process::Command;

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

#[test]
fn leftover_is_replaced_live_one_is_not_and_drop_detaches() {
    let test = "leftover_is_replaced_live_one_is_not_and_drop_detaches";
    if !ready(test) {
        return;
    }
    let veth = Veth::new();
    // A leftover: some XDP program attached through netlink by a process that is gone.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("pass.c");
    std::fs::write(
        &src,
        "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\n\
         SEC(\"xdp\") int leftover(struct xdp_md *c) { return XDP_PASS; }\n\
         char LICENSE[] SEC(\"license\") = \"GPL\";\n",
    )
    .unwrap();
    let obj = dir.path().join("pass.o");
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
    ip(&[
        "link",
        "set",
        "dev",
        &veth.0,
        "xdpgeneric",
        "obj",
        obj.to_str().unwrap(),
        "sec",
        "xdp",
    ]);
    assert!(veth.xdp_attached());
    assert!(ip(&["-d", "link", "show", "dev", &veth.0]).contains("leftover"));

    let mut d = XdpDispatcher::load(XdpConfig::default()).unwrap();
    d.add_worker(100).unwrap();
    d.attach(&veth.0, AttachMode::Generic).unwrap();
    assert!(d.replaced_leftover());
    assert_eq!(d.attached_to(), Some(veth.0.as_str()));
    let shown = ip(&["-d", "link", "show", "dev", &veth.0]);
    assert!(
        shown.contains("buffet_dispatch") && !shown.contains("leftover"),
        "{shown}"
    );

    // A second dispatcher must not take the hook from a live one.
    let mut other = XdpDispatcher::load(XdpConfig::default()).unwrap();
    match other.attach(&veth.0, AttachMode::Generic) {
        Err(AttachError::Busy { iface, .. }) => assert_eq!(iface, veth.0),
        r => panic!("{r:?}"),
    }
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
