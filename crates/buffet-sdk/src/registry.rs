//! The tenant registry: which tenant id holds which [`TenantSlot`].
//!
//! A tenant has one identity ([`TenantId`], chosen by the provider) and, while admitted,
//! one dense index ([`TenantSlot`]) that every per-tenant table uses: the Memory
//! Manager's Tenant Table, the Packet Dispatcher's Load Monitor rows, the workers'
//! counters. [`TenantRegistry`] is the one place that maps between them and decides which
//! slot a new tenant gets; in a pipeline the Memory Manager's Tenant Table owns it, and a
//! tool that runs the dispatcher alone (the trace runner) owns one directly. Nothing else
//! keeps an id→slot map.
//!
//! A slot is *free*, *occupied* by one tenant, or *retired*: its tenant was removed but
//! packets classified under the slot may still be queued, so it is not handed out again
//! until [`TenantRegistry::release`]. The registry is plain data with no locking and no
//! I/O; whoever owns it serialises changes.
//!
//! ```
//! use buffet_sdk::registry::{RegistryError, TenantRegistry};
//! use buffet_sdk::{TenantId, TenantSlot};
//!
//! let mut reg = TenantRegistry::new(2);
//! let a = reg.admit_next(TenantId(7)).unwrap();
//! assert_eq!(a, TenantSlot(0));
//! assert_eq!(reg.admit_next(TenantId(7)), Err(RegistryError::AlreadyAdmitted {
//!     id: TenantId(7),
//!     slot: a,
//! }));
//! reg.retire(a);
//! // Retired: not reused until its queued packets drained and the owner releases it.
//! assert_eq!(reg.admit_next(TenantId(8)), Ok(TenantSlot(1)));
//! assert!(matches!(reg.admit_next(TenantId(9)), Err(RegistryError::Full { .. })));
//! reg.release(a);
//! assert_eq!(reg.admit_next(TenantId(9)), Ok(TenantSlot(0)));
//! ```

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use crate::{TenantId, TenantSlot};

/// Why the registry refused a change. When returned, nothing changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The tenant is already admitted.
    #[error("tenant {id} is already admitted ({slot})")]
    AlreadyAdmitted {
        /// The tenant.
        id: TenantId,
        /// Where it is.
        slot: TenantSlot,
    },
    /// Every slot is occupied or retired.
    #[error("too many tenants: all {capacity} Tenant Table slots are in use")]
    Full {
        /// The number of slots.
        capacity: u32,
    },
    /// The slot index is not below the capacity.
    #[error("{slot} is out of range: the table has {capacity} slots")]
    SlotOutOfRange {
        /// The slot asked for.
        slot: TenantSlot,
        /// The number of slots.
        capacity: u32,
    },
    /// Another tenant occupies the slot.
    #[error("{slot} is occupied by tenant {occupant}")]
    SlotOccupied {
        /// The slot asked for.
        slot: TenantSlot,
        /// The tenant there.
        occupant: TenantId,
    },
    /// The slot's removed tenant may still have packets queued.
    #[error("{slot} is retired until its removed tenant's packets drain")]
    SlotRetired {
        /// The slot asked for.
        slot: TenantSlot,
    },
    /// No tenant with this id is admitted.
    #[error("tenant {0} is not admitted")]
    Unknown(TenantId),
}

/// Tenant id ↔ tenant slot, and which slots are free. See the module docs.
#[derive(Clone, Debug)]
pub struct TenantRegistry {
    capacity: u32,
    by_id: FxHashMap<TenantId, TenantSlot>,
    /// Indexed by slot: the occupant. Grows to the highest slot used so far, so a
    /// registry of millions of slots costs nothing until they are used.
    ids: Vec<Option<TenantId>>,
    /// Slots below `ids.len()` neither occupied nor retired; with `ids.len()` itself
    /// they give the lowest free slot.
    free: BTreeSet<u32>,
    retired: BTreeSet<u32>,
}

