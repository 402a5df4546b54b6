//! Isolation domains: what, beyond the type system, keeps one tenant's NF code away from
//! other tenants' regions while it runs.
//!
//! Every [`TenantEntry`](crate::TenantEntry) carries a [`Domain`] tag, and
//! [`TenantEntry::lock`](crate::TenantEntry::lock) calls [`Domain::enter`] when it hands out
//! the state and [`Domain::leave`] when the guard drops — once per packet group, the
//! granularity at which a worker switches tenants.
//!
//! Only [`Domain::None`] exists today: the "safe" isolation level, where a Rust handler
//! gets `&mut State` of exactly one tenant and cannot name another, so there is nothing
//! to switch. The MPK level (a protection key per region, the worker's PKRU opened for
//! one tenant at a time, keys virtualised over the 15 usable ones) is the seam this type
//! leaves: a new variant carrying the entry's (virtual) key, whose `enter`/`leave` write
//! PKRU. That variant may need per-worker context (the key cache) in `enter`, so treat
//! these two signatures as the place where it plugs in, not as final.

/// Where a region lies in the address space: what an isolation domain protects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RegionExtent {
    /// First address of the region (page-aligned).
    pub base: usize,
    /// Length in bytes (a multiple of the page size).
    pub len: usize,
}

impl RegionExtent {
    /// One past the last address.
    pub fn end(&self) -> usize {
        self.base + self.len
    }

    /// Whether `addr` lies inside the region.
    pub fn contains(&self, addr: usize) -> bool {
        (self.base..self.end()).contains(&addr)
    }
}

/// The isolation domain a tenant's state runs in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Domain {
    /// No hardware isolation: the type system is the boundary (safe Rust NFs).
    /// `enter` and `leave` do nothing.
    #[default]
    None,
}

impl Domain {
    /// Opens `region` to the current thread before the tenant's code runs.
    #[inline]
    pub fn enter(&self, region: RegionExtent) {
        match self {
            Domain::None => {
                let _ = region;
            }
        }
    }

    /// Closes `region` again after the tenant's code ran.
    #[inline]
    pub fn leave(&self, region: RegionExtent) {
        match self {
            Domain::None => {
                let _ = region;
            }
        }
    }

    /// A short stable name (`none`), for logs and the API.
    pub const fn name(&self) -> &'static str {
        match self {
            Domain::None => "none",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extent_bounds() {
        let e = RegionExtent {
            base: 0x1000,
            len: 0x2000,
        };
        assert_eq!(e.end(), 0x3000);
        assert!(e.contains(0x1000) && e.contains(0x2fff));
        assert!(!e.contains(0xfff) && !e.contains(0x3000));
    }

    #[test]
    fn none_is_the_default_and_named() {
        assert_eq!(Domain::default(), Domain::None);
        assert_eq!(Domain::None.name(), "none");
    }
}
