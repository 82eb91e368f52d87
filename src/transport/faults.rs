//! Packet faults inside the QUIC socket layer: drop, duplicate, delay and
//! reorder a fraction of datagrams to or from chosen peers, cap a link's
//! bandwidth, or cut peers off (a partition) for a time window. QUIC's own
//! loss recovery then has to do its job, as it would on a bad network.
//!
//! A [`PacketFaults`] plan is data (serde), so a test can hand it to node
//! processes ([`PACKET_FAULTS_ENV`], `NIMBUS_PACKET_FAULTS`, JSON; with
//! `workers = true` a node passes it on to its worker processes). Every
//! decision is a pure function of the plan's seed and the datagram's
//! sequence number on its socket ([`PacketFaults::decide`]), so the same
//! seed makes the same decisions for the same traffic.
//!
//! - A rule applies to its `peers` (empty: every peer) from `from_ms` to
//!   `until_ms` after the socket opened; the first rule that matches a
//!   datagram's peer and time decides its fate.
//! - A bandwidth cap queues datagrams behind each other; past
//!   [`MAX_QUEUE_DELAY`] (200 ms) of queue they are dropped, as a router's
//!   full buffer would (drop-tail).
//! - Rules added at run time (`Endpoint::add_packet_rule`: a chaos
//!   partition or degraded link, through `AddPacketRule` to a node or the
//!   reserved message `nimbus.chaos.PacketRule` to a worker) go in front of
//!   the plan's rules, their window counting from when they are added, and
//!   expire on their own. A socket without a plan refuses them.
//! - The socket counts what it did (`FaultCounters`); the process reports
//!   the counts to the head (`crate::runtime` `packet_reports.rs`).

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use quinn::udp::{EcnCodepoint, RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use serde::{Deserialize, Serialize};

/// Environment variable a node reads a JSON [`PacketFaults`] plan from.
pub const PACKET_FAULTS_ENV: &str = "NIMBUS_PACKET_FAULTS";

/// A seeded plan of packet faults for one process's socket.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PacketFaults {
    /// Seeds every random decision.
    #[serde(default)]
    pub seed: u64,
    /// Rules; the first that matches a datagram's peer and time applies.
    pub rules: Vec<PacketRule>,
    /// Given to a node (`NIMBUS_PACKET_FAULTS`): apply it to the sockets of
    /// the node's worker processes too (times count from each socket's
    /// opening).
    #[serde(default)]
    pub workers: bool,
}

/// Faults for datagrams to and from some peers, during a time window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[serde(deny_unknown_fields)]
pub struct PacketRule {
    /// The peers it applies to; empty means every peer.
    pub peers: Vec<SocketAddr>,
    /// Milliseconds after the socket opened when the rule starts.
    pub from_ms: u64,
    /// Milliseconds after the socket opened when it ends (`None`: never).
    pub until_ms: Option<u64>,
    /// Cut the peers off entirely (a partition): nothing sent or received.
    pub partition: bool,
    /// Fraction of sent datagrams dropped.
    pub drop: f64,
    /// Fraction of sent datagrams sent twice.
    pub duplicate: f64,
    /// Fraction of sent datagrams held back and sent after the next one.
    pub reorder: f64,
    /// Fraction of sent datagrams delayed by `delay_ms`.
    pub delay: f64,
    /// The delay.
    pub delay_ms: u64,
    /// Cap the link to this many bytes per second (a slow link): datagrams
    /// queue behind each other and wait their turn; past
    /// [`MAX_QUEUE_DELAY`] of queue they are dropped, as a router's full
    /// buffer would.
    pub bandwidth_bytes_per_s: Option<u64>,
}

/// How much queueing a capped link holds before it drops.
pub const MAX_QUEUE_DELAY: Duration = Duration::from_millis(200);

/// What happens to one sent datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Sent as is.
    Send,
    /// Not sent.
    Drop,
    /// Sent twice.
    Duplicate,
    /// Held back and sent after the next datagram.
    Reorder,
    /// Sent after a delay.
    Delay(Duration),
}

impl PacketFaults {
    /// Reads a plan from [`PACKET_FAULTS_ENV`], if set.
    pub fn from_env() -> Result<Option<Self>, super::FaultPlanError> {
        super::FaultPlanError::read(PACKET_FAULTS_ENV, "a packet fault plan")
    }

