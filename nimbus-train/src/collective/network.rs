//! The network backend: ring collectives between ranks that exchange
//! chunks through any ordered, reliable transport (between worker
//! processes, nimbus actor messages over QUIC), for groups that span hosts.
//!
//! Allreduce is the bandwidth-optimal ring: the buffer is cut into `n`
//! segments; in `n - 1` reduce-scatter steps each rank sends one segment to
//! the next rank and adds the one it receives from the previous; in `n - 1`
//! all-gather steps the reduced segments travel once around. Each segment is
//! summed at one rank in ring order and copied everywhere, so every rank
//! ends with the same bits. Broadcast pipelines the root's buffer around
//! the ring in chunks; barrier is an allreduce of one value.
//!
//! Chunks hold at most `MAX_CHUNK_VALUES` (1 Mi) values. Between training
//! workers each is a `CollectiveChunk` actor message to the next rank's
//! `TrainerWorker`, ordered per handle over QUIC; a worker buffers chunks
//! from its creation, since a peer may send before its own
//! `StartTraining` arrives. Every wait for a peer has the group's timeout;
//! an abort is a message into the same inbox ([`Delivery`]), so it ends a
//! wait at once.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{Collective, CollectiveError};

/// Largest chunk put in one message.
const MAX_CHUNK_VALUES: usize = 1 << 20;

/// A piece of a collective operation, from one rank to another.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Chunk {
    /// The sender's rank.
    pub from: usize,
    /// Sequence number of the message between this pair of ranks.
    pub seq: u64,
    /// Little-endian `f32` values.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// What reaches a rank: a chunk, or an abort.
#[derive(Debug)]
pub enum Delivery {
    /// A chunk from a peer.
    Chunk(Chunk),
    /// The group is aborted, with a reason.
    Abort(String),
}

/// Sends a chunk to a rank (in order, reliably, or fails).
pub type SendChunk = Box<dyn Fn(usize, Chunk) -> Result<(), LinkClosed> + Send>;

/// A chunk could not be handed over: the way to that rank is closed (its
/// inbox, or this worker's sender, is gone).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the link to rank {0} is closed")]
pub struct LinkClosed(pub usize);

/// One rank of a ring group.
pub struct NetworkGroup {
    rank: usize,
    world: usize,
    send: SendChunk,
    incoming: Receiver<Delivery>,
    sent: u64,
    received: u64,
    timeout: Duration,
    aborted: Option<String>,
}

impl NetworkGroup {
    /// Rank `rank` of `world`: `send` delivers to a peer, `incoming` yields
    /// what peers sent to this rank (and aborts, see [`Delivery`]);
    /// `timeout` bounds each wait for a peer.
    pub fn new(
        rank: usize,
        world: usize,
        send: SendChunk,
        incoming: Receiver<Delivery>,
        timeout: Duration,
    ) -> Result<Self, CollectiveError> {
        if world == 0 || rank >= world {
            return Err(CollectiveError::Setup(format!(
                "rank {rank} in a group of {world}"
            )));
        }
        Ok(NetworkGroup {
            rank,
            world,
            send,
            incoming,
            sent: 0,
            received: 0,
            timeout,
            aborted: None,
        })
    }

    /// A handle that aborts this group: `abort(sender, reason)` on the
    /// sending side of its `incoming` channel.
    pub fn abort(sender: &Sender<Delivery>, reason: &str) {
        let _ = sender.send(Delivery::Abort(reason.to_string()));
    }

    fn next(&self) -> usize {
        (self.rank + 1) % self.world
    }

    fn prev(&self) -> usize {
        (self.rank + self.world - 1) % self.world
    }

    fn send_to_next(&mut self, values: &[f32]) -> Result<(), CollectiveError> {
        if let Some(reason) = &self.aborted {
            return Err(CollectiveError::Aborted(reason.clone()));
        }
        for piece in values
            .chunks(MAX_CHUNK_VALUES)
            .chain(values.is_empty().then_some(&[][..]))
        {
            self.sent += 1;
            let chunk = Chunk {
                from: self.rank,
                seq: self.sent,
                data: piece.iter().flat_map(|v| v.to_le_bytes()).collect(),
            };
            (self.send)(self.next(), chunk).map_err(|e| {
                CollectiveError::Aborted(format!("cannot send to rank {}: {e}", self.next()))
            })?;
        }
        Ok(())
    }

    /// Receives `len` values from the previous rank into `out` (through
    /// `apply`, which adds or copies).
    fn receive_from_prev(
        &mut self,
        out: &mut [f32],
        apply: fn(&mut f32, f32),
    ) -> Result<(), CollectiveError> {
        let mut filled = 0;
        loop {
            if let Some(reason) = &self.aborted {
                return Err(CollectiveError::Aborted(reason.clone()));
            }
            let started = Instant::now();
            let chunk = match self.incoming.recv_timeout(self.timeout) {
                Ok(Delivery::Chunk(chunk)) => chunk,
                Ok(Delivery::Abort(reason)) => {
                    self.aborted = Some(reason.clone());
                    return Err(CollectiveError::Aborted(reason));
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(CollectiveError::Timeout {
                        after: started.elapsed(),
                        missing: vec![self.prev()],
                    })
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(CollectiveError::Aborted("the group's inbox closed".into()))
                }
            };
            self.received += 1;
            if chunk.from != self.prev() || chunk.seq != self.received {
                return Err(CollectiveError::Invalid(format!(
                    "rank {} expected message {} from rank {}, got message {} from rank {}",
                    self.rank,
                    self.received,
                    self.prev(),
                    chunk.seq,
                    chunk.from
                )));
            }
            let values = chunk
                .data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            let n = chunk.data.len() / 4;
            if filled + n > out.len() {
                return Err(CollectiveError::Invalid(format!(
                    "rank {} got {} values where {} were expected",
                    self.rank,
                    filled + n,
                    out.len()
                )));
            }
            for (o, v) in out[filled..filled + n].iter_mut().zip(values) {
                apply(o, v);
            }
            filled += n;
            if filled == out.len() && (n > 0 || out.is_empty()) {
                return Ok(());
            }
        }
    }

