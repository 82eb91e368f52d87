//! The head's control plane: the actors that run on the head node only and
//! answer the membership, event and directory requests of the control
//! protocol ([`crate::cluster`]), and the [`ActorRescheduler`] that restarts
//! actors lost with their node elsewhere.
//!
//! - [`Membership`]: the node table and failure detector (its decisions are
//!   the pure [`membership::NodeTable`], time passed in).
//! - [`ClusterEvents`]: numbered events, subscriptions, long polls.
//! - [`Directory`]: actor ids and names to node, worker and incarnation;
//!   actor deaths, restarts elsewhere.
//! - [`ActorRescheduler`]: places an actor lost with its node on another
//!   node (through [`crate::launch`]).
//! - [`state::LibraryState`]: libraries' durable records, by library, job
//!   and key.
//! - [`store::HeadStore`]: what the head keeps across its restarts
//!   (credentials, epoch, node records), in `$NIMBUS_HOME/head.redb`.
//!
//! `HeadActors` bundles their addresses for the node service, and answers
//! each head subsystem's requests with that subsystem's reply type
//! (`requests/`: `answer_membership`, `answer_events`, `answer_directory`,
//! `answer_faults`, `answer_jobs`, `answer_state`); the node service only authorizes and
//! routes.
//!
//! Architecture invariant: no sockets of their own; requests reach these
//! actors through the node service, which decodes them, and the rescheduler
//! reaches nodes only through [`crate::launch`].

pub mod demands;
pub mod directory;
pub mod events;
pub mod graveyard;
pub mod jobs;
pub mod membership;
mod requests;
mod rescheduler;
pub mod runs;
pub mod state;
pub mod store;
pub mod tasks;

use std::time::Duration;

use actix::Addr;

pub use directory::Directory;
pub use events::ClusterEvents;
pub use membership::Membership;
pub(crate) use requests::unavailable;
pub use rescheduler::{ActorRescheduler, NotPlaced, RESCHEDULE_DEADLINE};

/// The control-plane actors, on the head only.
#[derive(Clone)]
pub struct HeadActors {
    /// Node membership.
    pub membership: Addr<Membership>,
    /// The event stream.
    pub events: Addr<ClusterEvents>,
    /// The actor directory.
    pub directory: Addr<Directory>,
    /// The heartbeat interval members are told to keep.
    pub heartbeat_interval: Duration,
    /// Jobs and their drivers.
    pub jobs: Addr<jobs::Jobs>,
    /// Libraries' durable records.
    pub state: Addr<state::LibraryState>,
    /// The head's ticket keys, certifying nodes as they join and renew.
    pub tickets: std::sync::Arc<crate::transport::TicketAuthority>,
    /// Its store, which keeps a rotation of the ticket key.
    pub store: store::HeadStore,
}
