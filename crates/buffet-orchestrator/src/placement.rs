//! The placement policy, sans I/O: which server a tenant goes to, and which tenants
//! leave an overloaded server. The Orchestrator feeds it what etcd says; it reads no
//! clock and talks to nobody.
//!
//! **Admission.** A server *fits* a tenant when it is not overloaded, has a free Tenant
//! Table slot, and its headroom covers the tenant's expected rate. Headroom is the
//! server's capacity (every worker it may launch at MAX_NB, in packets per second) minus
//! its reserved rate, the larger of what it measured and the sum of the expected rates
//! of the tenants placed on it. Among the servers that fit, the one with the most
//! headroom wins; ties go to the fewest tenants, then the smallest id. A server with an
//! unlimited MAX_NB has unlimited headroom (ties decide). A tenant larger than every
//! server's capacity is refused as such, not as "no headroom".
//!
//! **NFs.** A tenant whose document names its own chain needs every NF of it on its
//! server: only servers that offer them all (their `nf.offered`) are candidates. A
//! server that did not report what it offers is taken to offer anything (it refuses
//! itself what it does not run). A chain no server offers is refused as such, naming the
//! NF, not as "no room".
//!
//! **Overload.** An overloaded server sheds its largest tenants first (by measured
//! rate): the fewest tenants whose rates add up to the excess. Each goes where it fits
//! best, as an admission would; when the excess cannot be cleared, nothing moves and the
//! caller refuses new admissions.

/// A server as the policy sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// Server id.
    pub id: String,
    /// Packets per second it can carry; `None` = unlimited.
    pub capacity_pps: Option<f64>,
    /// Packets per second reserved: max(measured, Σ expected of its tenants).
    pub reserved_pps: f64,
    /// Tenants placed on it.
    pub tenants: u32,
    /// Its Tenant Table slots.
    pub tenant_slots: u32,
    /// Why it takes no tenant now: `overloaded (...)`, or `draining`.
    pub refusing: Option<String>,
    /// The NFs tenants' chains may name on it; empty: it runs one NF for every tenant
    /// and takes no chain. `None`: not reported, taken to offer anything.
    pub offered: Option<Vec<String>>,
}

impl Candidate {
    /// Capacity minus reserved (infinite when unlimited).
    pub fn headroom(&self) -> f64 {
        self.capacity_pps
            .map_or(f64::INFINITY, |c| c - self.reserved_pps)
    }

    /// Whether it runs every NF of `nfs` (a tenant's chain; empty: no chain of its own).
    pub fn offers(&self, nfs: &[String]) -> bool {
        nfs.is_empty()
            || self
                .offered
                .as_ref()
                .is_none_or(|o| nfs.iter().all(|n| o.contains(n)))
    }

    /// The first NF of `nfs` it does not run.
    fn lacks<'a>(&self, nfs: &'a [String]) -> Option<&'a str> {
        let o = self.offered.as_ref()?;
        nfs.iter().find(|n| !o.contains(n)).map(String::as_str)
    }

    fn fits(&self, need: &Need<'_>) -> bool {
        self.refusing.is_none()
            && self.tenants < self.tenant_slots
            && self.headroom() >= need.pps
            && self.offers(need.nfs)
    }
}

/// What a tenant needs of its server.
#[derive(Clone, Copy, Debug)]
pub struct Need<'a> {
    /// Its expected rate, packets per second.
    pub pps: f64,
    /// The NFs its own chain names (its document's `chain[i].nf`, as the server's
    /// `nf.offered` names them), each once; empty when it names no chain.
    pub nfs: &'a [String],
}

