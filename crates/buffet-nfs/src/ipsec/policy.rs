//! The IPsec policy a tenant writes (TOML/JSON) and its validation into SAs
//! ([`IpsecState::from_policy`]). Nothing here touches packets.

use std::net::Ipv4Addr;

use buffet_sdk::policy::{self, IpPrefix, PolicyValueError};
use buffet_sdk::{InitError, PortId};
use serde::Deserialize;

use super::{
    EspCipher, InboundSa, IpsecCounters, IpsecState, MacRewrite, OutboundSa, ReplayWindow,
    DEFAULT_REPLAY_WINDOW, DEFAULT_TTL, KEYMAT_LEN, MAX_REPLAY_WINDOW,
};

/// What happens to traffic that is neither inbound ESP nor matched by an outbound SA.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unmatched {
    /// Let it through in clear (an RFC 4301 BYPASS).
    Pass,
    /// Drop it, counted as [`DropCause::Policy`](buffet_sdk::DropCause::Policy) (an RFC 4301 DISCARD).
    #[default]
    Drop,
}

/// MAC addresses written into frames leaving in one direction.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EthRewrite {
    /// Source MAC (`aa:bb:cc:dd:ee:ff`); unchanged when absent.
    pub src: Option<String>,
    /// Destination MAC; unchanged when absent.
    pub dst: Option<String>,
}

/// One outbound SA: traffic to `selector` is encapsulated towards `remote`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboundSaPolicy {
    /// SPI the peer chose for this SA (256 and up; 0–255 are reserved).
    pub spi: u32,
    /// Hex keying material: 32-byte AES-256 key then 4-byte salt (72 hex digits, optional `0x`).
    pub key: String,
    /// Outer source address: this gateway's tunnel endpoint.
    pub local: String,
    /// Outer destination address: the peer's tunnel endpoint.
    pub remote: String,
    /// Inner destination prefix (`10.2.0.0/16`) sent through this SA.
    pub selector: String,
    /// Outer TTL (default 64).
    pub ttl: Option<u8>,
    /// Extended (64-bit) sequence numbers, RFC 4303 §2.2.1; both ends must agree.
    #[serde(default)]
    pub esn: bool,
}

/// One inbound SA: ESP from `remote` to `local` with this SPI is decapsulated.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InboundSaPolicy {
    /// SPI this gateway chose for the SA (256 and up).
    pub spi: u32,
    /// Hex keying material: 32-byte AES-256 key then 4-byte salt.
    pub key: String,
    /// Outer destination address: this gateway's tunnel endpoint.
    pub local: String,
    /// Outer source address: the peer's tunnel endpoint.
    pub remote: String,
    /// Inner source prefix the SA may carry; any when absent.
    pub selector: Option<String>,
    /// Anti-replay window for this SA (default: the tenant's `replay_window`).
    pub replay_window: Option<u32>,
    /// Extended (64-bit) sequence numbers; both ends must agree.
    #[serde(default)]
    pub esn: bool,
}

/// A tenant's IPsec policy (see the module doc for a TOML example).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpsecPolicy {
    /// Outbound SAs, selected by inner destination (longest prefix).
    #[serde(default)]
    pub outbound: Vec<OutboundSaPolicy>,
    /// Inbound SAs, selected by SPI.
    #[serde(default)]
    pub inbound: Vec<InboundSaPolicy>,
    /// Default anti-replay window in packets (64).
    pub replay_window: Option<u32>,
    /// Traffic matching no SA: `"pass"` or `"drop"` (default).
    #[serde(default)]
    pub unmatched: Unmatched,
    /// Largest outer IPv4 packet (total length); larger ones are dropped, not fragmented.
    pub mtu: Option<u16>,
    /// Forward encapsulated packets to this port (default: [`Verdict::Pass`](buffet_sdk::Verdict::Pass)).
    pub outbound_port: Option<PortId>,
    /// Forward decapsulated packets to this port (default: [`Verdict::Pass`](buffet_sdk::Verdict::Pass)).
    pub inbound_port: Option<PortId>,
    /// MAC addresses for encapsulated frames.
    pub outbound_eth: Option<EthRewrite>,
    /// MAC addresses for decapsulated frames.
    pub inbound_eth: Option<EthRewrite>,
}