    /// The fate of the `sequence`-th datagram sent to `peer`, `elapsed`
    /// after the socket opened.
    pub fn decide(&self, sequence: u64, peer: SocketAddr, elapsed: Duration) -> Fate {
        self.rule(peer, elapsed)
            .map_or(Fate::Send, |(_, rule)| rule.fate(self.seed, sequence))
    }

    /// Whether datagrams from `peer` are cut off at `elapsed`.
    pub fn partitioned(&self, peer: SocketAddr, elapsed: Duration) -> bool {
        self.rule(peer, elapsed).is_some_and(|(_, r)| r.partition)
    }

    /// The first rule that applies to `peer` at `elapsed`, and its index.
    fn rule(&self, peer: SocketAddr, elapsed: Duration) -> Option<(usize, &PacketRule)> {
        let ms = elapsed.as_millis() as u64;
        self.rules
            .iter()
            .enumerate()
            .find(|(_, rule)| rule.applies(peer, ms))
    }

    /// The first rule that can never apply, because an earlier one covers
    /// all its peers for all its window (the first match decides), as
    /// `(its index, the earlier rule's index)`.
    pub fn shadowed(&self) -> Option<(usize, usize)> {
        self.rules.iter().enumerate().find_map(|(later, rule)| {
            self.rules[..later]
                .iter()
                .position(|earlier| earlier.covers(rule))
                .map(|earlier| (later, earlier))
        })
    }
}

impl PacketRule {
    /// What the rule does, in the chaos timeline's words (`partition`,
    /// `drop=0.05`, `delay_ms=20`, `bandwidth=1000B/s`, ...).
    pub fn kinds(&self) -> Vec<String> {
        let mut kinds = Vec::new();
        if self.partition {
            kinds.push("partition".to_string());
        }
        for (name, fraction) in [
            ("drop", self.drop),
            ("duplicate", self.duplicate),
            ("reorder", self.reorder),
            ("delay", self.delay),
        ] {
            if fraction > 0.0 {
                kinds.push(format!("{name}={fraction}"));
            }
        }
        if self.delay > 0.0 {
            kinds.push(format!("delay_ms={}", self.delay_ms));
        }
        if let Some(rate) = self.bandwidth_bytes_per_s {
            kinds.push(format!("bandwidth={rate}B/s"));
        }
        kinds
    }

    /// Whether the rule applies to `peer` at `ms` after its socket opened.
    fn applies(&self, peer: SocketAddr, ms: u64) -> bool {
        (self.peers.is_empty() || self.peers.contains(&peer))
            && ms >= self.from_ms
            && self.until_ms.is_none_or(|until| ms < until)
    }

    /// Whether this rule applies wherever and whenever `other` would.
    fn covers(&self, other: &PacketRule) -> bool {
        let peers = self.peers.is_empty()
            || (!other.peers.is_empty() && other.peers.iter().all(|p| self.peers.contains(p)));
        let until = match (self.until_ms, other.until_ms) {
            (None, _) => true,
            (Some(mine), Some(theirs)) => theirs <= mine,
            (Some(_), None) => false,
        };
        peers && self.from_ms <= other.from_ms && until
    }

    /// What the rule does to the `sequence`-th datagram a socket sends.
    fn fate(&self, seed: u64, sequence: u64) -> Fate {
        if self.partition {
            return Fate::Drop;
        }
        let roll = unit(seed, sequence);
        let mut threshold = self.drop;
        if roll < threshold {
            return Fate::Drop;
        }
        threshold += self.duplicate;
        if roll < threshold {
            return Fate::Duplicate;
        }
        threshold += self.reorder;
        if roll < threshold {
            return Fate::Reorder;
        }
        threshold += self.delay;
        if roll < threshold {
            return Fate::Delay(Duration::from_millis(self.delay_ms));
        }
        Fate::Send
    }
}

