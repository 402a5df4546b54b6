//! Tenant Table tests: admission rules, drop accounting, and concurrent traffic.

use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::thread;
use std::time::Duration;

use buffet_sdk::{RegistryError, TenantId, TenantSlot};

use crate::*;

/// A state that counts how often values of it were dropped.
struct Tracked {
    n: u64,
    drops: Arc<AtomicUsize>,
}

impl Tracked {
    fn new(drops: &Arc<AtomicUsize>) -> Self {
        Tracked {
            n: 0,
            drops: Arc::clone(drops),
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

fn storage(mib: usize) -> MemoryStorage {
    MemoryStorage::new(ArenaConfig {
        capacity: mib << 20,
    })
    .unwrap()
}

/// Read-modify-write that loses updates if two threads ever run it at once.
fn bump(n: &mut u64) {
    let v = black_box(*n);
    std::hint::spin_loop();
    *n = black_box(v + 1);
}

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn handles_are_send_and_sync() {
    assert_send_sync::<MemoryStorage>();
    assert_send_sync::<Region>();
    // `Cell` is Send but not Sync: the table still is, like Mutex<Cell<_>>.
    assert_send_sync::<TenantTable<Cell<u64>>>();
    assert_send_sync::<TenantEntry<Cell<u64>>>();
}

#[test]
fn state_lives_in_its_region() {
    let table = TenantTable::new(storage(16), 8);
    let page = table.storage().page_size();
    table
        .admit(TenantSlot(3), TenantId(9), 3 * page, [7u64; 64])
        .unwrap();
    let got = table.get(TenantSlot(3));
    let entry = got.entry().unwrap();
    assert_eq!((entry.id(), entry.slot()), (TenantId(9), TenantSlot(3)));
    // Outside MPK: the 512-byte state packed, the bytes past it (3 pages less 512 bytes,
    // rounded up to pages) in a page region of their own.
    assert_eq!(entry.extent().len, 512);
    assert_eq!(entry.tail_extent().map(|t| t.len), Some(3 * page));
    assert_eq!(entry.region_len(), 512 + 3 * page);
    assert_eq!(entry.domain(), Domain::None);
    let mut guard = entry.lock();
    let addr = &*guard as *const [u64; 64] as usize;
    assert_eq!(addr, entry.extent().base, "state sits at the region's base");
    assert!(entry.extent().contains(addr + 64 * 8 - 1));
    assert_eq!(guard[63], 7);
    let (_, tail) = guard.split().unwrap();
    assert_eq!(tail.as_ptr() as usize, entry.tail_extent().unwrap().base);
    assert_eq!(tail.len(), 3 * page);
    assert!(tail.iter().all(|&b| b == 0));
    drop(tail);
    drop(guard);
    let st = table.storage().stats();
    assert_eq!((st.regions, st.in_use), (2, 512 + 3 * page));
    assert_eq!((st.packed_regions, st.packed_chunks), (1, 1));
}

#[test]
fn lookups_of_empty_or_missing_slots_miss() {
    let table = TenantTable::<u64>::new(storage(4), 4);
    assert!(table.get(TenantSlot(0)).is_none());
    assert!(table.get(TenantSlot(4)).is_none());
    assert!(table.get(TenantSlot(u32::MAX)).entry().is_none());
    assert!(table.get_arc(TenantSlot(u32::MAX)).is_none());
    assert!(table.remove(TenantSlot(4)).is_none());
    assert!(table.remove(TenantSlot(1)).is_none());
    assert_eq!((table.len(), table.capacity()), (0, 4));
    assert!(table.is_empty());
}

#[test]
fn duplicate_slot_or_id_and_bad_slot_are_rejected() {
    let drops = Arc::new(AtomicUsize::new(0));
    let table = TenantTable::new(storage(16), 4);
    table
        .admit(TenantSlot(0), TenantId(1), 64, Tracked::new(&drops))
        .unwrap();
    let before = table.storage().stats();

    let e = table.admit(TenantSlot(0), TenantId(2), 64, Tracked::new(&drops));
    assert_eq!(
        e,
        Err(MemoryError::Registry(RegistryError::SlotOccupied {
            slot: TenantSlot(0),
            occupant: TenantId(1)
        }))
    );
    let e = table.admit(TenantSlot(1), TenantId(1), 64, Tracked::new(&drops));
    assert_eq!(
        e,
        Err(MemoryError::Registry(RegistryError::AlreadyAdmitted {
            id: TenantId(1),
            slot: TenantSlot(0)
        }))
    );
    let e = table.admit(TenantSlot(4), TenantId(3), 64, Tracked::new(&drops));
    assert_eq!(
        e,
        Err(MemoryError::Registry(RegistryError::SlotOutOfRange {
            slot: TenantSlot(4),
            capacity: 4
        }))
    );
    // Each rejected state was dropped once; nothing else moved.
    assert_eq!(drops.load(Ordering::SeqCst), 3);
    assert_eq!(table.storage().stats(), before);
    assert_eq!(table.ids(), vec![(TenantSlot(0), TenantId(1))]);
    assert_eq!(table.len(), 1);
    assert!(table.get(TenantSlot(1)).is_none());

    // After removal the id and the slot are free again.
    drop(table.remove(TenantSlot(0)));
    table
        .admit(TenantSlot(2), TenantId(1), 64, Tracked::new(&drops))
        .unwrap();
    table
        .admit(TenantSlot(0), TenantId(5), 64, Tracked::new(&drops))
        .unwrap();
    assert_eq!(table.slot_of(TenantId(1)), Some(TenantSlot(2)));
    assert_eq!(table.slot_of(TenantId(2)), None);
    assert_eq!(
        table.ids(),
        vec![(TenantSlot(0), TenantId(5)), (TenantSlot(2), TenantId(1))]
    );
}

#[test]
fn state_that_does_not_fit_is_rejected_and_changes_nothing() {
    let drops = Arc::new(AtomicUsize::new(0));
    let table = TenantTable::new(storage(1), 4);
    let page = table.storage().page_size();
    table
        .admit(TenantSlot(0), TenantId(1), 64, Tracked::new(&drops))
        .unwrap();
    let before = table.storage().stats();
    let check_unchanged = |table: &TenantTable<_>| {
        assert_eq!(table.storage().stats(), before);
        assert_eq!(table.ids(), vec![(TenantSlot(0), TenantId(1))]);
        assert!(table.get(TenantSlot(1)).is_none());
        assert_eq!(table.slot_of(TenantId(2)), None);
    };

    // The region asked for is smaller than the state.
    let e = table.admit(TenantSlot(1), TenantId(2), 4, Tracked::new(&drops));
    assert_eq!(
        e,
        Err(MemoryError::StateTooLarge {
            state_bytes: std::mem::size_of::<Tracked>(),
            region_bytes: 4
        })
    );
    check_unchanged(&table);

    // Larger than the arena could ever give.
    let e = table.admit(TenantSlot(1), TenantId(2), 2 << 20, Tracked::new(&drops));
    assert!(
        matches!(e, Err(MemoryError::Alloc(AllocError::TooLarge { .. }))),
        "{e:?}"
    );
    check_unchanged(&table);

    // Fits an empty arena, but not what is left of this one: the bytes past the (packed)
    // state need one byte more than the largest free range.
    let e = table.admit(
        TenantSlot(1),
        TenantId(2),
        region_tail_offset::<Tracked>() + before.largest_free + 1,
        Tracked::new(&drops),
    );
    assert!(
        matches!(e, Err(MemoryError::Alloc(AllocError::Exhausted { .. }))),
        "{e:?}"
    );
    check_unchanged(&table);
    assert_eq!(drops.load(Ordering::SeqCst), 3);
    assert!(e.unwrap_err().to_string().starts_with("arena exhausted"));

    // A state needing more than page alignment cannot be placed at a page-aligned base.
    #[repr(align(65536))]
    struct Aligned(#[allow(dead_code)] u8);
    let t2 = TenantTable::new(storage(4), 4);
    let e = t2.admit(TenantSlot(0), TenantId(1), 1 << 20, Aligned(0));
    if 65536 > page {
        assert_eq!(
            e,
            Err(MemoryError::StateOverAligned {
                align: 65536,
                page_size: page
            })
        );
        assert_eq!(t2.len(), 0);
        assert_eq!(t2.storage().stats().regions, 0);
    } else {
        e.unwrap();
    }
}

#[test]
fn state_is_dropped_exactly_once() {
    let drops = Arc::new(AtomicUsize::new(0));
    let count = || drops.load(Ordering::SeqCst);
    let table = TenantTable::new(storage(16), 8);

    // Removed and dropped by the control thread.
    table
        .admit(TenantSlot(0), TenantId(1), 64, Tracked::new(&drops))
        .unwrap();
    let removed = table.remove(TenantSlot(0)).unwrap();
    assert_eq!(count(), 0, "still held");
    drop(removed);
    assert_eq!(count(), 1);

    // Removed while a reader still holds it: dropped when the reader lets go.
    table
        .admit(TenantSlot(1), TenantId(2), 64, Tracked::new(&drops))
        .unwrap();
    let reader = table.get(TenantSlot(1));
    let arc = table.get_arc(TenantSlot(1)).unwrap();
    drop(table.remove(TenantSlot(1)));
    assert!(
        table.get(TenantSlot(1)).is_none(),
        "new lookups miss at once"
    );
    assert_eq!(count(), 1);
    reader.entry().unwrap().lock().n += 1;
    drop(reader);
    assert_eq!(count(), 1);
    assert_eq!(table.storage().stats().regions, 1, "region kept while held");
    drop(arc);
    assert_eq!(count(), 2);
    assert_eq!(
        table.storage().stats().regions,
        0,
        "region released with it"
    );

    // Still admitted when the table goes away.
    table
        .admit(TenantSlot(2), TenantId(3), 64, Tracked::new(&drops))
        .unwrap();
    table
        .admit(TenantSlot(3), TenantId(4), 64, Tracked::new(&drops))
        .unwrap();
    let storage = table.storage().clone();
    drop(table);
    assert_eq!(count(), 4);
    assert_eq!(storage.stats().regions, 0);
    assert_eq!(storage.stats().in_use, 0);
}

#[test]
fn released_tenant_memory_is_zero_for_the_next_tenant() {
    let table = TenantTable::new(storage(16), 4);
    let page = table.storage().page_size();
    table
        .admit(TenantSlot(0), TenantId(1), 512 + page, [0xABu8; 512])
        .unwrap();
    let entry = table.get_arc(TenantSlot(0)).unwrap();
    let (base, tail) = (entry.extent().base, entry.tail_extent().unwrap().base);
    entry.lock().split().unwrap().1.fill(0xCD);
    drop(entry);
    drop(table.remove(TenantSlot(0)));
    // The next tenant lands in the same ranges; its bytes are zero: the packed state's
    // and the page region's past it.
    let mut packed = table.storage().alloc_packed(512).unwrap();
    assert_eq!(packed.extent().base, base);
    assert!(packed.bytes().unwrap().iter().all(|&b| b == 0));
    packed.bytes_mut().unwrap()[0] = 1;
    // Best fit may first hand out a smaller free range (beside the packed chunk); every
    // region on the way is zero too, until the old range comes back.
    let mut taken = Vec::new();
    loop {
        let mut region = table.storage().alloc(page).unwrap();
        assert!(region.bytes().unwrap().iter().all(|&b| b == 0));
        region.bytes_mut().unwrap()[0] = 1;
        let base = region.extent().base;
        taken.push(region);
        if base == tail {
            break;
        }
        assert!(taken.len() < 1024, "the freed range never came back");
    }
}

#[test]
fn two_threads_never_hold_the_same_tenant() {
    const THREADS: usize = 4;
    const ROUNDS: u64 = 20_000;
    let table = Arc::new(TenantTable::new(storage(4), 2));
    table.admit(TenantSlot(0), TenantId(1), 64, 0u64).unwrap();
    let holders = Arc::new(AtomicUsize::new(0));
    let max_seen = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(THREADS));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (table, holders, max_seen, start) = (
                Arc::clone(&table),
                Arc::clone(&holders),
                Arc::clone(&max_seen),
                Arc::clone(&start),
            );
            thread::spawn(move || {
                start.wait();
                let r = table.get(TenantSlot(0));
                let entry = r.entry().unwrap();
                for i in 0..ROUNDS {
                    let mut g = if (i + t as u64) % 3 == 0 {
                        loop {
                            if let Some(g) = entry.try_lock() {
                                break g;
                            }
                            std::hint::spin_loop();
                        }
                    } else {
                        entry.lock()
                    };
                    let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                    max_seen.fetch_max(now, Ordering::SeqCst);
                    bump(&mut g);
                    // Widen the window a broken lock would need to show.
                    if i % 64 == 0 {
                        thread::yield_now();
                    }
                    for _ in 0..32 {
                        std::hint::spin_loop();
                    }
                    max_seen.fetch_max(holders.load(Ordering::SeqCst), Ordering::SeqCst);
                    holders.fetch_sub(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(max_seen.load(Ordering::SeqCst), 1, "two holders at once");
    assert_eq!(
        *table.get(TenantSlot(0)).entry().unwrap().lock(),
        THREADS as u64 * ROUNDS
    );

    // try_lock fails while another thread holds the lock, and succeeds after.
    let entry = table.get_arc(TenantSlot(0)).unwrap();
    let g = entry.lock();
    let e2 = Arc::clone(&entry);
    assert!(thread::spawn(move || e2.try_lock().is_none())
        .join()
        .unwrap());
    drop(g);
    let e2 = Arc::clone(&entry);
    assert!(thread::spawn(move || e2.try_lock().is_some())
        .join()
        .unwrap());
}

#[test]
fn admission_and_removal_under_traffic_lose_nothing() {
    const HOT: u32 = 8; // tenants A..H, slots 0..8
    const SLOTS: u32 = 48; // slots HOT.. churn
    const READERS: usize = 4;
    const MIN_CHURN_ROUNDS: u64 = 300;

    let table = Arc::new(TenantTable::new(storage(64), SLOTS));
    let page = table.storage().page_size();
    let hot_drops = Arc::new(AtomicUsize::new(0));
    let churn_drops = Arc::new(AtomicUsize::new(0));
    for s in 0..HOT {
        table
            .admit(
                TenantSlot(s),
                TenantId(s + 1),
                page,
                Tracked::new(&hot_drops),
            )
            .unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let churn_rounds = Arc::new(AtomicU64::new(0));
    let churn_hits = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(READERS + 1));

    let readers: Vec<_> = (0..READERS)
        .map(|r| {
            let (table, stop, start, churn_hits) = (
                Arc::clone(&table),
                Arc::clone(&stop),
                Arc::clone(&start),
                Arc::clone(&churn_hits),
            );
            thread::spawn(move || {
                let mut made = [0u64; HOT as usize];
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ r as u64;
                start.wait();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) || i < 10_000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let hot = (x % HOT as u64) as u32;
                    let got = table.get(TenantSlot(hot));
                    let entry = got.entry().expect("hot tenant vanished");
                    assert_eq!(entry.id(), TenantId(hot + 1));
                    bump(&mut entry.lock().n);
                    made[hot as usize] += 1;
                    // Also touch a churning slot: admitted, removed or in between.
                    let cold = HOT + (x >> 32) as u32 % (SLOTS - HOT);
                    if let Some(e) = table.get(TenantSlot(cold)).entry() {
                        bump(&mut e.lock().n);
                        churn_hits.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 1;
                }
                made
            })
        })
        .collect();

    let control = {
        let (table, stop, start, churn_rounds, churn_drops) = (
            Arc::clone(&table),
            Arc::clone(&stop),
            Arc::clone(&start),
            Arc::clone(&churn_rounds),
            Arc::clone(&churn_drops),
        );
        thread::spawn(move || {
            start.wait();
            let mut next_id = 1000u32;
            let mut created = 0usize;
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for s in HOT..SLOTS {
                    let bytes = std::mem::size_of::<Tracked>() + (s as usize % 3) * page;
                    if table.get(TenantSlot(s)).is_none() {
                        created += 1;
                        table
                            .admit(
                                TenantSlot(s),
                                TenantId(next_id),
                                bytes,
                                Tracked::new(&churn_drops),
                            )
                            .unwrap();
                        next_id += 1;
                    }
                    // Rejected admissions under load change nothing either.
                    created += 1;
                    let dup = table.admit(
                        TenantSlot(s),
                        TenantId(1),
                        bytes,
                        Tracked::new(&churn_drops),
                    );
                    assert!(matches!(
                        dup,
                        Err(MemoryError::Registry(RegistryError::AlreadyAdmitted { .. }))
                    ));
                }
                for s in (HOT..SLOTS).filter(|s| (*s as u64 + round) % 2 == 0) {
                    let gone = table.remove(TenantSlot(s)).expect("was admitted");
                    assert!(gone.id().0 >= 1000);
                }
                round += 1;
                churn_rounds.store(round, Ordering::Relaxed);
            }
            created
        })
    };

    while churn_rounds.load(Ordering::Relaxed) < MIN_CHURN_ROUNDS && !control.is_finished() {
        thread::yield_now();
    }
    stop.store(true, Ordering::Relaxed);
    let created = control.join().expect("control thread panicked");
    let made: Vec<[u64; HOT as usize]> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    assert!(
        churn_hits.load(Ordering::Relaxed) > 0,
        "readers never met a churning tenant"
    );

    // Every increment of every hot tenant is there; none of their state was dropped.
    for s in 0..HOT {
        let expected: u64 = made.iter().map(|m| m[s as usize]).sum();
        let got = table.get(TenantSlot(s));
        let entry = got.entry().unwrap();
        assert_eq!(entry.lock().n, expected, "tenant {} lost updates", s + 1);
    }
    assert_eq!(hot_drops.load(Ordering::SeqCst), 0);

    // Each churn state was dropped exactly once: those still admitted drop with the table.
    let still = table.len() - HOT as usize;
    assert_eq!(churn_drops.load(Ordering::SeqCst), created - still);
    let storage = table.storage().clone();
    let tails = table
        .ids()
        .iter()
        .filter(|(slot, _)| table.get_arc(*slot).unwrap().tail_extent().is_some())
        .count();
    let stats = storage.stats();
    assert_eq!(stats.packed_regions, table.len());
    assert_eq!(stats.regions, table.len() + tails);
    drop(table);
    assert_eq!(churn_drops.load(Ordering::SeqCst), created);
    assert_eq!(hot_drops.load(Ordering::SeqCst), HOT as usize);
    assert_eq!(storage.stats().regions, 0);
    assert_eq!(storage.stats().in_use, 0);
}

#[test]
fn generations_change_on_every_admit_and_remove() {
    let table: TenantTable<u64> = TenantTable::new(storage(4), 4);
    assert_eq!((table.generation(TenantSlot(1)), table.changes()), (0, 0));
    table.admit(TenantSlot(1), TenantId(10), 8, 5).unwrap();
    let g1 = table.generation(TenantSlot(1));
    assert_ne!(g1, 0);
    assert_eq!(
        table.generation(TenantSlot(2)),
        0,
        "other slots keep theirs"
    );
    // A failed admission changes nothing.
    assert!(table.admit(TenantSlot(1), TenantId(11), 8, 6).is_err());
    assert_eq!(table.generation(TenantSlot(1)), g1);
    table.remove(TenantSlot(1)).unwrap();
    let g2 = table.generation(TenantSlot(1));
    assert_ne!(g2, g1);
    table.admit(TenantSlot(1), TenantId(12), 8, 7).unwrap();
    assert_ne!(table.generation(TenantSlot(1)), g2);
    assert_eq!(table.changes(), 3);
    assert_eq!(table.generation(TenantSlot(99)), 0, "out of range");
}

#[test]
fn replace_publishes_a_new_entry_only_when_its_init_succeeds() {
    let table = TenantTable::<u64>::new(storage(4), 4);
    table.admit(TenantSlot(1), TenantId(7), 64, 5).unwrap();
    let gen = table.generation(TenantSlot(1));
    let held = table.get_arc(TenantSlot(1)).unwrap();

    // A failing init (the new policy is rejected): the old entry keeps serving.
    let before = table.storage().stats();
    let e = table.replace_with(TenantId(7), 64, 9, |_, _| Err("bad policy"));
    assert!(
        matches!(e, Err(AdmitWithError::Init("bad policy"))),
        "{e:?}"
    );
    assert_eq!(*table.get(TenantSlot(1)).entry().unwrap().lock(), 5);
    assert_eq!(table.generation(TenantSlot(1)), gen);
    assert_eq!(table.storage().stats(), before);

    // A good one: the slot and id stay, the state is the new one, the holder of the old
    // entry still has it (its region lives until it lets go).
    let old = table
        .replace_with(TenantId(7), 64, 9, |s, _| {
            *s += 1;
            Ok::<(), &str>(())
        })
        .unwrap();
    assert!(Arc::ptr_eq(&old, &held));
    assert_ne!(table.generation(TenantSlot(1)), gen);
    let now = table.get_arc(TenantSlot(1)).unwrap();
    assert_eq!(
        (now.id(), now.slot(), *now.lock()),
        (TenantId(7), TenantSlot(1), 10)
    );
    assert_eq!(*held.lock(), 5);
    assert_eq!(table.slot_of(TenantId(7)), Some(TenantSlot(1)));
    assert_eq!(table.len(), 1);

    // Nothing to replace for a tenant not admitted.
    let e = table.replace_with(TenantId(8), 64, 0, |_, _| Ok::<(), ()>(()));
    assert!(
        matches!(
            e,
            Err(AdmitWithError::Memory(MemoryError::Registry(
                RegistryError::Unknown(TenantId(8))
            )))
        ),
        "{e:?}"
    );
}

#[test]
fn a_prepared_replacement_serves_nothing_until_published() {
    let table = TenantTable::<u64>::new(storage(4), 4);
    table.admit(TenantSlot(1), TenantId(7), 64, 5).unwrap();
    let gen = table.generation(TenantSlot(1));
    let before = table.storage().stats();
    // Built and initialised, not published: the old entry serves; dropping it frees it.
    let r = table
        .prepare_replacement(TenantId(7), 64, 9, |s, _| {
            *s += 1;
            Ok::<(), &str>(())
        })
        .unwrap();
    assert_eq!(*table.get(TenantSlot(1)).entry().unwrap().lock(), 5);
    assert_eq!(table.generation(TenantSlot(1)), gen);
    drop(r);
    assert_eq!(table.storage().stats(), before);
    // A rejected init builds nothing.
    let e = table.prepare_replacement(TenantId(7), 64, 9, |_, _| Err("bad policy"));
    assert!(
        matches!(e, Err(AdmitWithError::Init("bad policy"))),
        "{e:?}"
    );
    assert!(matches!(
        table.prepare_replacement(TenantId(8), 64, 9, |_, _| Ok::<(), &str>(())),
        Err(AdmitWithError::Memory(MemoryError::Registry(
            RegistryError::Unknown(TenantId(8))
        )))
    ));
    // Published: one swap, same slot and id, the new state.
    let r = table
        .prepare_replacement(TenantId(7), 64, 9, |s, _| {
            *s += 1;
            Ok::<(), &str>(())
        })
        .unwrap();
    let old = table.publish(r).unwrap();
    assert_eq!(*old.lock(), 5);
    assert_ne!(table.generation(TenantSlot(1)), gen);
    let now = table.get_arc(TenantSlot(1)).unwrap();
    assert_eq!(
        (now.id(), now.slot(), *now.lock()),
        (TenantId(7), TenantSlot(1), 10)
    );
    // The tenant left its slot before the replacement was published: refused.
    let r = table
        .prepare_replacement(TenantId(7), 64, 3, |_, _| Ok::<(), &str>(()))
        .unwrap();
    table.remove(TenantSlot(1)).unwrap();
    assert!(table.publish(r).is_err());
    assert!(table.get(TenantSlot(1)).entry().is_none());
}

/// A replacement prepared for one admission of a tenant is refused once the tenant was
/// removed and admitted again at the same slot meanwhile — same id, same slot, another
/// admission, whose state it must not overwrite — and only that one: a replacement
/// prepared for the admission now in place is published.
#[test]
fn a_replacement_prepared_for_an_earlier_admission_at_the_slot_is_refused() {
    let table = TenantTable::<u64>::new(storage(4), 4);
    let slot = table
        .admit_next(TenantId(7), 64, 5, |_, _| Ok::<(), ()>(()))
        .unwrap();
    let stale = table
        .prepare_replacement(TenantId(7), 64, 1, |_, _| Ok::<(), ()>(()))
        .unwrap();
    table.remove(slot).unwrap();
    let again = table
        .admit_next(TenantId(7), 64, 2, |_, _| Ok::<(), ()>(()))
        .unwrap();
    assert_eq!(again, slot, "admitted again at the same slot");
    let gen = table.generation(slot);
    let before = table.storage().stats();
    let e = table.publish(stale).unwrap_err();
    assert_eq!(
        e,
        MemoryError::StaleReplacement {
            tenant: TenantId(7)
        }
    );
    assert_eq!(
        e.to_string(),
        "the tenant was removed and admitted again at its slot since its new state was \
         prepared; the new state is dropped: update the tenant as it is admitted now"
    );
    // Nothing changed, and the refused state's region is free again.
    assert_eq!(*table.get(slot).entry().unwrap().lock(), 2);
    assert_eq!(table.generation(slot), gen);
    assert_eq!(table.storage().stats().regions, before.regions - 1);
    // A replacement of the admission in place is published.
    let fresh = table
        .prepare_replacement(TenantId(7), 64, 3, |_, _| Ok::<(), ()>(()))
        .unwrap();
    assert_eq!(*table.publish(fresh).unwrap().lock(), 2);
    assert_eq!(*table.get(slot).entry().unwrap().lock(), 3);
}

/// How long a test waits for a table operation that must not wait for another tenant's
/// `init`: far above what it takes, so a failure means it was blocked.
const UNBLOCKED_WITHIN: Duration = Duration::from_secs(10);

/// An admission whose `init` is slow (an eBPF tenant's program being verified) holds up
/// no other change to the table: the data plane's removal, release and publication for
/// other tenants complete while that `init` is still running. Meanwhile its slot and id
/// stay reserved, and it is not admitted until it ends.
#[test]
fn a_slow_init_holds_up_no_other_change_to_the_table() {
    let table = Arc::new(TenantTable::<u64>::new(storage(16), 4));
    table.admit(TenantSlot(0), TenantId(1), 64, 5).unwrap();
    table.admit(TenantSlot(1), TenantId(2), 64, 6).unwrap();
    let prepared = table
        .prepare_replacement(TenantId(1), 64, 7, |_, _| Ok::<(), ()>(()))
        .unwrap();

    // Tenant 3's admission, held inside its `init` until `go` is sent (or dropped, should
    // an assertion below fail first).
    let (entered_tx, entered_rx) = mpsc::channel();
    let (go, go_rx) = mpsc::channel::<()>();
    let slow = {
        let table = Arc::clone(&table);
        thread::spawn(move || {
            table.admit_next(TenantId(3), 64, 8, |_, _| {
                entered_tx.send(()).unwrap();
                let _ = go_rx.recv();
                Ok::<(), ()>(())
            })
        })
    };
    entered_rx
        .recv_timeout(UNBLOCKED_WITHIN)
        .expect("tenant 3's init never started");

    // What the data plane does for other tenants, on a thread of its own.
    let (done_tx, done_rx) = mpsc::channel();
    {
        let table = Arc::clone(&table);
        thread::spawn(move || {
            let old = table.publish(prepared).unwrap();
            let gone = table.remove_and_retire(TenantSlot(1)).unwrap();
            table.release(TenantSlot(1));
            done_tx.send((*old.lock(), gone.id())).unwrap();
        });
    }
    let done = done_rx.recv_timeout(UNBLOCKED_WITHIN);
    if done.is_err() {
        // Let the blocked admission finish so that nothing is left waiting.
        drop(go);
        panic!("publish / remove_and_retire / release waited for another tenant's init");
    }
    assert_eq!(done.unwrap(), (5, TenantId(2)));
    assert_eq!(*table.get(TenantSlot(0)).entry().unwrap().lock(), 7);

    // Still in its init: tenant 3 is not admitted ...
    assert_eq!(table.slot_of(TenantId(3)), None);
    assert_eq!(table.id_of(TenantSlot(2)), None);
    assert_eq!(table.ids(), vec![(TenantSlot(0), TenantId(1))]);
    assert!(table.get(TenantSlot(2)).is_none());
    assert_eq!(table.len(), 1);
    assert!(table.remove(TenantSlot(2)).is_none());
    assert!(table.remove_and_retire(TenantSlot(2)).is_none());
    assert!(matches!(
        table.prepare_replacement(TenantId(3), 64, 0, |_, _| Ok::<(), ()>(())),
        Err(AdmitWithError::Memory(MemoryError::Registry(
            RegistryError::Unknown(TenantId(3))
        )))
    ));
    // ... but its id and its slot are taken: the same refusals as once it is admitted.
    assert_eq!(
        table.admit(TenantSlot(3), TenantId(3), 64, 0),
        Err(MemoryError::Registry(RegistryError::AlreadyAdmitted {
            id: TenantId(3),
            slot: TenantSlot(2)
        }))
    );
    assert!(matches!(
        table.admit_next(TenantId(3), 64, 0, |_, _| Ok::<(), ()>(())),
        Err(AdmitWithError::Memory(MemoryError::Registry(
            RegistryError::AlreadyAdmitted {
                id: TenantId(3),
                slot: TenantSlot(2)
            }
        )))
    ));
    assert_eq!(
        table.admit(TenantSlot(2), TenantId(9), 64, 0),
        Err(MemoryError::Registry(RegistryError::SlotOccupied {
            slot: TenantSlot(2),
            occupant: TenantId(3)
        }))
    );
    // Other admissions go ahead around the reserved slot.
    let next = |id| table.admit_next(TenantId(id), 64, 0, |_, _| Ok::<(), ()>(()));
    assert_eq!(next(4).unwrap(), TenantSlot(1));
    assert_eq!(next(5).unwrap(), TenantSlot(3));
    assert!(matches!(
        next(6),
        Err(AdmitWithError::Memory(MemoryError::Registry(
            RegistryError::Full { capacity: 4 }
        )))
    ));

    go.send(()).unwrap();
    assert_eq!(slow.join().unwrap(), Ok(TenantSlot(2)));
    assert_eq!(table.slot_of(TenantId(3)), Some(TenantSlot(2)));
    assert_eq!(*table.get(TenantSlot(2)).entry().unwrap().lock(), 8);
    assert_eq!(table.len(), 4);
}

/// An admission whose `init` fails, or panics, gives back everything it reserved: the
/// slot, the id and the region.
#[test]
fn a_failed_or_panicking_init_leaves_nothing_reserved() {
    let drops = Arc::new(AtomicUsize::new(0));
    let table = TenantTable::new(storage(16), 2);
    // Once, for the storage's first packed chunk, which then stays.
    table
        .admit(TenantSlot(0), TenantId(9), 64, Tracked::new(&drops))
        .unwrap();
    table.remove(TenantSlot(0)).unwrap();
    let before = table.storage().stats();
    let unchanged = |table: &TenantTable<Tracked>| {
        assert_eq!(table.storage().stats(), before);
        assert_eq!((table.len(), table.ids()), (0, vec![]));
        assert_eq!(table.slot_of(TenantId(1)), None);
    };

    let e = table.admit_next(TenantId(1), 64, Tracked::new(&drops), |_, _| {
        Err("bad policy")
    });
    assert_eq!(e, Err(AdmitWithError::Init("bad policy")));
    unchanged(&table);
    let e = table.admit_with(
        TenantSlot(1),
        TenantId(1),
        64,
        Tracked::new(&drops),
        |_, _| Err("bad policy"),
    );
    assert_eq!(e, Err(AdmitWithError::Init("bad policy")));
    unchanged(&table);
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        table.admit_next(
            TenantId(1),
            64,
            Tracked::new(&drops),
            |_, _| -> Result<(), ()> { panic!("init panicked") },
        )
    }));
    assert!(panicked.is_err());
    unchanged(&table);
    assert_eq!(drops.load(Ordering::SeqCst), 4);

    // The id and the lowest slot are free again.
    let ok = |_: &mut Tracked, _: &mut [u8]| Ok::<(), ()>(());
    assert_eq!(
        table.admit_next(TenantId(1), 64, Tracked::new(&drops), ok),
        Ok(TenantSlot(0))
    );
    table
        .admit(TenantSlot(1), TenantId(2), 64, Tracked::new(&drops))
        .unwrap();
}

// ---------------------------------------------------------------------------------------
// Sealed pages: never reachable through a safe accessor
// ---------------------------------------------------------------------------------------

/// The protection of the page at `addr` (`"rw-"`, `"---"`, …) from /proc/self/maps.
fn prot_of(addr: usize) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (range, perms) = (f.next().unwrap(), f.next().unwrap());
        let (lo, hi) = range.split_once('-').unwrap();
        let lo = usize::from_str_radix(lo, 16).unwrap();
        let hi = usize::from_str_radix(hi, 16).unwrap();
        if (lo..hi).contains(&addr) {
            return perms[..3].to_owned();
        }
    }
    panic!("{addr:#x} is not mapped");
}