    fn ring_allreduce(
        &mut self,
        values: &mut [f32],
        scale: Option<f32>,
    ) -> Result<(), CollectiveError> {
        let n = self.world;
        if n == 1 {
            return Ok(());
        }
        let len = values.len();
        let bounds = |segment: usize| (len * segment / n, len * (segment + 1) / n);
        // Reduce-scatter: after step s, rank r holds the sum of s + 2 ranks'
        // values of segment (r - s - 1) mod n.
        for step in 0..n - 1 {
            let (a, b) = bounds((self.rank + n - step) % n);
            let outgoing = values[a..b].to_vec();
            self.send_to_next(&outgoing)?;
            let (c, d) = bounds((self.rank + 2 * n - step - 1) % n);
            self.receive_from_prev(&mut values[c..d], |o, v| *o += v)?;
        }
        // Rank r now owns the full sum of segment (r + 1) mod n.
        if let Some(scale) = scale {
            let (a, b) = bounds((self.rank + 1) % n);
            values[a..b].iter_mut().for_each(|v| *v *= scale);
        }
        for step in 0..n - 1 {
            let (a, b) = bounds((self.rank + 1 + n - step) % n);
            let outgoing = values[a..b].to_vec();
            self.send_to_next(&outgoing)?;
            let (c, d) = bounds((self.rank + n - step) % n);
            self.receive_from_prev(&mut values[c..d], |o, v| *o = v)?;
        }
        Ok(())
    }
}

impl Collective for NetworkGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn allreduce_mean(&mut self, values: &mut [f32]) -> Result<(), CollectiveError> {
        let scale = 1.0 / self.world as f32;
        self.ring_allreduce(values, Some(scale))
    }

    fn allreduce_sum(&mut self, values: &mut [f32]) -> Result<(), CollectiveError> {
        self.ring_allreduce(values, None)
    }

    fn broadcast(&mut self, values: &mut [f32], root: usize) -> Result<(), CollectiveError> {
        if root >= self.world {
            return Err(CollectiveError::Invalid(format!(
                "broadcast root {root} in a group of {}",
                self.world
            )));
        }
        if self.world == 1 {
            return Ok(());
        }
        // Chunk by chunk around the ring from the root; the rank before the
        // root does not forward.
        let last = (root + self.world - 1) % self.world;
        for chunk in values.chunks_mut(MAX_CHUNK_VALUES) {
            if self.rank != root {
                self.receive_from_prev(chunk, |o, v| *o = v)?;
            }
            if self.rank != last {
                self.send_to_next(chunk)?;
            }
        }
        Ok(())
    }

    fn barrier(&mut self) -> Result<(), CollectiveError> {
        self.ring_allreduce(&mut [0.0], None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    /// `world` ranks on threads, wired by channels.
    fn ring(world: usize) -> Vec<(NetworkGroup, Sender<Delivery>)> {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..world).map(|_| channel()).unzip();
        receivers
            .into_iter()
            .enumerate()
            .map(|(rank, incoming)| {
                let peers = senders.clone();
                let send: SendChunk = Box::new(move |to, chunk| {
                    peers[to]
                        .send(Delivery::Chunk(chunk))
                        .map_err(|_| LinkClosed(to))
                });
                let group =
                    NetworkGroup::new(rank, world, send, incoming, Duration::from_secs(5)).unwrap();
                (group, senders[rank].clone())
            })
            .collect()
    }

    #[test]
    fn ring_allreduce_and_broadcast_agree_on_every_rank() {
        for world in [2, 3, 5] {
            let threads: Vec<_> = ring(world)
                .into_iter()
                .map(|(mut group, _)| {
                    std::thread::spawn(move || {
                        let rank = group.rank();
                        let mut values: Vec<f32> =
                            (0..11).map(|i| (i * (rank + 1)) as f32).collect();
                        group.allreduce_sum(&mut values).unwrap();
                        let mut root = vec![rank as f32; 3];
                        group.broadcast(&mut root, 1).unwrap();
                        group.barrier().unwrap();
                        (values, root)
                    })
                })
                .collect();
            let triangle = (world * (world + 1) / 2) as f32;
            for thread in threads {
                let (values, root) = thread.join().unwrap();
                let expected: Vec<f32> = (0..11).map(|i| i as f32 * triangle).collect();
                assert_eq!(values, expected, "world {world}");
                assert_eq!(root, vec![1.0; 3]);
            }
        }
    }

    #[test]
    fn a_silent_peer_times_out_and_abort_interrupts() {
        let mut ranks = ring(2);
        let (mut group, inbox) = ranks.remove(0);
        group.timeout = Duration::from_millis(50);
        let err = group.allreduce_sum(&mut [1.0, 2.0]).unwrap_err();
        assert!(
            matches!(err, CollectiveError::Timeout { ref missing, .. } if missing == &vec![1]),
            "{err}"
        );
        NetworkGroup::abort(&inbox, "peer died");
        assert_eq!(
            group.barrier().unwrap_err(),
            CollectiveError::Aborted("peer died".into())
        );
    }
}
