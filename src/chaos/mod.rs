//! The fault-injection harness: seeded plans of node, actor, packet and
//! training faults run against a [`LocalCluster`], with a timeline of what
//! was injected and what recovered (the helpers for tests that use it are
//! in [`crate::testing`]).
//!
//! A plan is data, written with a builder or in TOML:
//!
//! ```toml
//! seed = 7
//! [[faults]]
//! at_ms = 500
//! action = { kill_node = { node = "random" } }
//! [[faults]]
//! at_ms = 4000
//! action = { restart_node = { node = "random" } }
//! ```
//!
//! `nimbus chaos run PLAN -- COMMAND` (or `chaos::run` / `run_while` in tests)
//! starts a local cluster, hands each rule to the layer that injects it,
//! runs the workload, and prints the timeline (`timeline.rs`). A run in
//! which a planned fault never took effect (its message count or training
//! step never came, its packet rule faulted no datagram, its clock never
//! started), could not be injected, or whose recovery did not come fails,
//! naming it ([`Timeline::missed`]), even if the workload succeeded. Timed
//! faults count from the start of the run, or with `clock =
//! "first_actor"` from the first actor the workload starts. The faults,
//! their triggers, and where each is hooked in:
//!
//! - **Node** SIGKILL, SIGSTOP for a duration (the node process and its
//!   workers; SIGCONT after), restart (same name and port, a new
//!   incarnation): at a planned time after the start, target by name or
//!   `"random"` (a non-head node, from the seed); `run.rs`, directly on the
//!   `LocalCluster`'s processes.
//! - **Actor** kill (SIGKILL of its worker), handler panic, or its node
//!   killed (`kill_node`: the worker reports the fault to the head, then
//!   SIGKILLs its node process; refused on the head), at the actor's N-th
//!   message (of a type): rules of `crate::cluster::faults`, from
//!   `NIMBUS_ACTOR_FAULTS` through the node managers into the boot message
//!   of the actor's first incarnation; counted and fired by the worker's
//!   `crate::actor` host before dispatch.
//! - **Actor** kill by name, or of every actor of a type (`type:TYPE`), at
//!   a planned time: the head names the actors (`LookupName`,
//!   `ListActors`), `/proc` finds their workers (local clusters run every
//!   worker on this machine). **Actor panic** by name or type: the reserved
//!   message `nimbus.chaos.Panic` to the worker, whose host panics with the
//!   plan's reason (`chaos: panic at after=Tms of NAME`).
//! - **Partition** between named sets of nodes, or their links **degraded**
//!   (drop, duplicate, reorder, delay, bandwidth cap), for a duration, at a
//!   planned time (in the timeline when every process has added its rule;
//!   healed `for_ms` after that): a packet rule added in front of each socket's rules,
//!   naming the other side's addresses (node processes, and the workers of
//!   live actors on those nodes), which expires on its own;
//!   `AddPacketRule` to node processes, the reserved message
//!   `nimbus.chaos.PacketRule` to workers. A plan with such faults gives
//!   every node and worker socket a (possibly empty) packet plan
//!   (`NIMBUS_PACKET_FAULTS`, `workers = true`). Workers started during the
//!   window are not cut.
//! - **Packets**: drop, duplicate, reorder, delay; partition from all
//!   peers; bandwidth cap (queue, then drop-tail past 200 ms), in a time
//!   window since the socket opened (`crate::transport::faults`; the first
//!   rule that matches decides, so a rule behind one that covers it is
//!   refused; each socket counts the datagrams each rule faulted):
//!   `packet_faults` go on the workload (every call it makes),
//!   `node_packet_faults` on every node process, and with `workers = true`
//!   on their worker processes (actor calls, network collectives).
//! - **Training**: kill, panic, kill the worker's node (as for actors),
//!   kill the head for a while (`kill_head { down_ms }`: the worker only
//!   reports it; `run.rs` SIGKILLs the head when the report's event
//!   arrives and starts it again `down_ms` later, from its store),
//!   straggler (a delay per step), hang inside the collective; checkpoint
//!   write failing (ENOSPC, EACCES), torn (killed mid-write), corrupted
//!   after writing: at a training step (the report index being worked on,
//!   continuing across restarts), each rule once per run;
//!   `training_faults` → `NIMBUS_TRAINING_FAULTS` on the workload →
//!   `Trainer::fit` → each rank's `Assignment`; fired by the training
//!   context (`crate::train::faults`).
//!
//! What replays and what does not: the same seed and plan inject the same
//! faults at the same triggers ([`ChaosPlan::resolve`]): random targets and
//! packet decisions are pure functions of the seed (and, for packets, of
//! the datagram's sequence number on its socket); message counts and
//! training steps are counted by the code that injects. Wall-clock times
//! are not reproduced: timed node faults land wherever the workload has got
//! to by then, threads and libtorch are not simulated, and the network's
//! own timing differs, so what a workload *observes* (which call fails with
//! what) can differ between runs. Training runs on CPU are bit-exact
//! whatever the faults, because every restart resumes from a checkpoint and
//! replays the same steps.
//!
//! Files: `plan.rs` (the plan: builder or TOML, and resolving `"random"`
//! targets), `links.rs` (partitions and degraded links), `effects.rs` (which planned faults never took effect), `run.rs` (injecting it into a `LocalCluster`, optionally
//! while a workload runs, and observing recoveries), `timeline.rs`.
//!
//! Faults never outlive the run: stopped nodes are resumed (even when the
//! run fails), every process the run started is killed with its cluster,
//! packet rules live only in the workload process (and, for partitions and
//! degraded links, in each cut process's socket, with a window that closes
//! on its own), and training rules only in the run's first assignments.

mod effects;
mod links;
mod plan;
mod run;
mod timeline;

pub use plan::{ChaosPlan, Clock, FaultAction, NodeTarget, PlanError, PlannedFault, ResolvedFault};
pub use run::{run, run_while, ChaosError};
pub use timeline::{Timeline, TimelineEntry};

#[cfg(doc)]
use crate::local::LocalCluster;