#[test]
fn sealed_pages_are_out_of_reach_of_every_safe_accessor() {
    let s = storage(1);
    let page = s.page_size();
    let mut region = s.alloc(4 * page).unwrap();
    let base = region.extent().base;
    let sealed = {
        let mut bytes = region.bytes_mut().unwrap();
        let sealed = seal_pages(&mut bytes[page..2 * page]).unwrap();
        // Until the borrow ends, the pages stay readable and writable.
        bytes[page] = 7;
        assert_eq!(prot_of(base + page), "rw-");
        sealed
    };
    assert_eq!(prot_of(base + page), "---");
    assert_eq!(
        (prot_of(base), prot_of(base + 2 * page)),
        ("rw-".into(), "rw-".into())
    );
    assert!(region.has_sealed_pages());
    assert_eq!(region.bytes().err(), Some(RegionSealed { ranges: 1 }));
    assert_eq!(region.bytes_mut().err(), Some(RegionSealed { ranges: 1 }));
    drop(sealed);
    assert_eq!(prot_of(base + page), "rw-");
    assert_eq!(
        region.bytes().unwrap()[page],
        7,
        "unsealing keeps the bytes"
    );
    region.bytes_mut().unwrap().fill(1);
}

#[test]
fn a_tenant_whose_init_sealed_pages_has_no_split_until_it_leaves() {
    let table = TenantTable::<Vec<SealedPages>>::new(storage(1), 2);
    let page = table.storage().page_size();
    let bytes = region_tail_offset::<Vec<SealedPages>>() + 3 * page;
    let seal_middle = |state: &mut Vec<SealedPages>, tail: &mut [u8]| {
        tail.fill(0x5A);
        state.push(seal_pages(&mut tail[page..2 * page])?);
        Ok::<(), SealError>(())
    };
    table
        .admit_with(TenantSlot(0), TenantId(1), bytes, Vec::new(), seal_middle)
        .unwrap();
    let entry = table.get_arc(TenantSlot(0)).unwrap();
    let tail = entry
        .tail_extent()
        .expect("a packed state, its bytes apart");
    assert_eq!(prot_of(tail.base + page), "---");
    assert_eq!(entry.lock().len(), 1);
    assert_eq!(
        entry.lock().split().err(),
        Some(RegionSealed { ranges: 1 }),
        "the bytes past the state hold a sealed page"
    );
    drop(entry);
    // The state (and its seal) goes first, then the region, scrubbed whole.
    drop(table.remove(TenantSlot(0)));
    table
        .admit(TenantSlot(0), TenantId(2), bytes, Vec::new())
        .unwrap();
    let entry = table.get_arc(TenantSlot(0)).unwrap();
    assert_eq!(entry.tail_extent(), Some(tail), "the same range again");
    assert_eq!(prot_of(tail.base + page), "rw-");
    assert!(entry.lock().split().unwrap().1.iter().all(|&b| b == 0));
}