/// Parses an SA selector: an IPv4 [`IpPrefix`] written with its length (`10.2.0.0/16`).
fn parse_selector(s: &str) -> Result<IpPrefix, String> {
    let (a, l) = s
        .split_once('/')
        .ok_or_else(|| format!("`{s}` is not a prefix (expected a.b.c.d/len)"))?;
    if a.parse::<Ipv4Addr>().is_err() {
        return Err(format!("`{a}` is not an IPv4 address"));
    }
    s.parse::<IpPrefix>().map_err(|e| match e {
        PolicyValueError::BadPrefixLength(_) | PolicyValueError::PrefixTooLong { .. } => {
            format!("prefix length `{l}` is not 0..=32")
        }
        e => e.to_string(),
    })
}

pub(super) fn parse_hex(s: &str) -> Result<Vec<u8>, String> {
    let h = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if h.is_empty() {
        return Err("must not be empty".into());
    }
    if h.len() % 2 != 0 {
        return Err(format!("odd number of hex digits ({})", h.len()));
    }
    h.as_bytes()
        .chunks(2)
        .map(|p| {
            let d = |c: u8| (c as char).to_digit(16);
            match (d(p[0]), d(p[1])) {
                (Some(hi), Some(lo)) => Ok((hi * 16 + lo) as u8),
                _ => Err(format!(
                    "`{}` is not hexadecimal",
                    String::from_utf8_lossy(p)
                )),
            }
        })
        .collect()
}

fn parse_key(field: &str, s: &str) -> Result<(EspCipher, [u8; 32]), InitError> {
    let bytes = parse_hex(s).map_err(|m| InitError::invalid(field, m))?;
    if bytes.len() != KEYMAT_LEN {
        return Err(InitError::invalid(
            field,
            format!(
                "must be {KEYMAT_LEN} bytes (a 32-byte AES-256 key followed by the 4-byte salt), got {}",
                bytes.len()
            ),
        ));
    }
    let cipher = EspCipher::new(&bytes).map_err(|e| InitError::invalid(field, e.to_string()))?;
    let mut aes = [0u8; 32];
    aes.copy_from_slice(&bytes[..32]);
    Ok((cipher, aes))
}

fn parse_addr(field: &str, s: &str) -> Result<[u8; 4], InitError> {
    s.parse::<Ipv4Addr>()
        .map(|a| a.octets())
        .map_err(|_| InitError::invalid(field, format!("`{s}` is not an IPv4 address")))
}

fn parse_spi(field: &str, spi: u32) -> Result<u32, InitError> {
    if spi < 256 {
        return Err(InitError::invalid(
            field,
            format!("SPI {spi} is reserved (RFC 4303: 0-255); use 256 or more"),
        ));
    }
    Ok(spi)
}

fn parse_window(field: &str, w: u32) -> Result<u32, InitError> {
    if w == 0 || w > MAX_REPLAY_WINDOW {
        return Err(InitError::invalid(
            field,
            format!("{w} is not 1..={MAX_REPLAY_WINDOW} packets"),
        ));
    }
    Ok(w)
}

fn parse_mac(field: &str, s: &str) -> Result<[u8; 6], InitError> {
    policy::parse_mac(s).map_err(|e| InitError::invalid(field, e.to_string()))
}

fn parse_eth(field: &str, e: &Option<EthRewrite>) -> Result<Option<MacRewrite>, InitError> {
    let Some(e) = e else { return Ok(None) };
    let src = e
        .src
        .as_deref()
        .map(|s| parse_mac(&format!("{field}.src"), s))
        .transpose()?;
    let dst = e
        .dst
        .as_deref()
        .map(|s| parse_mac(&format!("{field}.dst"), s))
        .transpose()?;
    Ok(Some(MacRewrite { src, dst }))
}

