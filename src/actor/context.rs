//! What a process needs to reach actors: set once, by
//! [`Driver::connect`](crate::driver::Driver::connect) in a driver or by
//! the worker runtime in a worker process.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use actix::{Actor, Addr};

use super::registry::HostedActor;

use crate::client::{self, ClientError};
use crate::cluster::{ActorId, BinaryId, ControlReply, ControlRequest};
use crate::transport::{Connection, Endpoint, RequestOptions};

use super::Registry;

/// This process's link to the cluster.
pub struct ProcessContext {
    /// The process's QUIC endpoint.
    pub endpoint: Endpoint,
    /// The head's address.
    pub head: SocketAddr,
    /// The actor and message types this program knows.
    pub registry: Arc<Registry>,
    /// The job actors spawned from here belong to.
    pub job: String,
    /// This program's binary, shipped to nodes that run its actors.
    pub binary: (PathBuf, BinaryId),
    local: Mutex<HashMap<ActorId, HostedActor>>,
}

static CONTEXT: OnceLock<ProcessContext> = OnceLock::new();

impl ProcessContext {
    /// A context; see [`install`](Self::install).
    pub fn new(
        endpoint: Endpoint,
        head: SocketAddr,
        registry: Arc<Registry>,
        job: String,
        binary: (PathBuf, BinaryId),
    ) -> Self {
        ProcessContext {
            endpoint,
            head,
            registry,
            job,
            binary,
            local: Mutex::new(HashMap::new()),
        }
    }

    /// Makes `context` this process's; false if one was installed already.
    pub fn install(context: ProcessContext) -> bool {
        CONTEXT.set(context).is_ok()
    }

    /// This process's context, once installed.
    pub fn current() -> Option<&'static ProcessContext> {
        CONTEXT.get()
    }

    /// A connection to the head.
    pub async fn head(&self) -> Result<Connection, ClientError> {
        Ok(self.endpoint.connect(self.head, None).await?)
    }

    /// Sends a control request to the head.
    pub async fn call_head(&self, request: &ControlRequest) -> Result<ControlReply, ClientError> {
        let head = self.head().await?;
        client::call(&head, request, RequestOptions::control()).await
    }

    /// Records that `actor` runs in this process, so calls from here skip
    /// serialization.
    pub fn host_locally(&self, actor: ActorId, hosted: HostedActor) {
        self.lock().insert(actor, hosted);
    }

    /// The address of `actor` if it runs in this process as an `A`.
    pub fn local<A: Actor>(&self, actor: ActorId) -> Option<Addr<A>> {
        self.lock().get(&actor)?.addr::<A>().cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ActorId, HostedActor>> {
        self.local.lock().unwrap_or_else(|e| e.into_inner())
    }
}