/// A uniform number in [0, 1) from the seed and a sequence number
/// (SplitMix64), so decisions replay exactly.
fn unit(seed: u64, sequence: u64) -> f64 {
    let mut z = seed ^ sequence.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// Counts of the faults a socket injected.
#[derive(Debug, Default)]
pub struct FaultCounters {
    /// Datagrams sent through the socket.
    pub sent: AtomicU64,
    /// Dropped (partitions included).
    pub dropped: AtomicU64,
    /// Sent twice.
    pub duplicated: AtomicU64,
    /// Sent out of order.
    pub reordered: AtomicU64,
    /// Delayed (by a delay rule, or queued behind a bandwidth cap).
    pub delayed: AtomicU64,
    /// Received datagrams discarded by a partition.
    pub cut_off: AtomicU64,
    /// Datagrams each rule of the socket's plan faulted (dropped,
    /// duplicated, reordered, delayed or cut off), by the rule's index.
    pub rules: Vec<AtomicU64>,
}

/// The counters of a [`FaultCounters`] at one moment, to report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultCounts {
    /// Datagrams sent through the socket.
    pub sent: u64,
    /// Dropped (partitions included).
    pub dropped: u64,
    /// Sent twice.
    pub duplicated: u64,
    /// Sent out of order.
    pub reordered: u64,
    /// Delayed.
    pub delayed: u64,
    /// Received datagrams discarded by a partition.
    pub cut_off: u64,
}

impl FaultCounts {
    /// Datagrams some fault touched.
    pub fn faulted(&self) -> u64 {
        self.dropped + self.duplicated + self.reordered + self.delayed + self.cut_off
    }
}

impl std::ops::AddAssign for FaultCounts {
    fn add_assign(&mut self, other: FaultCounts) {
        self.sent += other.sent;
        self.dropped += other.dropped;
        self.duplicated += other.duplicated;
        self.reordered += other.reordered;
        self.delayed += other.delayed;
        self.cut_off += other.cut_off;
    }
}

impl fmt::Display for FaultCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sent={} dropped={} duplicated={} reordered={} delayed={} cut_off={}",
            self.sent, self.dropped, self.duplicated, self.reordered, self.delayed, self.cut_off
        )
    }
}

impl FaultCounters {
    /// Counters for a plan of `rules` rules.
    fn for_rules(rules: usize) -> Self {
        FaultCounters {
            rules: (0..rules).map(|_| AtomicU64::new(0)).collect(),
            ..FaultCounters::default()
        }
    }

    /// Datagrams each rule of the plan faulted, by the rule's index: zero
    /// for a rule that has not taken effect.
    pub fn rule_hits(&self) -> Vec<u64> {
        self.rules
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// The counters now.
    pub fn snapshot(&self) -> FaultCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        FaultCounts {
            sent: get(&self.sent),
            dropped: get(&self.dropped),
            duplicated: get(&self.duplicated),
            reordered: get(&self.reordered),
            delayed: get(&self.delayed),
            cut_off: get(&self.cut_off),
        }
    }
}

impl fmt::Display for FaultCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.snapshot().fmt(f)
    }
}

/// A UDP socket that applies a [`PacketFaults`] plan.
pub(crate) struct FaultySocket {
    inner: Arc<dyn AsyncUdpSocket>,
    plan: PacketFaults,
    /// Rules added at run time, newest first: they come before the plan's.
    /// Read for every datagram; written when a rule is added.
    added: RwLock<Vec<PacketRule>>,
    opened: Instant,
    sequence: AtomicU64,
    held: Mutex<Option<OwnedDatagram>>,
    counters: FaultCounters,
    /// When a capped link is next free to start a datagram.
    link_free: Mutex<Instant>,
}

/// A datagram copied out of a `Transmit`, to send later.
struct OwnedDatagram {
    destination: SocketAddr,
    ecn: Option<EcnCodepoint>,
    contents: Vec<u8>,
    src_ip: Option<IpAddr>,
}

impl OwnedDatagram {
    fn of(transmit: &Transmit<'_>) -> Self {
        OwnedDatagram {
            destination: transmit.destination,
            ecn: transmit.ecn,
            contents: transmit.contents.to_vec(),
            src_ip: transmit.src_ip,
        }
    }

    fn send(&self, socket: &dyn AsyncUdpSocket) -> io::Result<()> {
        socket.try_send(&Transmit {
            destination: self.destination,
            ecn: self.ecn,
            contents: &self.contents,
            segment_size: None,
            src_ip: self.src_ip,
        })
    }
}

