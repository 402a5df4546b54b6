//! `my-nf`: the NF of the walk-through in docs/nf-authors.md. Per tenant it counts
//! packets and UDP datagrams and drops UDP to the ports its policy blocks.
//!
//! The binary (`src/main.rs`) is the whole `buffet` command with this NF registered as
//! `my-nf`: `my-nf replay --nf my-nf --tenants tenants.toml --input in.pcap`.
#![forbid(unsafe_code)]

use buffet::config::RegisteredNf;
use buffet::sdk::{DropCause, InitError, MemorySpec, NetworkFunction, Packet, Verdict};
use serde::Deserialize;

/// Most ports one tenant may block.
pub const MAX_BLOCKED: usize = 16;

/// The NF. It holds nothing: everything per tenant is in [`State`].
#[derive(Debug, Default)]
pub struct MyNf;

/// A tenant's policy, from its `[tenant.policy]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    /// UDP destination ports to drop.
    pub block_udp_ports: Vec<u16>,
}

/// One tenant's state, in that tenant's region.
#[derive(Debug, Default)]
pub struct State {
    blocked: [u16; MAX_BLOCKED],
    n_blocked: usize,
    packets: u64,
    udp: u64,
    dropped: u64,
}

impl NetworkFunction for MyNf {
    type State = State;
    type Policy = Policy;

    fn name(&self) -> &'static str {
        "my-nf"
    }

    fn register(&self) -> MemorySpec {
        MemorySpec::of::<State>()
    }

    fn init(&self, policy: &Policy, state: &mut State) -> Result<(), InitError> {
        if policy.block_udp_ports.len() > MAX_BLOCKED {
            return Err(InitError::invalid(
                "block_udp_ports",
                format!("at most {MAX_BLOCKED} ports"),
            ));
        }
        if policy.block_udp_ports.contains(&0) {
            return Err(InitError::invalid(
                "block_udp_ports",
                "port 0 cannot be blocked",
            ));
        }
        state.n_blocked = policy.block_udp_ports.len();
        state.blocked[..state.n_blocked].copy_from_slice(&policy.block_udp_ports);
        Ok(())
    }

    fn handle(&self, pkt: &mut Packet<'_>, state: &mut State) -> Verdict {
        state.packets += 1;
        let Some(udp) = pkt.udp() else {
            return Verdict::Pass;
        };
        state.udp += 1;
        if state.blocked[..state.n_blocked].contains(&udp.destination_port()) {
            state.dropped += 1;
            return Verdict::Drop(DropCause::Policy);
        }
        Verdict::Pass
    }

    fn summary(&self, state: &State) -> Vec<(&'static str, u64)> {
        vec![
            ("packets", state.packets),
            ("udp", state.udp),
            ("blocked", state.dropped),
        ]
    }
}

/// Lets the `buffet` command run it (no faults to report: it is safe Rust).
impl RegisteredNf for MyNf {}
