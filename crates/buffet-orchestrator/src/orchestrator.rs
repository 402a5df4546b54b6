//! The Orchestrator's life: connect to etcd, campaign in the election, and while leader,
//! keep the placements right — admit tenants on the server the policy picks
//! ([`crate::placement`]), re-place the tenants of a server whose lease expired, move
//! tenants off a server that reports overload, and clean up admissions that failed.
//!
//! Only the leader writes, and every write is one etcd transaction that also compares
//! the leader key's create revision: an Orchestrator that lost the election (its lease
//! expired while it was cut off) cannot change anything, even before it notices. The
//! leader's view of servers and tenants is loaded from etcd when it wins and after every
//! broken watch (an etcd restart), then kept by one watch over `/buffet/`. The statuses
//! found at each load are acted on like those the watch sees: a refusal nobody handled
//! yet (written while no leader watched) is handled then.
//!
//! This module does not serve HTTP ([`crate::api`]) and does not admit tenants on a
//! server (each server's Agent does, in buffetd).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, LeaderKey, TxnOp, WatchOptions,
};
use serde_json::Value;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use buffet_config::auth::Auth;

use crate::lease::{self, ConnectError, LeaseState};
use crate::placement::{self, Candidate, PlaceError};
use crate::schema::{self, ServerLoad, State as Outcome, Status, TenantRecord};
use crate::serve::{self, ConnSetup};

/// A bearer token the API accepts. Its `Debug` never shows it.
#[derive(Clone)]
pub struct Token(String);

impl Token {
    /// Wraps a token (checked for length by `buffet_config::auth::token_from`).
    pub fn new(token: String) -> Token {
        Token(token)
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// How the Orchestrator runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// etcd client URLs.
    pub etcd: Vec<String>,
    /// The API's address.
    pub listen: SocketAddr,
    /// The URL other Orchestrators give clients when this one leads (default
    /// `http://<listen>`).
    pub advertise: Option<String>,
    /// TTL of the election lease: a dead leader is replaced after at most this.
    pub lease_ttl: Duration,
    /// An admission not live or failed after this gets 504.
    pub admit_timeout: Duration,
    /// The expected rate of a tenant whose admission gives none, packets per second.
    pub default_expected_pps: f64,
    /// How long to wait for etcd at start.
    pub connect_timeout: Duration,
    /// After moving tenants off an overloaded server, leave it alone this long.
    pub overload_cooldown: Duration,
    /// The admin token: every request but `/healthz` may present it.
    pub admin_token: Token,
    /// A token that may only read (`GET`), if any.
    pub reader_token: Option<Token>,
    /// A connection whose request head is not complete within this is closed (also how
    /// long an idle keep-alive connection stays open).
    pub header_read_timeout: Duration,
    /// A request body not complete this long after its head is answered 408.
    pub body_timeout: Duration,
    /// Most API connections open at once; further clients wait in the listen backlog.
    pub max_connections: usize,
}

impl Config {
    /// Defaults around `etcd`, `listen` and the admin token.
    pub fn new(etcd: Vec<String>, listen: SocketAddr, admin_token: Token) -> Config {
        Config {
            etcd,
            listen,
            admin_token,
            reader_token: None,
            advertise: None,
            lease_ttl: Duration::from_secs(10),
            admit_timeout: Duration::from_secs(10),
            default_expected_pps: 10.0,
            connect_timeout: Duration::from_secs(3),
            overload_cooldown: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            max_connections: 256,
        }
    }
}

/// Why the Orchestrator could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// etcd.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The API address.
    #[error("--listen {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// A value of the configuration.
    #[error("{0}")]
    Config(String),
}

/// Why a leader's operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum LeadError {
    /// This Orchestrator does not lead (any more).
    #[error("this orchestrator is not the leader")]
    NotLeader,
    /// etcd failed.
    #[error("etcd: {}", lease::describe(.0))]
    Etcd(#[from] etcd_client::Error),
    /// Somebody changed the record meanwhile.
    #[error("the tenant changed meanwhile")]
    Conflict,
}

/// One re-placement of a dead server's tenants.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Replacement {
    /// The dead server.
    pub server: String,
    /// Tenants re-placed on others.
    pub replaced: usize,
    /// Tenants that fit nowhere (kept unplaced).
    pub unplaced: usize,
    /// From the deletion of its key (seen by the watch) to the last placement written.
    pub millis: f64,
}

/// The leader's view.
#[derive(Default)]
pub(crate) struct View {
    pub(crate) servers: BTreeMap<String, ServerLoad>,
    /// Record and its mod revision.
    pub(crate) tenants: BTreeMap<u32, (TenantRecord, i64)>,
    /// Set while an overload cannot be cleared: new admissions get 503.
    pub(crate) refusing: Option<String>,
    /// The servers an operator drains: chosen for no tenant, their tenants moved off.
    pub(crate) drained: BTreeSet<String>,
    /// The revision of the last drain or end of a drain this leader wrote, per server:
    /// the watch's events up to it are older news.
    drain_revs: HashMap<String, i64>,
    last_relief: HashMap<String, Instant>,
}

impl View {
    pub(crate) fn candidates(&self) -> Vec<Candidate> {
        let mut booked: HashMap<&str, (f64, u32)> = HashMap::new();
        for (r, _) in self.tenants.values() {
            if let Some(s) = &r.server {
                let e = booked.entry(s.as_str()).or_default();
                e.0 += r.expected_pps;
                e.1 += 1;
            }
        }
        self.servers
            .iter()
            .map(|(id, l)| {
                let (expected, n) = booked.get(id.as_str()).copied().unwrap_or_default();
                Candidate {
                    id: id.clone(),
                    capacity_pps: l.capacity_pps(),
                    reserved_pps: l.pps.max(expected),
                    tenants: n,
                    tenant_slots: l.tenant_slots,
                    refusing: if self.drained.contains(id) {
                        Some("draining".into())
                    } else {
                        l.overloaded.as_ref().map(|r| format!("overloaded ({r})"))
                    },
                    offered: l.offered.clone(),
                }
            })
            .collect()
    }
}

/// What the API and the leader task share.
pub struct Shared {
    pub(crate) client: Client,
    pub(crate) me: String,
    pub(crate) cfg: Config,
    leader: RwLock<Option<LeaderKey>>,
    pub(crate) view: tokio::sync::Mutex<View>,
    pub(crate) statuses: broadcast::Sender<(u32, Status)>,
    pub(crate) replacements: Mutex<Vec<Replacement>>,
    /// The admin token's hash.
    pub(crate) admin: Auth,
    /// The reader token's hash, if one is configured.
    pub(crate) reader: Option<Auth>,
}