impl FaultySocket {
    pub(crate) fn new(inner: Arc<dyn AsyncUdpSocket>, plan: PacketFaults) -> Self {
        FaultySocket {
            inner,
            counters: FaultCounters::for_rules(plan.rules.len()),
            plan,
            added: RwLock::new(Vec::new()),
            opened: Instant::now(),
            sequence: AtomicU64::new(0),
            held: Mutex::new(None),
            link_free: Mutex::new(Instant::now()),
        }
    }

    /// What the socket injected so far.
    pub(crate) fn counters(&self) -> &FaultCounters {
        &self.counters
    }

    /// Puts `rule` in front of the plan's rules, its window counted from
    /// now rather than from the socket's opening.
    pub(crate) fn add_rule(&self, mut rule: PacketRule) {
        let now = self.opened.elapsed().as_millis() as u64;
        rule.from_ms += now;
        rule.until_ms = rule.until_ms.map(|until| until + now);
        let mut added = self.added.write().unwrap_or_else(|e| e.into_inner());
        // Rules whose window has closed never match again.
        added.retain(|r| r.until_ms.is_none_or(|until| until > now));
        added.insert(0, rule);
    }

    /// `decide` applied to the rule that applies to `peer` at `elapsed`
    /// (one added at run time, else the plan's first match), with the
    /// plan rule's index (`None` for an added rule).
    fn with_rule<R>(
        &self,
        peer: SocketAddr,
        elapsed: Duration,
        decide: impl FnOnce(&PacketRule) -> R,
    ) -> Option<(Option<usize>, R)> {
        let ms = elapsed.as_millis() as u64;
        {
            let added = self.added.read().unwrap_or_else(|e| e.into_inner());
            if let Some(rule) = added.iter().find(|r| r.applies(peer, ms)) {
                return Some((None, decide(rule)));
            }
        }
        let (index, rule) = self.plan.rule(peer, elapsed)?;
        Some((Some(index), decide(rule)))
    }

    /// Counts a datagram that plan rule `rule` (if one) faulted.
    fn hit(&self, rule: Option<usize>) {
        if let Some(counter) = rule.and_then(|i| self.counters.rules.get(i)) {
            Self::count(counter);
        }
    }

    /// Sends `transmit` now, later (queued behind the bandwidth cap `rate`
    /// of plan rule `rule`), or drops it (the queue is full).
    fn send_shaped(
        &self,
        transmit: &Transmit,
        rate: Option<u64>,
        rule: Option<usize>,
    ) -> io::Result<()> {
        let Some(rate) = rate else {
            return self.inner.try_send(transmit);
        };
        let now = Instant::now();
        let wait = {
            let mut free = self.link_free.lock().unwrap_or_else(|e| e.into_inner());
            let start = (*free).max(now);
            let wait = start - now;
            if wait > MAX_QUEUE_DELAY {
                None
            } else {
                let bytes = transmit.contents.len() as f64;
                *free = start + Duration::from_secs_f64(bytes / rate.max(1) as f64);
                Some(wait)
            }
        };
        match wait {
            None => {
                Self::count(&self.counters.dropped);
                self.hit(rule);
                Ok(())
            }
            Some(wait) if wait.is_zero() => self.inner.try_send(transmit),
            Some(wait) => {
                Self::count(&self.counters.delayed);
                self.hit(rule);
                let datagram = OwnedDatagram::of(transmit);
                let socket = self.inner.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(wait).await;
                    let _ = datagram.send(socket.as_ref());
                });
                Ok(())
            }
        }
    }

    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

impl fmt::Debug for FaultySocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultySocket({:?}, {})", self.inner, self.counters)
    }
}

