//! Isolation domains: what, beyond the type system, keeps one tenant's NF code away from
//! other tenants' regions while it runs.
//!
//! Every [`TenantEntry`](crate::TenantEntry) carries a [`Domain`] tag.
//! [`TenantEntry::lock`](crate::TenantEntry::lock) enters the domain when it hands out the
//! state and the guard leaves it when dropped — once per packet group, the granularity at
//! which a worker switches tenants.
//!
//! * [`Domain::None`]: the "safe" isolation level, where a Rust handler gets `&mut State`
//!   of exactly one tenant and cannot name another, so there is nothing to switch.
//! * [`Domain::Mpk`]: a protection key per region, the thread's PKRU opened for one tenant
//!   at a time, keys virtualised over the 15 usable ones ([`Mpk`](crate::Mpk)).

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

/// The isolation domain a tenant's state runs in: a tag, fixed per Tenant Table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Domain {
    /// No hardware isolation: the type system is the boundary (safe Rust NFs). Entering
    /// and leaving cost nothing.
    #[default]
    None,
    /// Intel memory protection keys ([`Mpk`](crate::Mpk)): the region carries a non-zero
    /// key that only the thread holding the tenant's state guard has open.
    Mpk,
}

impl Domain {
    /// A short stable name (`none`, `mpk`), for logs and the API.
    pub const fn name(&self) -> &'static str {
        match self {
            Domain::None => "none",
            Domain::Mpk => "mpk",
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
        assert_eq!(Domain::Mpk.name(), "mpk");
    }
}