impl<'a> Need<'a> {
    /// A tenant of `pps` packets per second running the NFs `nfs`.
    pub fn new(pps: f64, nfs: &'a [String]) -> Need<'a> {
        Need { pps, nfs }
    }
}

/// Why no server was chosen.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PlaceError {
    /// The cluster has no live server.
    #[error("no server is registered in the cluster")]
    NoServer,
    /// The tenant is larger than every server.
    #[error(
        "the tenant expects {expected_pps} packets/s, more than any server can carry \
         (the largest, {server}, carries {largest_pps:.0} packets/s)"
    )]
    TooLarge {
        /// The tenant's expected rate.
        expected_pps: f64,
        /// The largest server.
        server: String,
        /// Its capacity.
        largest_pps: f64,
    },
    /// Its chain names NFs that no server offers (all of them).
    #[error("chain: no server offers {what} ({detail})")]
    NotOffered {
        /// `the NF "x"` (the first NF of its chain that no server offers), or
        /// `["a", "b"] together`.
        what: String,
        /// Per server, what it offers.
        detail: String,
    },
    /// Some server could carry it, but none has the headroom (or a slot) now.
    #[error("no server has room for {expected_pps} packets/s now: {detail}")]
    NoRoom {
        /// The tenant's expected rate.
        expected_pps: f64,
        /// Per server, why not.
        detail: String,
    },
}