impl AsyncUdpSocket for FaultySocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        Self::count(&self.counters.sent);
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner()).take();
        let elapsed = self.opened.elapsed();
        let seed = self.plan.seed;
        let decided = self.with_rule(transmit.destination, elapsed, |rule| {
            (rule.fate(seed, sequence), rule.bandwidth_bytes_per_s)
        });
        let (rule, (fate, rate)) = decided.unwrap_or((None, (Fate::Send, None)));
        if fate != Fate::Send {
            self.hit(rule);
        }
        let result = match fate {
            Fate::Send => self.send_shaped(transmit, rate, rule),
            Fate::Drop => {
                Self::count(&self.counters.dropped);
                Ok(())
            }
            Fate::Duplicate => {
                Self::count(&self.counters.duplicated);
                let _ = self.inner.try_send(transmit);
                self.inner.try_send(transmit)
            }
            Fate::Reorder => {
                Self::count(&self.counters.reordered);
                *self.held.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(OwnedDatagram::of(transmit));
                Ok(())
            }
            Fate::Delay(delay) => {
                Self::count(&self.counters.delayed);
                let datagram = OwnedDatagram::of(transmit);
                let socket = self.inner.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _ = datagram.send(socket.as_ref());
                });
                Ok(())
            }
        };
        // A datagram held back for reordering goes out after this one.
        if let Some(held) = held {
            let _ = held.send(self.inner.as_ref());
        }
        result
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        loop {
            let received = match self.inner.poll_recv(cx, bufs, meta) {
                Poll::Ready(Ok(received)) => received,
                other => return other,
            };
            let elapsed = self.opened.elapsed();
            let mut kept = 0;
            for index in 0..received {
                let cut = self.with_rule(meta[index].addr, elapsed, |rule| rule.partition);
                if let Some((rule, true)) = cut {
                    Self::count(&self.counters.cut_off);
                    self.hit(rule);
                    continue;
                }
                if kept != index {
                    let len = meta[index].len;
                    let (to, from) = bufs.split_at_mut(index);
                    to[kept][..len].copy_from_slice(&from[0][..len]);
                    meta[kept] = meta[index];
                }
                kept += 1;
            }
            if kept > 0 {
                return Poll::Ready(Ok(kept));
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lossy(seed: u64) -> PacketFaults {
        PacketFaults {
            seed,
            workers: false,
            rules: vec![PacketRule {
                drop: 0.1,
                duplicate: 0.05,
                reorder: 0.05,
                delay: 0.05,
                delay_ms: 5,
                ..PacketRule::default()
            }],
        }
    }

    #[test]
    fn the_same_seed_makes_the_same_decisions() {
        let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let fates = |plan: &PacketFaults| -> Vec<Fate> {
            (0..1000)
                .map(|i| plan.decide(i, peer, Duration::ZERO))
                .collect()
        };
        assert_eq!(fates(&lossy(7)), fates(&lossy(7)));
        assert_ne!(fates(&lossy(7)), fates(&lossy(8)));
        let dropped = fates(&lossy(7))
            .iter()
            .filter(|f| **f == Fate::Drop)
            .count();
        assert!(
            (60..140).contains(&dropped),
            "about 10% dropped, got {dropped}"
        );
    }

    #[test]
    fn partitions_hold_for_their_window_and_peers_only() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let plan = PacketFaults {
            seed: 1,
            workers: false,
            rules: vec![PacketRule {
                peers: vec![a],
                from_ms: 100,
                until_ms: Some(200),
                partition: true,
                ..PacketRule::default()
            }],
        };
        let at = Duration::from_millis;
        assert!(!plan.partitioned(a, at(99)));
        assert!(plan.partitioned(a, at(100)));
        assert!(!plan.partitioned(b, at(150)));
        assert!(!plan.partitioned(a, at(200)));
        assert_eq!(plan.decide(0, a, at(150)), Fate::Drop);
    }

    #[test]
    fn a_rule_behind_one_that_covers_it_is_found() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let lossy = PacketRule {
            drop: 0.05,
            ..PacketRule::default()
        };
        let cut = PacketRule {
            from_ms: 1500,
            until_ms: Some(2500),
            partition: true,
            ..PacketRule::default()
        };
        let plan = |rules: Vec<PacketRule>| PacketFaults {
            seed: 1,
            workers: false,
            rules,
        };
        assert_eq!(
            plan(vec![lossy.clone(), cut.clone()]).shadowed(),
            Some((1, 0))
        );
        assert_eq!(plan(vec![cut.clone(), lossy.clone()]).shadowed(), None);
        let to_a = PacketRule {
            peers: vec![a],
            ..lossy.clone()
        };
        assert_eq!(plan(vec![to_a.clone(), cut.clone()]).shadowed(), None);
        assert_eq!(plan(vec![lossy, to_a]).shadowed(), Some((1, 0)));
    }
}
