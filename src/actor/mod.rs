//! User actors across the cluster: register actor and message types, spawn
//! actors into worker processes on any node, call them through typed
//! handles, find them by name, watch them die.
//!
//! Files: `spawn.rs` (`SpawnOptions`, names, placement on a node; starting
//! it there is `crate::launch`'s), `handle.rs` (the typed `ActorHandle`,
//! its outbox and delivery task, error diagnosis), `monitor.rs` (death
//! notifications), `host.rs` (the worker side of calls), `messages.rs`
//! (`ActorCall`), `faults.rs` (a hosted actor's fault rules), `error.rs`.
//! The registry and process context it re-exports live in
//! `crate::runtime`.
//!
//! ```no_run
//! # use actix::prelude::*;
//! # use serde::{Deserialize, Serialize};
//! # use nimbus::actor::{RemoteActor, RemoteMessage};
//! # struct Counter(i64);
//! # impl Actor for Counter { type Context = Context<Self>; }
//! # impl RemoteActor for Counter { const NAME: &'static str = "Counter"; type Args = i64; fn from_args(n: i64) -> Self { Counter(n) } }
//! # #[derive(Message, Serialize, Deserialize)] #[rtype(result = "i64")] struct Add(i64);
//! # impl RemoteMessage for Add { const NAME: &'static str = "Add"; }
//! # impl Handler<Add> for Counter { type Result = i64; fn handle(&mut self, m: Add, _: &mut Context<Self>) -> i64 { self.0 += m.0; self.0 } }
//! fn main() -> anyhow::Result<()> {
//!     let registry = nimbus::actor::Registry::new().actor::<Counter>().message::<Counter, Add>();
//!     // In a worker process, `init` hosts the actor and never returns.
//!     let driver = nimbus::init(registry)?;
//!     actix_rt::System::new().block_on(async {
//!         driver.connect().await?;
//!         let options = nimbus::actor::SpawnOptions::default().name("counter");
//!         let counter = nimbus::actor::spawn::<Counter>(0, options).await?;
//!         assert_eq!(counter.send(Add(2)).await?, 2);
//!         Ok(())
//!     })
//! }
//! ```

mod error;
pub mod faults;
mod handle;
mod host;
mod messages;
mod monitor;
mod spawn;

pub use crate::launch::{LaunchError, Strategy};
pub use crate::runtime::boot::{this_worker, ThisWorker};
pub use crate::runtime::{
    DispatchError, HostedActor, ProcessContext, Registration, Registry, RemoteActor, RemoteMessage,
    Wire,
};
pub use error::{CallError, SpawnError};
pub use handle::{ActorHandle, DEFAULT_MAX_IN_FLIGHT, KILL_WAIT, NO_DEADLINE};
pub use host::{ActorAccess, ActorHost, HostedFaults, KillNode};
pub use messages::ActorCall;
pub use monitor::{monitor, next_death, ActorDied};
pub use spawn::{spawn, SpawnOptions};

pub(crate) use handle::worker_name;

use crate::cluster::{DirectoryReply, DirectoryRequest};

/// The live actor named `name`, from any process of the cluster.
pub async fn get_actor<A: RemoteActor>(name: &str) -> Result<Option<ActorHandle<A>>, CallError> {
    let context = ProcessContext::current().ok_or(CallError::NotInitialized)?;
    match context
        .call_head(DirectoryRequest::LookupName(name.to_string()))
        .await?
    {
        DirectoryReply::Actor(Some(record)) if record.type_name == A::NAME => {
            Ok(Some(ActorHandle::new(record.actor, DEFAULT_MAX_IN_FLIGHT)))
        }
        DirectoryReply::Actor(Some(record)) => Err(CallError::Decode {
            actor: record.actor,
            detail: format!(
                "actor {name:?} is a {}, not a {}",
                record.type_name,
                A::NAME
            ),
        }),
        _ => Ok(None),
    }
}