/// The index in `servers` of the best server for a tenant that needs `need`.
pub fn choose(servers: &[Candidate], need: Need<'_>) -> Result<usize, PlaceError> {
    if servers.is_empty() {
        return Err(PlaceError::NoServer);
    }
    // Only the servers that run its NFs could ever take it.
    let able = || servers.iter().filter(|s| s.offers(need.nfs));
    if able().next().is_none() {
        // Named by the first NF nobody runs, else (each runs somewhere) by them all.
        let what = match need
            .nfs
            .iter()
            .find(|n| !servers.iter().any(|s| s.offers(std::slice::from_ref(*n))))
        {
            Some(nf) => format!("the NF {nf:?}"),
            None => format!("{:?} together", need.nfs),
        };
        return Err(PlaceError::NotOffered {
            what,
            detail: servers
                .iter()
                .map(|s| match s.offered.as_deref() {
                    Some([]) => format!("{}: one NF for every tenant, no chains", s.id),
                    Some(o) => format!("{} offers {}", s.id, o.join(", ")),
                    None => format!("{}: not reported", s.id),
                })
                .collect::<Vec<_>>()
                .join("; "),
        });
    }
    if let Some(big) = able()
        .filter_map(|s| s.capacity_pps.map(|c| (s, c)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
    {
        if able().all(|s| s.capacity_pps.is_some()) && big.1 < need.pps {
            return Err(PlaceError::TooLarge {
                expected_pps: need.pps,
                server: big.0.id.clone(),
                largest_pps: big.1,
            });
        }
    }
    let best = servers
        .iter()
        .enumerate()
        .filter(|(_, s)| s.fits(&need))
        .max_by(|(_, a), (_, b)| {
            a.headroom()
                .total_cmp(&b.headroom())
                .then(b.tenants.cmp(&a.tenants))
                .then(b.id.cmp(&a.id))
        });
    match best {
        Some((i, _)) => Ok(i),
        None => Err(PlaceError::NoRoom {
            expected_pps: need.pps,
            detail: servers
                .iter()
                .map(|s| {
                    let why = if let Some(nf) = s.lacks(need.nfs) {
                        format!("does not offer {nf:?}")
                    } else if let Some(r) = &s.refusing {
                        r.clone()
                    } else if s.tenants >= s.tenant_slots {
                        format!("all {} tenant slots used", s.tenant_slots)
                    } else {
                        format!("headroom {:.0} packets/s", s.headroom())
                    };
                    format!("{}: {why}", s.id)
                })
                .collect::<Vec<_>>()
                .join("; "),
        }),
    }
}

/// Books a tenant of `pps` on `c` (what [`choose`] assumes of the next choice).
pub fn book(c: &mut Candidate, pps: f64) {
    c.reserved_pps += pps;
    c.tenants += 1;
}

/// The moves that clear `excess_pps` from `servers[from]`: `(tenant, target index)`,
/// fewest tenants first (largest rates first). `tenants` are `(id, measured pps, the NFs
/// of its chain)` of the overloaded server; each only moves to a server that offers its
/// NFs. `None` when the excess cannot be cleared; `servers` is then unchanged.
pub fn relieve(
    servers: &mut [Candidate],
    from: usize,
    tenants: &[(u32, f64, Vec<String>)],
    excess_pps: f64,
) -> Option<Vec<(u32, usize)>> {
    let saved: Vec<Candidate> = servers.to_vec();
    let mut sorted: Vec<&(u32, f64, Vec<String>)> = tenants.iter().collect();
    sorted.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut moved = 0.0;
    let mut plan = Vec::new();
    for &(id, pps, ref nfs) in sorted {
        if moved >= excess_pps && !plan.is_empty() {
            break;
        }
        let mut others: Vec<(usize, Candidate)> = servers
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != from)
            .map(|(i, c)| (i, c.clone()))
            .collect();
        let list: Vec<Candidate> = others.iter().map(|(_, c)| c.clone()).collect();
        if let Ok(k) = choose(&list, Need::new(pps, nfs)) {
            let target = others.swap_remove(k).0;
            book(&mut servers[target], pps);
            servers[from].reserved_pps -= pps;
            servers[from].tenants = servers[from].tenants.saturating_sub(1);
            moved += pps;
            plan.push((id, target));
        }
    }
    if moved >= excess_pps && !plan.is_empty() {
        Some(plan)
    } else {
        servers.clone_from_slice(&saved);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(id: &str, cap: f64, reserved: f64, tenants: u32) -> Candidate {
        Candidate {
            id: id.into(),
            capacity_pps: Some(cap),
            reserved_pps: reserved,
            tenants,
            tenant_slots: 100,
            refusing: None,
            offered: None,
        }
    }

    /// A tenant of `pps` packets per second naming no chain.
    fn any(pps: f64) -> Need<'static> {
        Need::new(pps, &[])
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_most_headroom_wins_and_ties_go_to_the_fewest_tenants() {
        let s = vec![c("a", 1000.0, 500.0, 1), c("b", 1000.0, 200.0, 9)];
        assert_eq!(choose(&s, any(10.0)), Ok(1));
        let s = vec![c("a", 1000.0, 200.0, 3), c("b", 1000.0, 200.0, 2)];
        assert_eq!(choose(&s, any(10.0)), Ok(1));
    }

    #[test]
    fn booking_spreads_equal_tenants_evenly() {
        let mut s = vec![
            c("a", 1e4, 0.0, 0),
            c("b", 1e4, 0.0, 0),
            c("c", 1e4, 0.0, 0),
        ];
        for _ in 0..300 {
            let i = choose(&s, any(10.0)).unwrap();
            book(&mut s[i], 10.0);
        }
        assert!(s.iter().all(|x| x.tenants == 100), "{s:?}");
    }

    #[test]
    fn too_large_no_server_and_no_room_are_told_apart() {
        assert_eq!(choose(&[], any(1.0)), Err(PlaceError::NoServer));
        let s = vec![c("a", 1000.0, 0.0, 0), c("b", 2000.0, 0.0, 0)];
        assert!(matches!(
            choose(&s, any(5000.0)),
            Err(PlaceError::TooLarge { ref server, .. }) if server == "b"
        ));
        let s = vec![c("a", 1000.0, 900.0, 0), c("b", 2000.0, 1950.0, 0)];
        let e = choose(&s, any(500.0)).unwrap_err();
        assert!(e.to_string().contains("a: headroom 100"), "{e}");
        let mut busy = c("a", 1e6, 0.0, 0);
        busy.refusing = Some("overloaded (worker 0 overloaded)".into());
        let e = choose(&[busy], any(1.0)).unwrap_err();
        assert!(e.to_string().contains("overloaded (worker 0"), "{e}");
    }

    #[test]
    fn relieving_moves_the_fewest_tenants() {
        let mut s = vec![c("hot", 1000.0, 1300.0, 4), c("cool", 1000.0, 100.0, 1)];
        let tenants: Vec<(u32, f64, Vec<String>)> =
            [(1, 100.0), (2, 400.0), (3, 300.0), (4, 500.0)]
                .into_iter()
                .map(|(id, pps)| (id, pps, Vec::new()))
                .collect();
        // Excess 300: the 500 packets/s tenant alone clears it.
        let plan = relieve(&mut s, 0, &tenants, 300.0).unwrap();
        assert_eq!(plan, vec![(4, 1)]);
        assert_eq!(s[1].reserved_pps, 600.0);
        // Nowhere to go: nothing moves.
        let mut s = vec![c("hot", 1000.0, 1300.0, 4), c("full", 1000.0, 990.0, 1)];
        assert_eq!(relieve(&mut s, 0, &tenants, 300.0), None);
        assert_eq!(s[0].reserved_pps, 1300.0);
    }

    #[test]
    fn a_chain_goes_only_to_a_server_that_offers_all_its_nfs() {
        let chain = names(&["firewall", "my-nf"]);
        let mut roomy = c("roomy", 1e6, 0.0, 0);
        roomy.offered = Some(names(&["firewall"]));
        let mut small = c("small", 1000.0, 900.0, 5);
        small.offered = Some(names(&["monitor", "firewall", "my-nf"]));
        let mut single = c("single", 1e6, 0.0, 0);
        single.offered = Some(Vec::new());
        let s = vec![roomy.clone(), small.clone(), single.clone()];
        // The most headroom does not win when it lacks an NF of the chain.
        assert_eq!(choose(&s, Need::new(10.0, &chain)), Ok(1));
        // A tenant naming no chain goes anywhere: the most headroom.
        assert_eq!(choose(&s, any(10.0)), Ok(0));
        // The one server offering them has no room: said per server.
        let e = choose(&s, Need::new(500.0, &chain))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("no server has room for 500 packets/s now"),
            "{e}"
        );
        assert!(e.contains("roomy: does not offer \"my-nf\""), "{e}");
        assert!(e.contains("small: headroom 100"), "{e}");
        assert!(e.contains("single: does not offer \"firewall\""), "{e}");
        // Too large is judged among the servers that could run it.
        let e = choose(&s, Need::new(5000.0, &chain)).unwrap_err();
        assert!(
            matches!(e, PlaceError::TooLarge { ref server, .. } if server == "small"),
            "{e}"
        );
        // No server offers it: refused naming the NF and what each offers.
        let e = choose(&[roomy.clone(), single.clone()], Need::new(1.0, &chain))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "chain: no server offers the NF \"my-nf\" (roomy offers firewall; single: one \
             NF for every tenant, no chains)"
        );
        // Each NF somewhere, both nowhere.
        let mut other = c("other", 1e6, 0.0, 0);
        other.offered = Some(names(&["my-nf"]));
        let e = choose(&[roomy.clone(), other], Need::new(1.0, &chain))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("chain: no server offers [\"firewall\", \"my-nf\"] together"),
            "{e}"
        );
        // A server that did not say what it offers may run anything (it refuses itself).
        let mut old = c("old", 10.0, 0.0, 0);
        old.offered = None;
        assert_eq!(choose(&[roomy, single, old], Need::new(1.0, &chain)), Ok(2));
    }

    #[test]
    fn relieving_moves_a_tenant_only_where_its_nfs_run() {
        let mut hot = c("hot", 1000.0, 1300.0, 2);
        hot.offered = Some(names(&["firewall", "my-nf"]));
        let mut plain = c("plain", 1e6, 0.0, 0);
        plain.offered = Some(names(&["firewall"]));
        let mut able = c("able", 1000.0, 0.0, 0);
        able.offered = Some(names(&["my-nf"]));
        // The larger tenant runs my-nf: it may only go to `able`, though `plain` has
        // more headroom; the smaller one, firewall, goes to `plain`.
        let tenants = vec![
            (1, 600.0, names(&["my-nf"])),
            (2, 200.0, names(&["firewall"])),
        ];
        let mut s = vec![hot.clone(), plain.clone(), able.clone()];
        let plan = relieve(&mut s, 0, &tenants, 700.0).unwrap();
        assert_eq!(plan, vec![(1, 2), (2, 1)]);
        // Without a server running my-nf, its 600 packets/s cannot move: the excess
        // stays, and nothing moves.
        let mut s = vec![hot, plain];
        assert_eq!(relieve(&mut s, 0, &tenants, 700.0), None);
        assert_eq!(s[1].reserved_pps, 0.0);
    }
}