#[test]
fn a_seal_outliving_its_region_leaves_the_next_region_whole() {
    for scrub in [sys::Scrub::Discard, sys::Scrub::Zero] {
        let s = MemoryStorage::with_scrub(ArenaConfig { capacity: 1 << 20 }, scrub).unwrap();
        let page = s.page_size();
        let _before = s.alloc(1).unwrap();
        let mut region = s.alloc(3 * page).unwrap();
        let _after = s.alloc(1).unwrap();
        let base = region.extent().base;
        let sealed = {
            let mut bytes = region.bytes_mut().unwrap();
            bytes.fill(0xEE);
            seal_pages(&mut bytes[page..2 * page]).unwrap()
        };
        assert_eq!(prot_of(base + page), "---");
        // Released with its page still sealed: scrubbed whole (zeroing by hand opens it).
        drop(region);
        let mut next = s.alloc(3 * page).unwrap();
        assert_eq!(next.extent().base, base, "{scrub:?}: the range is reused");
        assert!(!next.has_sealed_pages());
        assert!(
            next.bytes().unwrap().iter().all(|&b| b == 0),
            "{scrub:?}: old bytes"
        );
        // The old seal, dropped now, neither seals nor opens anything of the new region.
        drop(sealed);
        assert_eq!(prot_of(base + page), "rw-");
        next.bytes_mut().unwrap().fill(1);
        assert_eq!(s.stats().quarantined, 0);
    }
}

