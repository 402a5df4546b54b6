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
    /// Why it takes no tenant now (overloaded).
    pub refusing: Option<String>,
}

impl Candidate {
    /// Capacity minus reserved (infinite when unlimited).
    pub fn headroom(&self) -> f64 {
        self.capacity_pps
            .map_or(f64::INFINITY, |c| c - self.reserved_pps)
    }

    fn fits(&self, pps: f64) -> bool {
        self.refusing.is_none() && self.tenants < self.tenant_slots && self.headroom() >= pps
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
    /// Some server could carry it, but none has the headroom (or a slot) now.
    #[error("no server has room for {expected_pps} packets/s now: {detail}")]
    NoRoom {
        /// The tenant's expected rate.
        expected_pps: f64,
        /// Per server, why not.
        detail: String,
    },
}

/// The index in `servers` of the best server for a tenant expecting `pps`.
pub fn choose(servers: &[Candidate], pps: f64) -> Result<usize, PlaceError> {
    if servers.is_empty() {
        return Err(PlaceError::NoServer);
    }
    if let Some(big) = servers
        .iter()
        .filter_map(|s| s.capacity_pps.map(|c| (s, c)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
    {
        if servers.iter().all(|s| s.capacity_pps.is_some()) && big.1 < pps {
            return Err(PlaceError::TooLarge {
                expected_pps: pps,
                server: big.0.id.clone(),
                largest_pps: big.1,
            });
        }
    }
    let best = servers
        .iter()
        .enumerate()
        .filter(|(_, s)| s.fits(pps))
        .max_by(|(_, a), (_, b)| {
            a.headroom()
                .total_cmp(&b.headroom())
                .then(b.tenants.cmp(&a.tenants))
                .then(b.id.cmp(&a.id))
        });
    match best {
        Some((i, _)) => Ok(i),
        None => Err(PlaceError::NoRoom {
            expected_pps: pps,
            detail: servers
                .iter()
                .map(|s| {
                    let why = if let Some(r) = &s.refusing {
                        format!("overloaded ({r})")
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
/// fewest tenants first (largest rates first). `tenants` are `(id, measured pps)` of the
/// overloaded server. `None` when the excess cannot be cleared; `servers` is then
/// unchanged.
pub fn relieve(
    servers: &mut [Candidate],
    from: usize,
    tenants: &[(u32, f64)],
    excess_pps: f64,
) -> Option<Vec<(u32, usize)>> {
    let saved: Vec<Candidate> = servers.to_vec();
    let mut sorted = tenants.to_vec();
    sorted.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut moved = 0.0;
    let mut plan = Vec::new();
    for (id, pps) in sorted {
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
        if let Ok(k) = choose(&list, pps) {
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
        }
    }

    #[test]
    fn the_most_headroom_wins_and_ties_go_to_the_fewest_tenants() {
        let s = vec![c("a", 1000.0, 500.0, 1), c("b", 1000.0, 200.0, 9)];
        assert_eq!(choose(&s, 10.0), Ok(1));
        let s = vec![c("a", 1000.0, 200.0, 3), c("b", 1000.0, 200.0, 2)];
        assert_eq!(choose(&s, 10.0), Ok(1));
    }

    #[test]
    fn booking_spreads_equal_tenants_evenly() {
        let mut s = vec![
            c("a", 1e4, 0.0, 0),
            c("b", 1e4, 0.0, 0),
            c("c", 1e4, 0.0, 0),
        ];
        for _ in 0..300 {
            let i = choose(&s, 10.0).unwrap();
            book(&mut s[i], 10.0);
        }
        assert!(s.iter().all(|x| x.tenants == 100), "{s:?}");
    }

    #[test]
    fn too_large_no_server_and_no_room_are_told_apart() {
        assert_eq!(choose(&[], 1.0), Err(PlaceError::NoServer));
        let s = vec![c("a", 1000.0, 0.0, 0), c("b", 2000.0, 0.0, 0)];
        assert!(matches!(
            choose(&s, 5000.0),
            Err(PlaceError::TooLarge { ref server, .. }) if server == "b"
        ));
        let s = vec![c("a", 1000.0, 900.0, 0), c("b", 2000.0, 1950.0, 0)];
        let e = choose(&s, 500.0).unwrap_err();
        assert!(e.to_string().contains("a: headroom 100"), "{e}");
        let mut busy = c("a", 1e6, 0.0, 0);
        busy.refusing = Some("worker 0 overloaded".into());
        let e = choose(&[busy], 1.0).unwrap_err();
        assert!(e.to_string().contains("overloaded (worker 0"), "{e}");
    }

    #[test]
    fn relieving_moves_the_fewest_tenants() {
        let mut s = vec![c("hot", 1000.0, 1300.0, 4), c("cool", 1000.0, 100.0, 1)];
        let tenants = [(1, 100.0), (2, 400.0), (3, 300.0), (4, 500.0)];
        // Excess 300: the 500 packets/s tenant alone clears it.
        let plan = relieve(&mut s, 0, &tenants, 300.0).unwrap();
        assert_eq!(plan, vec![(4, 1)]);
        assert_eq!(s[1].reserved_pps, 600.0);
        // Nowhere to go: nothing moves.
        let mut s = vec![c("hot", 1000.0, 1300.0, 4), c("full", 1000.0, 990.0, 1)];
        assert_eq!(relieve(&mut s, 0, &tenants, 300.0), None);
        assert_eq!(s[0].reserved_pps, 1300.0);
    }
}