impl TenantRegistry {
    /// A registry of `capacity` free slots.
    pub fn new(capacity: u32) -> Self {
        TenantRegistry {
            capacity,
            by_id: FxHashMap::default(),
            ids: Vec::new(),
            free: BTreeSet::new(),
            retired: BTreeSet::new(),
        }
    }

    /// Number of slots.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Number of admitted tenants.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether no tenant is admitted.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// The slot tenant `id` holds.
    pub fn slot_of(&self, id: TenantId) -> Option<TenantSlot> {
        self.by_id.get(&id).copied()
    }

    /// The tenant holding `slot`.
    pub fn id_of(&self, slot: TenantSlot) -> Option<TenantId> {
        self.ids.get(slot.index()).copied().flatten()
    }

    /// Whether `slot` waits for its removed tenant's packets to drain.
    pub fn is_retired(&self, slot: TenantSlot) -> bool {
        self.retired.contains(&slot.0)
    }

    /// Every admitted tenant with its slot, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (TenantSlot, TenantId)> + '_ {
        self.ids
            .iter()
            .enumerate()
            .filter_map(|(i, id)| id.map(|id| (TenantSlot(i as u32), id)))
    }

    /// The slot [`admit_next`](Self::admit_next) would give `id`, without taking it: the
    /// lowest free slot.
    pub fn next_slot(&self, id: TenantId) -> Result<TenantSlot, RegistryError> {
        if let Some(slot) = self.slot_of(id) {
            return Err(RegistryError::AlreadyAdmitted { id, slot });
        }
        match self.free.first() {
            Some(&s) => Ok(TenantSlot(s)),
            None if self.ids.len() < self.capacity as usize => {
                Ok(TenantSlot(self.ids.len() as u32))
            }
            None => Err(RegistryError::Full {
                capacity: self.capacity,
            }),
        }
    }

    /// Whether [`admit`](Self::admit) of `id` at `slot` would succeed.
    pub fn check_admit(&self, slot: TenantSlot, id: TenantId) -> Result<(), RegistryError> {
        if let Some(at) = self.slot_of(id) {
            return Err(RegistryError::AlreadyAdmitted { id, slot: at });
        }
        if slot.0 >= self.capacity {
            return Err(RegistryError::SlotOutOfRange {
                slot,
                capacity: self.capacity,
            });
        }
        match self.ids.get(slot.index()) {
            None => Ok(()),
            Some(Some(occupant)) => Err(RegistryError::SlotOccupied {
                slot,
                occupant: *occupant,
            }),
            Some(None) if self.is_retired(slot) => Err(RegistryError::SlotRetired { slot }),
            Some(None) => Ok(()),
        }
    }

    /// Records tenant `id` at `slot`.
    pub fn admit(&mut self, slot: TenantSlot, id: TenantId) -> Result<(), RegistryError> {
        self.check_admit(slot, id)?;
        self.extend_to(slot);
        self.ids[slot.index()] = Some(id);
        self.by_id.insert(id, slot);
        self.free.remove(&slot.0);
        Ok(())
    }

    /// Records tenant `id` at the lowest free slot and returns it.
    pub fn admit_next(&mut self, id: TenantId) -> Result<TenantSlot, RegistryError> {
        let slot = self.next_slot(id)?;
        self.admit(slot, id)?;
        Ok(slot)
    }

    /// Frees `slot` at once; returns the tenant that held it.
    pub fn remove(&mut self, slot: TenantSlot) -> Option<TenantId> {
        let id = self.take(slot)?;
        if !self.is_retired(slot) {
            self.free.insert(slot.0);
        }
        Some(id)
    }

    /// Empties `slot` but keeps it from reuse until [`release`](Self::release); returns
    /// the tenant that held it. A free slot in range becomes retired too.
    pub fn retire(&mut self, slot: TenantSlot) -> Option<TenantId> {
        if slot.0 >= self.capacity {
            return None;
        }
        self.extend_to(slot);
        self.free.remove(&slot.0);
        self.retired.insert(slot.0);
        self.take(slot)
    }

    /// Makes a retired slot reusable. Returns whether it was retired.
    pub fn release(&mut self, slot: TenantSlot) -> bool {
        if !self.retired.remove(&slot.0) {
            return false;
        }
        if self.id_of(slot).is_none() {
            self.free.insert(slot.0);
        }
        true
    }

    /// Makes `ids` cover `slot`; the slots added below it are free.
    fn extend_to(&mut self, slot: TenantSlot) {
        let old = self.ids.len();
        if slot.index() >= old {
            self.ids.resize(slot.index() + 1, None);
            self.free.extend(old as u32..slot.0);
        }
    }

    fn take(&mut self, slot: TenantSlot) -> Option<TenantId> {
        let id = self.ids.get_mut(slot.index())?.take()?;
        self.by_id.remove(&id);
        Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowest_free_slot_first_and_ids_unique() {
        let mut r = TenantRegistry::new(4);
        assert_eq!(r.admit_next(TenantId(10)), Ok(TenantSlot(0)));
        assert_eq!(r.admit(TenantSlot(2), TenantId(12)), Ok(()));
        assert_eq!(r.admit_next(TenantId(11)), Ok(TenantSlot(1)));
        assert_eq!(r.admit_next(TenantId(13)), Ok(TenantSlot(3)));
        assert_eq!(
            r.admit(TenantSlot(1), TenantId(99)),
            Err(RegistryError::SlotOccupied {
                slot: TenantSlot(1),
                occupant: TenantId(11)
            })
        );
        assert_eq!(
            r.admit(TenantSlot(9), TenantId(99)),
            Err(RegistryError::SlotOutOfRange {
                slot: TenantSlot(9),
                capacity: 4
            })
        );
        assert_eq!(
            r.admit_next(TenantId(12)),
            Err(RegistryError::AlreadyAdmitted {
                id: TenantId(12),
                slot: TenantSlot(2)
            })
        );
        assert_eq!(
            r.admit_next(TenantId(99)),
            Err(RegistryError::Full { capacity: 4 })
        );
        assert_eq!(r.len(), 4);
        let all: Vec<_> = r.iter().map(|(s, id)| (s.0, id.0)).collect();
        assert_eq!(all, vec![(0, 10), (1, 11), (2, 12), (3, 13)]);
    }

    #[test]
    fn a_huge_registry_costs_only_what_it_uses() {
        let mut r = TenantRegistry::new(u32::MAX);
        assert_eq!(r.admit(TenantSlot(5), TenantId(1)), Ok(()));
        // Slots below the highest used one are free and handed out lowest first.
        let got: Vec<u32> = (0..6)
            .map(|i| r.admit_next(TenantId(10 + i)).unwrap().0)
            .collect();
        assert_eq!(got, [0, 1, 2, 3, 4, 6]);
        assert!(r.ids.len() <= 7);
    }

    #[test]
    fn removed_slots_are_reused_retired_ones_only_after_release() {
        let mut r = TenantRegistry::new(3);
        for id in 0..3 {
            r.admit_next(TenantId(id)).unwrap();
        }
        assert_eq!(r.remove(TenantSlot(2)), Some(TenantId(2)));
        assert_eq!(r.retire(TenantSlot(0)), Some(TenantId(0)));
        assert_eq!(r.slot_of(TenantId(0)), None);
        assert_eq!(r.id_of(TenantSlot(0)), None);
        assert_eq!(
            r.admit(TenantSlot(0), TenantId(5)),
            Err(RegistryError::SlotRetired {
                slot: TenantSlot(0)
            })
        );
        assert_eq!(r.admit_next(TenantId(5)), Ok(TenantSlot(2)));
        assert!(matches!(
            r.admit_next(TenantId(6)),
            Err(RegistryError::Full { .. })
        ));
        assert!(r.release(TenantSlot(0)));
        assert!(!r.release(TenantSlot(0)));
        assert_eq!(r.admit_next(TenantId(6)), Ok(TenantSlot(0)));
        assert_eq!(r.remove(TenantSlot(0)), Some(TenantId(6)));
        assert_eq!(r.remove(TenantSlot(0)), None);
        assert_eq!(r.len(), 2);
    }
}