impl Shared {
    pub(crate) fn is_leader(&self) -> bool {
        self.leader
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    fn leader_key(&self) -> Option<LeaderKey> {
        self.leader
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The current leader's advertised URL, from etcd.
    pub(crate) async fn leader_url(&self) -> Option<String> {
        let mut c = self.client.clone();
        let r = tokio::time::timeout(Duration::from_secs(2), c.leader(schema::ELECTION))
            .await
            .ok()?
            .ok()?;
        r.kv().and_then(|kv| kv.value_str().ok().map(str::to_owned))
    }

    /// Commits `ops` if this Orchestrator still leads and `compares` hold. `Ok(rev)` is
    /// the revision of the write.
    pub(crate) async fn commit(
        &self,
        compares: Vec<Compare>,
        ops: Vec<TxnOp>,
    ) -> Result<i64, LeadError> {
        let key = self.leader_key().ok_or(LeadError::NotLeader)?;
        let mut all = vec![Compare::create_revision(
            key.key(),
            CompareOp::Equal,
            key.rev(),
        )];
        all.extend(compares);
        let mut c = self.client.clone();
        let r = c
            .txn(etcd_client::Txn::new().when(all).and_then(ops))
            .await?;
        if r.succeeded() {
            return Ok(r.header().map_or(0, |h| h.revision()));
        }
        let g = c.get(key.key(), None).await?;
        match g.kvs().first() {
            Some(kv) if kv.create_revision() == key.rev() => Err(LeadError::Conflict),
            _ => {
                *self.leader.write().unwrap_or_else(PoisonError::into_inner) = None;
                Err(LeadError::NotLeader)
            }
        }
    }

    /// The ops that put `rec` for `id` and move its placement from `old` to its server.
    fn move_ops(id: u32, old: Option<&str>, rec: &TenantRecord) -> Vec<TxnOp> {
        let mut ops = vec![TxnOp::put(
            schema::tenant_key(id),
            serde_json::to_vec(rec).unwrap_or_default(),
            None,
        )];
        if let Some(o) = old {
            if rec.server.as_deref() != Some(o) {
                ops.push(TxnOp::delete(schema::placement_key(o, id), None));
            }
        }
        if let Some(s) = &rec.server {
            if old != Some(s.as_str()) {
                ops.push(TxnOp::put(
                    schema::placement_key(s, id),
                    serde_json::to_vec(&rec.doc).unwrap_or_default(),
                    None,
                ));
                ops.push(TxnOp::delete(schema::status_key(id), None));
            }
        }
        ops
    }

    /// Moves `moves` (tenant, new record) in transactions of up to 24 tenants; updates
    /// the view. Returns how many moved.
    async fn apply_moves(
        &self,
        view: &mut View,
        moves: Vec<(u32, TenantRecord)>,
    ) -> Result<usize, LeadError> {
        let mut done = 0;
        // At most 24 tenants and about 1 MiB of documents per transaction: etcd refuses
        // a request over 1.5 MiB, and a move writes a document twice (record and
        // placement).
        let mut chunks: Vec<&[(u32, TenantRecord)]> = Vec::new();
        let (mut start, mut bytes) = (0, 0);
        for (i, (_, rec)) in moves.iter().enumerate() {
            let size = 2 * rec.doc.to_string().len()
                + rec.previous.as_ref().map_or(0, |p| p.to_string().len());
            if i > start && (i - start == 24 || bytes + size > 1 << 20) {
                chunks.push(&moves[start..i]);
                (start, bytes) = (i, 0);
            }
            bytes += size;
        }
        if start < moves.len() {
            chunks.push(&moves[start..]);
        }
        for chunk in chunks {
            let mut compares = Vec::new();
            let mut ops = Vec::new();
            for (id, rec) in chunk {
                let Some((old, rev)) = view.tenants.get(id) else {
                    continue;
                };
                compares.push(Compare::mod_revision(
                    schema::tenant_key(*id),
                    CompareOp::Equal,
                    *rev,
                ));
                ops.extend(Self::move_ops(*id, old.server.as_deref(), rec));
            }
            let rev = match self.commit(compares, ops).await {
                Ok(r) => r,
                Err(LeadError::Conflict) => {
                    // The view is stale: reload it from etcd.
                    self.load(view).await?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            for (id, rec) in chunk {
                view.tenants.insert(*id, (rec.clone(), rev));
                done += 1;
            }
        }
        Ok(done)
    }

    /// Reads servers, tenants and statuses from etcd into `view`; returns the revision
    /// read at and the statuses stored, which it announces. It does not act on them: the
    /// leader does, with [`Self::act_on_stored`], when a term starts and after a broken
    /// watch.
    pub(crate) async fn load(
        &self,
        view: &mut View,
    ) -> Result<(i64, Vec<(u32, Status)>), LeadError> {
        let c = &self.client;
        let servers =
            schema::get_all(c, schema::SERVERS, Some(GetOptions::new().with_prefix())).await?;
        let rev = servers.header().map_or(0, |h| h.revision());
        let opts = || Some(GetOptions::new().with_prefix().with_revision(rev));
        let tenants = schema::get_all(c, schema::TENANTS, opts()).await?;
        let statuses = schema::get_all(c, schema::STATUS, opts()).await?;
        let drains = schema::get_all(c, schema::DRAINS, opts()).await?;
        view.drained = drains
            .kvs()
            .iter()
            .filter_map(|kv| schema::drained_of(kv.key()).map(str::to_owned))
            .collect();
        view.servers = servers
            .kvs()
            .iter()
            .filter_map(|kv| serde_json::from_slice::<ServerLoad>(kv.value()).ok())
            .map(|l| (l.server.clone(), l))
            .collect();
        view.tenants = tenants
            .kvs()
            .iter()
            .filter_map(|kv| {
                let id = schema::tenant_of(kv.key(), schema::TENANTS)?;
                let r = serde_json::from_slice::<TenantRecord>(kv.value()).ok()?;
                Some((id, (r, kv.mod_revision())))
            })
            .collect();
        let mut stored = Vec::new();
        for kv in statuses.kvs() {
            if let (Some(id), Ok(st)) = (
                schema::tenant_of(kv.key(), schema::STATUS),
                serde_json::from_slice::<Status>(kv.value()),
            ) {
                let _ = self.statuses.send((id, st.clone()));
                stored.push((id, st));
            }
        }
        Ok((rev, stored))
    }

    /// Acts on an Agent's status as its placement's outcome: a refused update is put
    /// back, a refused admission removed (or, for a moved tenant, left unplaced and placed
    /// elsewhere), and a tenant live again may go back to the servers that refused it.
    async fn act_on(&self, view: &mut View, id: u32, st: &Status) -> Result<(), LeadError> {
        // A refusal counts only while it answers the tenant's current placement: an older
        // one on the same server (the document was updated since, a retry with a changed
        // document among them) is left alone.
        if st.state == Outcome::Failed
            && self.placement_rev(&st.server, id).await? != Some(st.placement_rev)
        {
            return Ok(());
        }
        match (st.state, st.update) {
            (Outcome::Failed, true) => self.revert_update(view, id, st).await,
            (Outcome::Failed, false) => self.drop_failed(view, id, st).await,
            (Outcome::Live, _) => self.confirm_live(view, id, st).await,
        }
    }

    /// Acts on the statuses [`Self::load`] found as on statuses the watch sees: nobody
    /// may have acted on them. A refusal written while no Orchestrator led, before a
    /// leader that failed part-way could handle it, or while the watch was broken would
    /// otherwise leave its tenant placed on a server that does not serve it, for good
    /// (the Agent does not try a placement it refused again).
    async fn act_on_stored(
        &self,
        view: &mut View,
        stored: Vec<(u32, Status)>,
    ) -> Result<(), LeadError> {
        for (id, st) in stored {
            let Some((rec, _)) = view.tenants.get(&id) else {
                continue;
            };
            if rec.server.as_deref() != Some(st.server.as_str()) {
                continue;
            }
            match self.act_on(view, id, &st).await {
                // Changed meanwhile: whatever changed it decides.
                Err(LeadError::Conflict) => {}
                r => r?,
            }
        }
        Ok(())
    }

    /// The mod revision of tenant `id`'s placement on `server` (`None`: not placed
    /// there), which the Agent's status answers. It differs from the record's when only
    /// the record was rewritten since (the servers that refused it cleared once it is
    /// live, [`Self::confirm_live`]).
    async fn placement_rev(&self, server: &str, id: u32) -> Result<Option<i64>, LeadError> {
        let mut c = self.client.clone();
        let g = c.get(schema::placement_key(server, id), None).await?;
        Ok(g.kvs().first().map(|kv| kv.mod_revision()))
    }

    /// Re-places every tenant whose server is gone, and tries the unplaced ones.
    async fn place_orphans(&self, view: &mut View, dead: Option<&str>) -> Result<(), LeadError> {
        let t0 = Instant::now();
        let orphans: Vec<u32> = view
            .tenants
            .iter()
            .filter(|(_, (r, _))| match &r.server {
                Some(s) => !view.servers.contains_key(s),
                None => true,
            })
            .map(|(id, _)| *id)
            .collect();
        if orphans.is_empty() {
            return Ok(());
        }
        let mut cands = view.candidates();
        let mut moves = Vec::new();
        let mut unplaced = 0;
        for id in &orphans {
            let (rec, _) = &view.tenants[id];
            let mut new = rec.clone();
            // A tenant that was placed somewhere has been answered: whatever happens to
            // this placement, it is not removed (see `drop_failed`).
            new.moved |= rec.server.is_some();
            // The servers that refused it since it was last live are left out.
            if !cands.is_empty() && cands.iter().all(|c| rec.refused_by.contains(&c.id)) {
                // Every server refused it: it keeps its record and its reason until one
                // joins, or it is live again.
                unplaced += 1;
                if rec.server.is_some() {
                    new.server = None;
                    new.forget_update();
                    new.reason = Some(format!(
                        "every server refused it ({})",
                        rec.refused_by.join(", ")
                    ));
                    moves.push((*id, new));
                }
                continue;
            }
            match choose_for(&mut cands, rec) {
                Ok(i) => {
                    new.server = Some(cands[i].id.clone());
                    new.reason = None;
                    new.forget_update();
                }
                Err(e) => {
                    unplaced += 1;
                    new.server = None;
                    new.reason = Some(if rec.refused_by.is_empty() {
                        e.to_string()
                    } else {
                        format!("{e} (refused by {})", rec.refused_by.join(", "))
                    });
                    new.forget_update();
                    if rec.server.is_none() && rec.reason == new.reason {
                        continue;
                    }
                }
            }
            moves.push((*id, new));
        }
        let n = self.apply_moves(view, moves).await?;
        if let Some(d) = dead {
            let r = Replacement {
                server: d.to_owned(),
                replaced: n.saturating_sub(unplaced),
                unplaced,
                millis: t0.elapsed().as_secs_f64() * 1e3,
            };
            eprintln!(
                "buffet-orchestrator: server {d} is gone: re-placed {} tenants in {:.1} ms ({} fit nowhere)",
                r.replaced, r.millis, r.unplaced
            );
            self.replacements
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(r);
        }
        Ok(())
    }

    /// Moves the tenants of the drained servers to servers that fit them, each chosen
    /// as an admission would (drained servers and those that refused it are never
    /// chosen), once its server answered its placement live. One that fits nowhere
    /// stays where it is, served, and is tried again at the next second's tick; one
    /// refused where it went comes back ([`Self::move_back`]).
    async fn drain(&self, view: &mut View) -> Result<(), LeadError> {
        if view.drained.is_empty() {
            return Ok(());
        }
        let draining: Vec<u32> = view
            .tenants
            .iter()
            .filter(|(_, (r, _))| r.server.as_ref().is_some_and(|s| view.drained.contains(s)))
            .map(|(id, _)| *id)
            .collect();
        if draining.is_empty() {
            return Ok(());
        }
        let live = self.live_on(&view.drained).await?;
        let mut cands = view.candidates();
        let mut moves = Vec::new();
        let mut stay = 0;
        for id in &draining {
            let rec = &view.tenants[id].0;
            // Only a tenant its server runs as recorded: an admission, a move or an
            // update still being applied there is left to finish (its client waits for
            // that server's answer), and moves at a later tick.
            if !live.contains(id) {
                continue;
            }
            match choose_for(&mut cands, rec) {
                Ok(i) => {
                    let mut new = rec.clone();
                    // A refusal there puts it back where it is served (`move_back`).
                    new.moved_from = rec.server.clone();
                    new.previous = Some(rec.doc.clone());
                    new.server = Some(cands[i].id.clone());
                    new.reason = None;
                    new.moved = true;
                    moves.push((*id, new));
                }
                Err(_) => stay += 1,
            }
        }
        if moves.is_empty() {
            return Ok(());
        }
        let n = self.apply_moves(view, moves).await?;
        let servers: Vec<&str> = view.drained.iter().map(String::as_str).collect();
        eprintln!(
            "buffet-orchestrator: draining {}: moved {n} tenants ({stay} fit nowhere else and stay)",
            servers.join(", ")
        );
        Ok(())
    }

    /// The tenants live on one of `servers` with their current placement there: their
    /// status there answers the placement's revision.
    async fn live_on(&self, servers: &BTreeSet<String>) -> Result<BTreeSet<u32>, LeadError> {
        let c = &self.client;
        let st = schema::get_all(c, schema::STATUS, Some(GetOptions::new().with_prefix())).await?;
        let rev = st.header().map_or(0, |h| h.revision());
        let mut placed: HashMap<(String, u32), i64> = HashMap::new();
        for server in servers {
            let p = schema::keys_at(c, schema::placements_of(server), rev).await?;
            for kv in p.kvs() {
                if let Some(id) = schema::tenant_of(kv.key(), schema::PLACEMENTS) {
                    placed.insert((server.clone(), id), kv.mod_revision());
                }
            }
        }
        Ok(st
            .kvs()
            .iter()
            .filter_map(|kv| {
                let id = schema::tenant_of(kv.key(), schema::STATUS)?;
                let st: Status = serde_json::from_slice(kv.value()).ok()?;
                let current = placed.get(&(st.server.clone(), id)) == Some(&st.placement_rev);
                (st.state == Outcome::Live && current).then_some(id)
            })
            .collect())
    }

    /// Drains `server` (`on`) or ends its drain: written to etcd, then acted on. A drain
    /// needs the server registered; ending one that is not is a no-op. Returns how many
    /// tenants are still placed on it.
    pub(crate) async fn set_drain(&self, server: &str, on: bool) -> Result<usize, AdmitError> {
        let mut view = self.view.lock().await;
        if !self.is_leader() {
            return Err(AdmitError::NotLeader);
        }
        if on && !view.servers.contains_key(server) {
            self.load(&mut view).await.map_err(admit_error)?;
            if !view.servers.contains_key(server) {
                return Err(AdmitError::UnknownServer(server.to_owned()));
            }
        }
        let key = schema::drain_key(server);
        let op = if on {
            TxnOp::put(key, b"{}".to_vec(), None)
        } else {
            TxnOp::delete(key, None)
        };
        let rev = self
            .commit(Vec::new(), vec![op])
            .await
            .map_err(admit_error)?;
        view.drain_revs.insert(server.to_owned(), rev);
        if on {
            view.drained.insert(server.to_owned());
            self.drain(&mut view).await.map_err(admit_error)?;
        } else {
            view.drained.remove(server);
        }
        Ok(view
            .tenants
            .values()
            .filter(|(r, _)| r.server.as_deref() == Some(server))
            .count())
    }

    /// Moves the fewest tenants off `server` that clear its overload, or refuses new
    /// admissions when that cannot be done.
    async fn relieve(&self, view: &mut View, server: &str) -> Result<(), LeadError> {
        let Some(load) = view.servers.get(server).cloned() else {
            return Ok(());
        };
        let Some(reason) = load.overloaded.clone() else {
            return Ok(());
        };
        if view
            .last_relief
            .get(server)
            .is_some_and(|t| t.elapsed() < self.cfg.overload_cooldown)
        {
            return Ok(());
        }
        let mut cands = view.candidates();
        let Some(from) = cands.iter().position(|c| c.id == server) else {
            return Ok(());
        };
        let rates: Vec<(u32, f64, Vec<String>)> = view
            .tenants
            .iter()
            .filter(|(_, (r, _))| r.server.as_deref() == Some(server))
            .map(|(id, (r, _))| {
                (
                    *id,
                    load.tenant_pps.get(id).copied().unwrap_or(r.expected_pps),
                    r.nfs(),
                )
            })
            .collect();
        let excess = overload_excess(&load);
        match placement::relieve(&mut cands, from, &rates, excess) {
            Some(plan) => {
                let moves: Vec<(u32, TenantRecord)> = plan
                    .iter()
                    .map(|(id, target)| {
                        let mut r = view.tenants[id].0.clone();
                        r.server = Some(cands[*target].id.clone());
                        r.forget_update();
                        r.moved = true;
                        (*id, r)
                    })
                    .collect();
                let ids: Vec<u32> = moves.iter().map(|(id, _)| *id).collect();
                let n = self.apply_moves(view, moves).await?;
                // Left alone for the cooldown: the server's next reports still show the
                // load it had before its Agent removed the moved tenants.
                view.last_relief.insert(server.to_owned(), Instant::now());
                view.refusing = None;
                eprintln!(
                    "buffet-orchestrator: server {server} overloaded ({reason}): moved {n} tenants {ids:?} ({excess:.0} packets/s to clear)"
                );
            }
            None => {
                // Tried again at the server's next report: a server may join or free room.
                let why = format!(
                    "server {server} is overloaded ({reason}) and no other server has room \
                     for the {excess:.0} packets/s it must shed"
                );
                if view.refusing.is_none() {
                    eprintln!("buffet-orchestrator: refusing new tenants: {why}");
                }
                view.refusing = Some(why);
            }
        }
        Ok(())
    }

    /// Removes a tenant whose admission failed on the server it is placed on: the
    /// client that asked for it gets the refusal. A tenant that was moved there (off a
    /// dead or overloaded server) was answered long ago: it is left unplaced with the
    /// reason, and placed again on a server that has not refused it.
    async fn drop_failed(&self, view: &mut View, id: u32, st: &Status) -> Result<(), LeadError> {
        let Some((rec, rev)) = view.tenants.get(&id).cloned() else {
            return Ok(());
        };
        if rec.server.as_deref() != Some(st.server.as_str()) {
            return Ok(());
        }
        let why = st.reason.as_deref().unwrap_or("no reason given");
        if rec.moved_from.is_some() {
            return self.move_back(view, id, st).await;
        }
        if rec.moved {
            let mut new = rec;
            new.server = None;
            new.forget_update();
            new.reason = Some(format!("refused by {}: {why}", st.server));
            // A refusal that lasts (409: its rules overlap a tenant there; 422: the
            // server finds the document invalid) keeps the server out until the tenant
            // is live again or a tenant is removed there; a passing one (503: no room
            // now, and the like) does not, and it is tried again.
            let lasting = matches!(st.code, Some(409 | 422));
            if lasting && !new.refused_by.contains(&st.server) {
                new.refused_by.push(st.server.clone());
            }
            self.apply_moves(view, vec![(id, new)]).await?;
            eprintln!(
                "buffet-orchestrator: tenant {id} refused by {} after a move: {why}; left unplaced",
                st.server
            );
            // Placed elsewhere at once; after a passing refusal, at the next second's
            // tick (at once, it would go back to the same server as fast as it refuses).
            return if lasting {
                self.place_orphans(view, None).await
            } else {
                Ok(())
            };
        }
        self.commit(
            vec![Compare::mod_revision(
                schema::tenant_key(id),
                CompareOp::Equal,
                rev,
            )],
            vec![
                TxnOp::delete(schema::tenant_key(id), None),
                TxnOp::delete(schema::placement_key(&st.server, id), None),
            ],
        )
        .await?;
        view.tenants.remove(&id);
        eprintln!(
            "buffet-orchestrator: tenant {id} failed on {}: {}",
            st.server,
            st.reason.as_deref().unwrap_or("no reason given")
        );
        Ok(())
    }

    /// A tenant moved off a server it was served on (by an update whose chain that
    /// server does not run, or by a drain) was refused where it went: back to that
    /// server with the document it ran there, and the refusing server, for a refusal
    /// that lasts, not chosen for it again until it is live elsewhere. If that server is
    /// gone, it is left unplaced with the reason and placed as any orphan. Nothing unless
    /// the refusal answers the tenant's current placement.
    async fn move_back(&self, view: &mut View, id: u32, st: &Status) -> Result<(), LeadError> {
        let Some((rec, rev)) = view.tenants.get(&id).cloned() else {
            return Ok(());
        };
        if rec.server.as_deref() != Some(st.server.as_str()) || rev != st.placement_rev {
            return Ok(());
        }
        let (Some(from), Some(prev)) = (rec.moved_from.clone(), rec.previous.clone()) else {
            return Ok(());
        };
        let why = st.reason.as_deref().unwrap_or("no reason given");
        let mut back = TenantRecord {
            doc: prev,
            server: Some(from.clone()),
            reason: None,
            previous: None,
            moved_from: None,
            moved: true,
            ..rec
        };
        if matches!(st.code, Some(409 | 422)) && !back.refused_by.contains(&st.server) {
            back.refused_by.push(st.server.clone());
        }
        let gone = !view.servers.contains_key(&from);
        if gone {
            back.server = None;
            back.reason = Some(format!(
                "refused by {}: {why}; {from}, where it ran, is gone",
                st.server
            ));
        }
        self.apply_moves(view, vec![(id, back)]).await?;
        eprintln!(
            "buffet-orchestrator: tenant {id} refused by {} after a move off {from}: {why}; {}",
            st.server,
            if gone {
                "left unplaced (that server is gone)"
            } else {
                "back there with the document it ran"
            }
        );
        if gone {
            self.place_orphans(view, None).await?;
        }
        Ok(())
    }

    /// A tenant live again after servers refused it: they may be chosen for it again.
    async fn confirm_live(&self, view: &mut View, id: u32, st: &Status) -> Result<(), LeadError> {
        let Some((rec, rev)) = view.tenants.get(&id).cloned() else {
            return Ok(());
        };
        // Only for the placement the record still answers: an update written since then
        // (the record's revision moved) must find the record as it wrote it, to put the
        // previous document back if the server refuses it.
        if (rec.refused_by.is_empty() && rec.moved_from.is_none())
            || rec.server.as_deref() != Some(st.server.as_str())
            || rev != st.placement_rev
        {
            return Ok(());
        }
        let mut new = rec;
        // Except while its server drains: a tenant moved back there after a refusal
        // keeps the refusing servers out, or the drain would send it to them again.
        if !view.drained.contains(&st.server) {
            new.refused_by.clear();
        }
        // A move is decided: nothing goes back.
        if new.moved_from.is_some() {
            new.forget_update();
        }
        self.apply_moves(view, vec![(id, new)]).await.map(|_| ())
    }

    /// Admission (the leader's part): validates against the view, picks the server,
    /// writes record and placement in one transaction. Returns the server and the
    /// placement's revision.
    pub(crate) async fn place(
        &self,
        id: u32,
        doc: Value,
        expected_pps: f64,
    ) -> Result<(String, i64), AdmitError> {
        let mut view = self.view.lock().await;
        if !self.is_leader() {
            return Err(AdmitError::NotLeader);
        }
        if let Some((rec, rev)) = view.tenants.get(&id) {
            if rec.doc != doc || rec.expected_pps != expected_pps {
                return Err(AdmitError::Duplicate(id));
            }
            let Some(server) = rec.server.clone() else {
                return Err(AdmitError::Waiting(
                    id,
                    rec.reason
                        .clone()
                        .unwrap_or_else(|| "no reason recorded".into()),
                ));
            };
            // The retry waits for the status of the placement, which may be older than
            // the record.
            let rev = self
                .placement_rev(&server, id)
                .await
                .map_err(admit_error)?
                .unwrap_or(*rev);
            return Err(AdmitError::Exists(server, rev));
        }
        if let Some(r) = &view.refusing {
            return Err(AdmitError::Refusing(r.clone()));
        }
        let nfs = schema::doc_nfs(&doc);
        let need = placement::Need::new(expected_pps, &nfs);
        let mut cands = view.candidates();
        let i = match placement::choose(&cands, need) {
            Ok(i) => i,
            Err(_) => {
                // A server that registered a moment ago (one with room, or the only one
                // offering the chain's NFs) may not have reached the view through the
                // watch yet: read etcd itself before refusing.
                self.load(&mut view).await.map_err(admit_error)?;
                cands = view.candidates();
                placement::choose(&cands, need)?
            }
        };
        let server = cands[i].id.clone();
        let rec = TenantRecord {
            doc,
            expected_pps,
            server: Some(server.clone()),
            reason: None,
            previous: None,
            moved_from: None,
            moved: false,
            refused_by: Vec::new(),
        };
        let rev = self
            .commit(
                vec![Compare::version(
                    schema::tenant_key(id),
                    CompareOp::Equal,
                    0,
                )],
                Self::move_ops(id, None, &rec),
            )
            .await
            .map_err(|e| match e {
                LeadError::Conflict => AdmitError::Duplicate(id),
                LeadError::NotLeader => AdmitError::NotLeader,
                LeadError::Etcd(e) => AdmitError::Etcd(lease::describe(&e)),
            })?;
        view.tenants.insert(id, (rec, rev));
        Ok((server, rev))
    }

    /// Waits until the Agent of `server` answers the placement of revision `rev`.
    pub(crate) async fn wait_status(&self, id: u32, server: &str, rev: i64) -> Option<Status> {
        let mut rx = self.statuses.subscribe();
        let deadline = Instant::now() + self.cfg.admit_timeout;
        let matches = |st: &Status| st.server == server && st.placement_rev >= rev;
        let mut next_poll = Instant::now();
        loop {
            if Instant::now() >= next_poll {
                next_poll = Instant::now() + Duration::from_millis(1000);
                let mut c = self.client.clone();
                if let Ok(Ok(g)) = tokio::time::timeout(
                    Duration::from_secs(1),
                    c.get(schema::status_key(id), None),
                )
                .await
                {
                    if let Some(st) = g
                        .kvs()
                        .first()
                        .and_then(|kv| serde_json::from_slice::<Status>(kv.value()).ok())
                    {
                        if matches(&st) {
                            return Some(st);
                        }
                    }
                }
            }
            let until = next_poll.min(deadline);
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Ok((t, st))) if t == id && matches(&st) => return Some(st),
                Ok(Ok(_)) => {}
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => next_poll = Instant::now(),
                Ok(Err(broadcast::error::RecvError::Closed)) => return None,
                Err(_) if Instant::now() >= deadline => return None,
                Err(_) => {}
            }
        }
    }

    /// Cleans up after a failed admission or update (the waiter's side of
    /// [`Self::drop_failed`] and [`Self::revert_update`]).
    pub(crate) async fn forget_failed(&self, id: u32, st: &Status) {
        let mut view = self.view.lock().await;
        let _ = if st.update {
            self.revert_update(&mut view, id, st).await
        } else {
            self.drop_failed(&mut view, id, st).await
        };
    }

    /// The compares of a write that holds only while tenant `id`'s record is still at
    /// revision `rev` and its placement on `server` at `placed`.
    fn unchanged(id: u32, (rev, placed): (i64, i64), server: &str) -> Vec<Compare> {
        vec![
            Compare::mod_revision(schema::tenant_key(id), CompareOp::Equal, rev),
            Compare::mod_revision(schema::placement_key(server, id), CompareOp::Equal, placed),
        ]
    }

    /// Writes tenant `id`'s record and its document in `server`'s placement in one
    /// transaction, if the record is still at revision `rev` and the placement at
    /// `placed`; returns the new revision.
    async fn put_document(
        &self,
        id: u32,
        (rev, placed): (i64, i64),
        server: &str,
        rec: &TenantRecord,
    ) -> Result<i64, LeadError> {
        self.commit(
            Self::unchanged(id, (rev, placed), server),
            vec![
                TxnOp::put(
                    schema::tenant_key(id),
                    serde_json::to_vec(rec).unwrap_or_default(),
                    None,
                ),
                TxnOp::put(
                    schema::placement_key(server, id),
                    serde_json::to_vec(&rec.doc).unwrap_or_default(),
                    None,
                ),
            ],
        )
        .await
    }

    /// Puts back the document a server refused to update to (it still serves that one).
    /// Does nothing unless the refused placement is still the tenant's current one.
    async fn revert_update(&self, view: &mut View, id: u32, st: &Status) -> Result<(), LeadError> {
        let Some((rec, rev)) = view.tenants.get(&id).cloned() else {
            return Ok(());
        };
        if rec.server.as_deref() != Some(st.server.as_str()) || rev != st.placement_rev {
            return Ok(());
        }
        if rec.moved_from.is_some() {
            // Moved there, so what it ran is on the server it left (this server may hold
            // a tenant of that id from before and answer through its update path).
            return self.move_back(view, id, st).await;
        }
        let Some(prev) = rec.previous.clone() else {
            // Nothing to put back: the server refused the very document it ran (a restart
            // changed what it can run, and it kept the tenant without running it). Left
            // unplaced and placed elsewhere, as a tenant refused after a move.
            let unplace = TenantRecord { moved: true, ..rec };
            view.tenants.insert(id, (unplace, rev));
            return self.drop_failed(view, id, st).await;
        };
        let back = TenantRecord {
            doc: prev,
            previous: None,
            moved_from: None,
            ..rec
        };
        // Only over the refused placement: a revert never replaces a newer one.
        let new_rev = self
            .put_document(id, (rev, st.placement_rev), &st.server, &back)
            .await;
        match new_rev {
            Ok(r) => {
                view.tenants.insert(id, (back, r));
                eprintln!(
                    "buffet-orchestrator: update of tenant {id} refused by {}: {}; its previous document stays",
                    st.server,
                    st.reason.as_deref().unwrap_or("no reason given")
                );
                Ok(())
            }
            Err(LeadError::Conflict) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Update (the leader's part): replaces a placed tenant's document (and expected rate,
    /// when given) in its record and its placement, in one transaction; the server's
    /// Agent applies it through buffetd's update path. A document whose chain names an
    /// NF its server does not offer moves the tenant to a server that offers them all
    /// ([`Self::move_for`]). Returns the server and the placement's revision to wait for.
    pub(crate) async fn update(
        &self,
        id: u32,
        doc: Value,
        expected_pps: Option<f64>,
    ) -> Result<Updated, AdmitError> {
        let mut view = self.view.lock().await;
        if !self.is_leader() {
            return Err(AdmitError::NotLeader);
        }
        let (rec, rev) = view
            .tenants
            .get(&id)
            .cloned()
            .ok_or(AdmitError::Unknown(id))?;
        let Some(server) = rec.server.clone() else {
            return Err(AdmitError::Unplaced(
                id,
                rec.reason.unwrap_or_else(|| "no reason recorded".into()),
            ));
        };
        let expected_pps = expected_pps.unwrap_or(rec.expected_pps);
        if rec.doc == doc && rec.expected_pps == expected_pps {
            // Nothing to write: answered by the status of the placement as it is, whose
            // revision may be older than the record's.
            let placed = self.placement_rev(&server, id).await.map_err(admit_error)?;
            return Ok(Updated {
                server,
                rev: placed.unwrap_or(rev),
                moved_from: None,
            });
        }
        // The document to put back if the server refuses this one is the one it runs:
        // the record's only once the server answered its placement live. Before that
        // (an admission, a move, another update or a refused one's return still being
        // applied) the record's document may be one the server never ran.
        let applied = self.applied_rev(&server, id).await.map_err(admit_error)?;
        let Some(placed) = applied else {
            return Err(AdmitError::Busy(id, server));
        };
        let written = |e| match e {
            LeadError::Conflict => AdmitError::Changed(id),
            LeadError::NotLeader => AdmitError::NotLeader,
            LeadError::Etcd(e) => AdmitError::Etcd(lease::describe(&e)),
        };
        if let Some(to) = self
            .move_for(&mut view, &server, &doc, expected_pps)
            .await?
        {
            // Moved whole: its placement leaves `server` (whose Agent removes it) for
            // `to` (whose Agent admits it with the new document, from a fresh state), in
            // one transaction, only if neither record nor placement changed meanwhile.
            let new = TenantRecord {
                previous: Some(rec.doc.clone()),
                moved_from: Some(server.clone()),
                doc,
                expected_pps,
                server: Some(to.clone()),
                reason: None,
                ..rec
            };
            let new_rev = self
                .commit(
                    Self::unchanged(id, (rev, placed), &server),
                    Self::move_ops(id, Some(&server), &new),
                )
                .await
                .map_err(written)?;
            eprintln!(
                "buffet-orchestrator: update of tenant {id} moves it from {server} to {to}: \
                 {server} does not offer its new chain's NFs"
            );
            view.tenants.insert(id, (new, new_rev));
            return Ok(Updated {
                server: to,
                rev: new_rev,
                moved_from: Some(server),
            });
        }
        let new = TenantRecord {
            previous: Some(rec.doc.clone()),
            moved_from: None,
            doc,
            expected_pps,
            ..rec
        };
        let new_rev = self
            .put_document(id, (rev, placed), &server, &new)
            .await
            .map_err(written)?;
        view.tenants.insert(id, (new, new_rev));
        Ok(Updated {
            server,
            rev: new_rev,
            moved_from: None,
        })
    }

    /// Where an update of a tenant on `server` to `doc` must move it: `None` while
    /// `server` offers every NF of the document's chain (or is not in the view: gone,
    /// its tenants re-placed as orphans), else the server that fits it best among those
    /// that offer them. Refused as an admission would be when none does, or none has
    /// room (after reading the servers from etcd once, as an admission does).
    async fn move_for(
        &self,
        view: &mut View,
        server: &str,
        doc: &Value,
        expected_pps: f64,
    ) -> Result<Option<String>, AdmitError> {
        let nfs = schema::doc_nfs(doc);
        let lacking = |view: &View| {
            view.candidates()
                .iter()
                .any(|c| c.id == server && !c.offers(&nfs))
        };
        if !lacking(view) {
            return Ok(None);
        }
        let need = placement::Need::new(expected_pps, &nfs);
        let mut cands = view.candidates();
        if placement::choose(&cands, need).is_err() {
            self.load(view).await.map_err(admit_error)?;
            if !lacking(view) {
                return Ok(None);
            }
            cands = view.candidates();
        }
        let i = placement::choose(&cands, need)?;
        Ok(Some(cands[i].id.clone()))
    }

    /// The revision of tenant `id`'s placement on `server` once its Agent answered it
    /// live (the server runs the placed document); `None` while it is not answered, or
    /// was refused.
    async fn applied_rev(&self, server: &str, id: u32) -> Result<Option<i64>, LeadError> {
        let Some(placed) = self.placement_rev(server, id).await? else {
            return Ok(None);
        };
        let mut c = self.client.clone();
        let g = c.get(schema::status_key(id), None).await?;
        let live = g
            .kvs()
            .first()
            .and_then(|kv| serde_json::from_slice::<Status>(kv.value()).ok())
            .is_some_and(|st| {
                st.server == server && st.state == Outcome::Live && st.placement_rev == placed
            });
        Ok(live.then_some(placed))
    }

    /// Removes a tenant from the cluster.
    pub(crate) async fn remove(&self, id: u32) -> Result<(), AdmitError> {
        let mut view = self.view.lock().await;
        if !self.is_leader() {
            return Err(AdmitError::NotLeader);
        }
        let Some((rec, rev)) = view.tenants.get(&id).cloned() else {
            return Err(AdmitError::Unknown(id));
        };
        let mut ops = vec![
            TxnOp::delete(schema::tenant_key(id), None),
            TxnOp::delete(schema::status_key(id), None),
        ];
        if let Some(s) = &rec.server {
            ops.push(TxnOp::delete(schema::placement_key(s, id), None));
        }
        self.commit(
            vec![Compare::mod_revision(
                schema::tenant_key(id),
                CompareOp::Equal,
                rev,
            )],
            ops,
        )
        .await
        .map_err(admit_error)?;
        view.tenants.remove(&id);
        // The removal may end what made that server refuse other tenants (their rules
        // overlapped this one's): offer it to them again.
        if let Some(server) = &rec.server {
            for (r, _) in view.tenants.values_mut() {
                r.refused_by.retain(|s| s != server);
            }
        }
        Ok(())
    }
}

/// The server among `cands` that fits `rec` best, leaving out those that refused it
/// since it was last live; the tenant is booked on it.
fn choose_for(cands: &mut [Candidate], rec: &TenantRecord) -> Result<usize, PlaceError> {
    let allowed: Vec<usize> = (0..cands.len())
        .filter(|&i| !rec.refused_by.contains(&cands[i].id))
        .collect();
    let open: Vec<Candidate> = allowed.iter().map(|&i| cands[i].clone()).collect();
    let nfs = rec.nfs();
    let j = placement::choose(&open, placement::Need::new(rec.expected_pps, &nfs))?;
    placement::book(&mut cands[allowed[j]], rec.expected_pps);
    Ok(allowed[j])
}

/// What must leave an overloaded server, packets per second: its rate above 80 % of its
/// capacity, or the largest live worker's rate above its MAX_NB, whichever is larger
/// (at least one tenant moves).
pub fn overload_excess(l: &ServerLoad) -> f64 {
    let total = l.capacity_pps().map_or(0.0, |c| l.pps - 0.8 * c);
    let worker = l
        .workers
        .iter()
        .filter(|w| w.live)
        .map(|w| l.per_slot_to_pps(w.pkts_per_slot - l.worker_max_nb as f64))
        .fold(0.0, f64::max);
    total.max(worker).max(f64::MIN_POSITIVE)
}

/// A leader's error as the API's answer to an admission, update or removal.
fn admit_error(e: LeadError) -> AdmitError {
    match e {
        LeadError::NotLeader => AdmitError::NotLeader,
        LeadError::Etcd(e) => AdmitError::Etcd(lease::describe(&e)),
        e => AdmitError::Etcd(e.to_string()),
    }
}

/// Where an update was written ([`Shared::update`]).
#[derive(Debug)]
pub(crate) struct Updated {
    /// The server that applies it.
    pub(crate) server: String,
    /// The placement's revision its status answers.
    pub(crate) rev: i64,
    /// The server it left, when the update moved it.
    pub(crate) moved_from: Option<String>,
}

/// Why an admission was not placed.
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    /// Not the leader.
    #[error("this orchestrator is not the leader")]
    NotLeader,
    /// Another tenant (or another document) has this id.
    #[error("tenant {0} exists in the cluster with another document")]
    Duplicate(u32),
    /// The same document is recorded but placed on no server now (a retried request).
    #[error(
        "tenant {0} is recorded with this document but placed on no server now ({1}); \
         it is placed when a server can take it"
    )]
    Waiting(u32, String),
    /// The same document is already placed (a retried request).
    #[error("tenant already placed on {0}")]
    Exists(String, i64),
    /// Unknown tenant.
    #[error("tenant {0} is not in the cluster")]
    Unknown(u32),
    /// The tenant is recorded but placed on no server, so nothing can apply an update.
    #[error("tenant {0} is placed on no server now ({1}): nothing can apply an update")]
    Unplaced(u32, String),
    /// The tenant's record changed while the update was written (moved, or another update).
    #[error("tenant {0} changed meanwhile (moved or updated): retry")]
    Changed(u32),
    /// An update while the tenant's previous change (its admission, a move, another
    /// update, a refused update's return) is not applied on its server yet.
    #[error(
        "tenant {0} has an earlier change not yet applied on {1}: retry once \
         GET /v1/tenants/{0} shows it live"
    )]
    Busy(u32, String),
    /// The cluster refuses new tenants (overload).
    #[error("not admitting new tenants: {0}")]
    Refusing(String),
    /// No server fits.
    #[error(transparent)]
    Place(#[from] PlaceError),
    /// etcd failed.
    #[error("etcd: {0}")]
    Etcd(String),
    /// A drain of a server that is not registered.
    #[error("server {0:?} is not registered in the cluster")]
    UnknownServer(String),
}

/// A running Orchestrator.
pub struct Orchestrator {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Orchestrator {
    /// Connects to etcd (a clear error when unreachable), binds the API and starts
    /// campaigning. Call inside a tokio runtime.
    pub async fn start(cfg: Config) -> Result<Orchestrator, StartError> {
        if !(cfg.default_expected_pps.is_finite() && cfg.default_expected_pps >= 0.0) {
            return Err(StartError::Config(
                "--default-expected-pps must be a finite number >= 0".into(),
            ));
        }
        if cfg.admin_token.expose().len() < buffet_config::auth::MIN_TOKEN_LEN
            || cfg
                .reader_token
                .as_ref()
                .is_some_and(|r| r.expose().len() < buffet_config::auth::MIN_TOKEN_LEN)
        {
            return Err(StartError::Config(format!(
                "a token must be at least {} characters",
                buffet_config::auth::MIN_TOKEN_LEN
            )));
        }
        if cfg.lease_ttl < Duration::from_secs(1) {
            return Err(StartError::Config(
                "--lease-ttl must be at least 1 s".into(),
            ));
        }
        if cfg.header_read_timeout.is_zero() || cfg.body_timeout.is_zero() {
            return Err(StartError::Config(
                "--header-read-timeout and --body-timeout must be over 0".into(),
            ));
        }
        if cfg.max_connections == 0 {
            return Err(StartError::Config(
                "--max-connections must be at least 1".into(),
            ));
        }
        let client = lease::connect(&cfg.etcd, cfg.connect_timeout).await?;
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .map_err(|source| StartError::Listen {
                addr: cfg.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| StartError::Listen {
            addr: cfg.listen,
            source,
        })?;
        let me = cfg
            .advertise
            .clone()
            .unwrap_or_else(|| format!("http://{addr}"));
        let (statuses, _) = broadcast::channel(16384);
        let (cfg_admin, cfg_reader) = (cfg.admin_token.clone(), cfg.reader_token.clone());
        let shared = Arc::new(Shared {
            client,
            me,
            cfg,
            leader: RwLock::new(None),
            view: tokio::sync::Mutex::new(View::default()),
            statuses,
            replacements: Mutex::new(Vec::new()),
            admin: Auth::new(cfg_admin.expose(), []),
            reader: cfg_reader.map(|r| Auth::new(r.expose(), [])),
        });
        let (stop, stop_rx) = watch::channel(false);
        let setup = ConnSetup {
            router: serve::body_deadline(
                crate::api::router(shared.clone()),
                shared.cfg.body_timeout,
            ),
            header_read_timeout: shared.cfg.header_read_timeout,
            linger_bytes: crate::api::MAX_BODY,
        };
        // Never sent to: the Orchestrator's limits do not change while it runs.
        let (_, setup) = watch::channel(setup);
        let max_connections = shared.cfg.max_connections;
        let mut srv_stop = stop_rx.clone();
        let server = tokio::spawn(serve::serve(listener, setup, max_connections, async move {
            let _ = srv_stop.wait_for(|s| *s).await;
        }));
        let leader = tokio::spawn(campaign(shared.clone(), stop_rx));
        Ok(Orchestrator {
            addr,
            shared,
            stop,
            tasks: vec![server, leader],
        })
    }

    /// The API's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether this one leads now.
    pub fn is_leader(&self) -> bool {
        self.shared.is_leader()
    }

    /// Re-placements done while leading.
    pub fn replacements(&self) -> Vec<Replacement> {
        self.shared
            .replacements
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops: resigns (the other Orchestrator takes over at once) and ends the API.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
    }
}

async fn campaign(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    while !*stop.borrow() {
        if let Err(e) = campaign_once(&shared, &mut stop).await {
            eprintln!("buffet-orchestrator: election: {e}");
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = stop.changed() => {}
            }
        }
    }
}

async fn campaign_once(shared: &Shared, stop: &mut watch::Receiver<bool>) -> Result<(), LeadError> {
    let mut c = shared.client.clone();
    let ttl = shared.cfg.lease_ttl;
    let asked = Instant::now();
    let lease_id = c.lease_grant(ttl.as_secs() as i64, None).await?.id();
    let (mut held, keeper) = lease::hold(c.clone(), lease_id, ttl, asked);
    let won = tokio::select! {
        r = c.campaign(schema::ELECTION, shared.me.clone(), lease_id) => Some(r),
        _ = lease::lost(&mut held) => None,
        _ = lease::raised(stop) => None,
    };
    let key = match won {
        Some(Ok(r)) => r.leader().cloned(),
        Some(Err(e)) => {
            keeper.abort();
            let _ = c.lease_revoke(lease_id).await;
            return Err(e.into());
        }
        None => None,
    };
    let Some(key) = key else {
        keeper.abort();
        let _ = c.lease_revoke(lease_id).await;
        return Ok(());
    };
    eprintln!("buffet-orchestrator: leading ({})", shared.me);
    *shared
        .leader
        .write()
        .unwrap_or_else(PoisonError::into_inner) = Some(key);
    let r = lead(shared, &mut held, stop).await;
    *shared
        .leader
        .write()
        .unwrap_or_else(PoisonError::into_inner) = None;
    keeper.abort();
    // Resign by revoking the lease: the election key goes with it.
    let _ = tokio::time::timeout(Duration::from_secs(2), c.lease_revoke(lease_id)).await;
    eprintln!("buffet-orchestrator: no longer leading");
    r
}

async fn lead(
    shared: &Shared,
    held: &mut watch::Receiver<LeaseState>,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), LeadError> {
    let mut c = shared.client.clone();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        let rev = {
            let mut view = shared.view.lock().await;
            let (rev, stored) = shared.load(&mut view).await?;
            shared.act_on_stored(&mut view, stored).await?;
            shared.place_orphans(&mut view, None).await?;
            shared.drain(&mut view).await?;
            rev
        };
        let mut w = c
            .watch(
                schema::ROOT,
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(rev + 1),
                ),
            )
            .await?;
        loop {
            tokio::select! {
                m = w.message() => {
                    let resp = match m {
                        Ok(Some(r)) if !r.canceled() => r,
                        _ => break,
                    };
                    let mut view = shared.view.lock().await;
                    for ev in resp.events() {
                        let Some(kv) = ev.kv() else { continue };
                        let key = kv.key();
                        if let Some(server) = schema::server_of(key) {
                            let server = server.to_owned();
                            if ev.event_type() == EventType::Delete {
                                view.servers.remove(&server);
                                shared.place_orphans(&mut view, Some(&server)).await?;
                            } else if let Ok(l) = serde_json::from_slice::<ServerLoad>(kv.value()) {
                                let new = !view.servers.contains_key(&server);
                                view.servers.insert(server.clone(), l);
                                if new {
                                    shared.place_orphans(&mut view, None).await?;
                                }
                                if view.servers.values().all(|s| s.overloaded.is_none()) {
                                    view.refusing = None;
                                }
                                shared.relieve(&mut view, &server).await?;
                            }
                        } else if let Some(server) = schema::drained_of(key) {
                            // Written by this leader's API and acted on already (a drain
                            // and its end in quick succession must not drain again).
                            let seen = view.drain_revs.get(server).copied().unwrap_or(0);
                            if kv.mod_revision() <= seen {
                                continue;
                            }
                            if ev.event_type() == EventType::Delete {
                                view.drained.remove(server);
                            } else {
                                view.drained.insert(server.to_owned());
                                shared.drain(&mut view).await?;
                            }
                        } else if key.starts_with(schema::STATUS.as_bytes())
                            && ev.event_type() == EventType::Put
                        {
                            if let (Some(id), Ok(st)) = (
                                schema::tenant_of(key, schema::STATUS),
                                serde_json::from_slice::<Status>(kv.value()),
                            ) {
                                let _ = shared.statuses.send((id, st.clone()));
                                shared.act_on(&mut view, id, &st).await?;
                            }
                        }
                    }
                }
                _ = tick.tick() => {
                    let mut view = shared.view.lock().await;
                    shared.place_orphans(&mut view, None).await?;
                    shared.drain(&mut view).await?;
                }
                _ = lease::lost(held) => return Ok(()),
                _ = lease::raised(stop) => return Ok(()),
            }
            if !shared.is_leader() {
                return Ok(());
            }
        }
        // The watch broke (etcd restarted, or compaction): reload and watch again.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A drained server is a candidate that refuses every tenant, named as draining; an
    /// overloaded one names its overload.
    #[test]
    fn a_drained_server_is_chosen_for_no_tenant() {
        let mut view = View::default();
        for id in ["a", "b"] {
            view.servers.insert(
                id.into(),
                ServerLoad {
                    server: id.into(),
                    tenant_slots: 10,
                    ..ServerLoad::default()
                },
            );
        }
        view.drained.insert("a".into());
        let need = placement::Need::new(1.0, &[]);
        let c = view.candidates();
        assert_eq!(c[0].refusing.as_deref(), Some("draining"));
        assert_eq!(c[placement::choose(&c, need).unwrap()].id, "b");
        view.servers.get_mut("b").unwrap().overloaded = Some("worker 0 at MAX_NB".into());
        let e = placement::choose(&view.candidates(), need).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no server has room for 1 packets/s now: a: draining; b: overloaded (worker 0 at \
             MAX_NB)"
        );
    }
}