#[test]
fn seal_pages_refuses_what_it_cannot_keep_sealed() {
    let s = storage(1);
    let page = s.page_size();
    // Not whole pages of a page region: a packed region, a heap buffer, half a page.
    let mut packed = s.alloc_packed(64).unwrap();
    assert!(matches!(
        seal_pages(&mut packed.bytes_mut().unwrap()),
        Err(SealError::NotInRegion { .. })
    ));
    let mut heap = vec![0u8; 4 * page];
    assert!(matches!(
        seal_pages(&mut heap[..]),
        Err(SealError::NotInRegion { .. })
    ));
    let mut region = s.alloc(3 * page).unwrap();
    assert!(matches!(
        seal_pages(&mut region.bytes_mut().unwrap()[..page / 2]),
        Err(SealError::NotInRegion { .. })
    ));
    // Pages sealed already.
    let (kept, again) = {
        let mut bytes = region.bytes_mut().unwrap();
        let kept = seal_pages(&mut bytes[page..2 * page]).unwrap();
        (kept, seal_pages(&mut bytes[..2 * page]))
    };
    assert!(matches!(again, Err(SealError::Overlap { .. })), "{again:?}");
    // A region with a protection-key tag: re-tagging would open the pages again.
    let tag = region.span().unwrap().tag();
    assert_eq!(
        tag.set_pkey_except(0, &[]).err().map(|e| e.errno),
        Some(libc::EINVAL),
        "a re-tag is refused while a page is sealed"
    );
    drop(kept);
    let tagged = seal_pages(&mut region.bytes_mut().unwrap()[..page]);
    assert!(
        matches!(tagged, Err(SealError::Tagged { .. })),
        "{tagged:?}"
    );
    assert!(!region.has_sealed_pages());
}