impl IpsecState {
    /// Validates `policy` and builds the state; at most `max_sas` SAs per direction.
    ///
    /// Errors name the policy field: a key that is empty, not hex, or not 36 bytes; a
    /// reserved or duplicate SPI; a bad address or prefix; two outbound SAs with the same
    /// selector; an AES key used by two SAs (GCM nonces would repeat across them); a
    /// window, TTL or MTU out of range.
    pub fn from_policy(policy: &IpsecPolicy, max_sas: usize) -> Result<Self, InitError> {
        for (name, n) in [
            ("outbound", policy.outbound.len()),
            ("inbound", policy.inbound.len()),
        ] {
            if n > max_sas {
                return Err(InitError::invalid(
                    name,
                    format!("{n} SAs exceed the registered maximum of {max_sas}"),
                ));
            }
        }
        let default_window = match policy.replay_window {
            Some(w) => parse_window("replay_window", w)?,
            None => DEFAULT_REPLAY_WINDOW,
        };
        if let Some(mtu) = policy.mtu {
            if mtu < 68 {
                return Err(InitError::invalid(
                    "mtu",
                    format!("{mtu} is below IPv4's minimum of 68"),
                ));
            }
        }
        let mut keys: Vec<([u8; 32], String)> = Vec::new();
        let mut check_key_reuse = |aes: [u8; 32], field: String| -> Result<(), InitError> {
            if let Some((_, other)) = keys.iter().find(|(k, _)| *k == aes) {
                return Err(InitError::invalid(
                    field,
                    format!(
                        "the same AES key is used by `{other}`; every SA needs its own key \
                         (AES-GCM nonces would repeat across them)"
                    ),
                ));
            }
            keys.push((aes, field));
            Ok(())
        };

        let mut outbound = Vec::with_capacity(policy.outbound.len());
        for (i, sa) in policy.outbound.iter().enumerate() {
            let f = |name: &str| format!("outbound[{i}].{name}");
            let spi = parse_spi(&f("spi"), sa.spi)?;
            let (cipher, aes) = parse_key(&f("key"), &sa.key)?;
            check_key_reuse(aes, f("key"))?;
            let local = parse_addr(&f("local"), &sa.local)?;
            let remote = parse_addr(&f("remote"), &sa.remote)?;
            let selector =
                parse_selector(&sa.selector).map_err(|m| InitError::invalid(f("selector"), m))?;
            let ttl = sa.ttl.unwrap_or(DEFAULT_TTL);
            if ttl == 0 {
                return Err(InitError::invalid(f("ttl"), "must be at least 1"));
            }
            if let Some(j) = policy.outbound[..i]
                .iter()
                .position(|o| o.spi == sa.spi && parse_addr("", &o.remote).ok() == Some(remote))
            {
                return Err(InitError::invalid(
                    f("spi"),
                    format!(
                        "duplicate SPI {:#x} towards {} (also outbound[{j}])",
                        sa.spi, sa.remote
                    ),
                ));
            }
            if let Some(j) = outbound
                .iter()
                .position(|o: &OutboundSa| o.selector == selector)
            {
                return Err(InitError::invalid(
                    f("selector"),
                    format!("`{}` is already the selector of outbound[{j}]", sa.selector),
                ));
            }
            outbound.push(OutboundSa {
                spi,
                cipher,
                local,
                remote,
                selector,
                ttl,
                esn: sa.esn,
                next_seq: 1,
                exhausted: false,
            });
        }
        outbound.sort_by_key(|sa| std::cmp::Reverse(sa.selector.len()));

        let mut inbound: Vec<InboundSa> = Vec::with_capacity(policy.inbound.len());
        for (i, sa) in policy.inbound.iter().enumerate() {
            let f = |name: &str| format!("inbound[{i}].{name}");
            let spi = parse_spi(&f("spi"), sa.spi)?;
            if let Some(j) = policy.inbound[..i].iter().position(|o| o.spi == sa.spi) {
                return Err(InitError::invalid(
                    f("spi"),
                    format!("duplicate SPI {:#x} (also inbound[{j}])", sa.spi),
                ));
            }
            let (cipher, aes) = parse_key(&f("key"), &sa.key)?;
            check_key_reuse(aes, f("key"))?;
            let local = parse_addr(&f("local"), &sa.local)?;
            let remote = parse_addr(&f("remote"), &sa.remote)?;
            let selector = sa
                .selector
                .as_deref()
                .map(parse_selector)
                .transpose()
                .map_err(|m| InitError::invalid(f("selector"), m))?;
            let window = match sa.replay_window {
                Some(w) => parse_window(&f("replay_window"), w)?,
                None => default_window,
            };
            inbound.push(InboundSa {
                spi,
                cipher,
                local,
                remote,
                selector,
                esn: sa.esn,
                window: ReplayWindow::new(window),
            });
        }
        inbound.sort_by_key(|sa| sa.spi);

        let mut endpoints: Vec<[u8; 4]> = outbound
            .iter()
            .map(|sa| sa.local)
            .chain(inbound.iter().map(|sa| sa.local))
            .collect();
        endpoints.sort_unstable();
        endpoints.dedup();

        Ok(IpsecState {
            outbound,
            inbound,
            endpoints,
            unmatched: policy.unmatched,
            mtu: policy.mtu,
            outbound_port: policy.outbound_port,
            inbound_port: policy.inbound_port,
            outbound_eth: parse_eth("outbound_eth", &policy.outbound_eth)?,
            inbound_eth: parse_eth("inbound_eth", &policy.inbound_eth)?,
            counters: IpsecCounters::default(),
        })
    }
}
