//! The node's request handler: decodes control requests and routes them to
//! the actors that answer them.
//!
//! - `Workers`, `Bundles`, `Binaries` go to this node's `NodeManager`,
//!   `Objects` to its object store, `AddPacketRule` to its own endpoint's
//!   socket; `Echo` is answered here.
//! - `RunDriver`, `StopDriver`, `ReadJobLog` go to this node's
//!   `DriverRunner` (`drivers.rs`), `EndJob` to its `NodeManager`.
//! - `Membership`, `Events`, `Directory`, the fault reports and the other
//!   job requests go to the head's actors (`HeadActors`, which check and
//!   answer them: `crate::head`'s `requests/`), and are refused with
//!   `BadRequest` on any other node.
//! - Every request is first checked against the caller's proven identity
//!   (`authorize.rs`). A `Join` is accepted only from a token holder joining
//!   as the identity it connected with, and answered with its node ticket
//!   for the certificate it connected with (`crate::transport`'s
//!   `tickets.rs`, step 2).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use actix::Addr;
use futures::future::BoxFuture;
use futures::FutureExt;

use crate::cluster::{
    BinaryReply, BinaryRequest, BundleReply, BundleRequest, ControlReply, ControlRequest,
    FaultReply, FaultRequest, JobReply, JobRequest, WorkerReply, WorkerRequest,
};
use crate::head::{unavailable, HeadActors};
use crate::metrics::ProcessMetrics;
use crate::transport::{Caller, Endpoint, HandlerError, RequestHandler};
use crate::wire::{self, PeerRole, RemoteError, RemoteErrorKind};

use super::authorize::{authorize, Confinement};

use crate::object_store::NodeObjectStore;

use super::drivers::{DriverRunner, ReadJobLog, RunDriver, StopDriver};
use super::manager::{
    EndJob, KillActor, ListBundles, NodeManager, ReadBinary, ReadLog, ReadNodeLog, ReadOutput,
    ReleaseBundle, RenewWorkerTicket, ReserveBundle, StartActor, UploadBinary,
};

/// Routes requests arriving at a node.
#[derive(Clone)]
pub struct NodeService {
    manager: Addr<NodeManager>,
    drivers: Addr<DriverRunner>,
    head: Option<HeadActors>,
    objects: NodeObjectStore,
    endpoint: Endpoint,
    metrics: Arc<Mutex<ProcessMetrics>>,
}

impl NodeService {
    /// The service of a node; `head` is `Some` on the head.
    /// `endpoint` is the node's own (packet rules are added to its socket).
    pub fn new(
        manager: Addr<NodeManager>,
        drivers: Addr<DriverRunner>,
        head: Option<HeadActors>,
        objects: NodeObjectStore,
        endpoint: Endpoint,
        metrics: Arc<Mutex<ProcessMetrics>>,
    ) -> Self {
        NodeService {
            manager,
            drivers,
            head,
            objects,
            endpoint,
            metrics,
        }
    }

    /// The one dispatcher: routes each subsystem's requests to the actors
    /// that answer them; head-only subsystems are refused elsewhere.
    async fn dispatch(
        &self,
        from: Caller,
        request: ControlRequest,
    ) -> Result<ControlReply, RemoteError> {
        authorize(&from, &request)?;
        match request {
            ControlRequest::Echo(echo) => Ok(ControlReply::Echo(echo)),
            ControlRequest::Objects(request) => {
                let confined = from.worker_scope().map(|scope| scope.job.as_str());
                let objects = &self.objects;
                reply(objects.handle(request, confined, from.certificate).await)
            }
            ControlRequest::Workers(request) => reply(self.workers(&from, request).await),
            ControlRequest::Bundles(request) => reply(self.bundles(&from, request).await),
            ControlRequest::Binaries(request) => reply(self.binaries(from, request).await),
            ControlRequest::Jobs(JobRequest::EndJob { job }) => {
                self.manager.send(EndJob(job)).await.map_err(unavailable)?;
                reply(Ok(JobReply::Ack))
            }
            ControlRequest::Jobs(JobRequest::RunDriver {
                job,
                submission,
                head,
            }) => {
                let run = RunDriver {
                    job,
                    submission,
                    head,
                };
                reply(self.drivers.send(run).await.map_err(unavailable)?)
            }
            ControlRequest::Jobs(JobRequest::StopDriver { job }) => reply(
                self.drivers
                    .send(StopDriver(job))
                    .await
                    .map_err(unavailable)?,
            ),
            ControlRequest::Jobs(JobRequest::ReadJobLog { job, offset, max }) => {
                let read = ReadJobLog { job, offset, max };
                reply(
                    self.drivers
                        .send(read)
                        .await
                        .map_err(unavailable)?
                        .map(JobReply::Log),
                )
            }
            ControlRequest::Faults(FaultRequest::AddPacketRule(rule)) => {
                self.endpoint
                    .add_packet_rule(rule)
                    .map_err(|e| RemoteError::new(RemoteErrorKind::BadRequest, e.to_string()))?;
                reply(Ok(FaultReply::Ack))
            }
            request => {
                let head = self.head.clone().ok_or_else(|| {
                    RemoteError::new(
                        RemoteErrorKind::BadRequest,
                        "this node is not the head; send membership, event, directory and \
                         fault-report requests to the head",
                    )
                })?;
                match request {
                    ControlRequest::Membership(request) => {
                        reply(head.answer_membership(from, request).await)
                    }
                    ControlRequest::Events(request) => reply(head.answer_events(request).await),
                    ControlRequest::Directory(request) => {
                        reply(head.answer_directory(from, request).await)
                    }
                    ControlRequest::Faults(request) => reply(head.answer_faults(request).await),
                    ControlRequest::Jobs(request) => reply(head.answer_jobs(from, request).await),
                    ControlRequest::State(request) => reply(head.answer_state(request).await),
                    _ => Err(RemoteError::new(
                        RemoteErrorKind::Internal,
                        "a node request reached the head's dispatcher",
                    )),
                }
            }
        }
    }

    async fn workers(
        &self,
        from: &Caller,
        request: WorkerRequest,
    ) -> Result<WorkerReply, RemoteError> {
        match request {
            WorkerRequest::PushMetrics { process, text } => {
                let key = match from.certified_as(PeerRole::Worker) {
                    true => from.peer.to_string(),
                    false => format!("declared {process}"),
                };
                let mut metrics = self.metrics.lock().map_err(|_| {
                    RemoteError::new(RemoteErrorKind::Internal, "the metrics table is poisoned")
                })?;
                metrics
                    .push(&key, &text, Instant::now())
                    .map_err(|e| RemoteError::new(RemoteErrorKind::BadRequest, e.to_string()))?;
                Ok(WorkerReply::Ack)
            }
            WorkerRequest::StartActor(spec) => self
                .manager
                .send(StartActor(spec))
                .await
                .map_err(unavailable)?,
            WorkerRequest::ReadOutput { job, after, max } => self
                .manager
                .send(ReadOutput { job, after, max })
                .await
                .map_err(unavailable),
            WorkerRequest::ReadNodeLog { offset, max } => self
                .manager
                .send(ReadNodeLog { offset, max })
                .await
                .map_err(unavailable)?
                .map(WorkerReply::Log),
            WorkerRequest::ReadLog {
                actor,
                stderr,
                offset,
                max,
            } => self
                .manager
                .send(ReadLog {
                    actor,
                    confined: Confinement::of(from),
                    stderr,
                    offset,
                    max,
                })
                .await
                .map_err(unavailable)?
                .map(WorkerReply::Log),
            WorkerRequest::RenewTicket => {
                let (Some(scope), true) =
                    (from.worker_scope(), from.certified_as(PeerRole::Worker))
                else {
                    return Err(RemoteError::new(
                        RemoteErrorKind::Forbidden,
                        format!("{from} holds no worker ticket to renew"),
                    ));
                };
                let renew = RenewWorkerTicket {
                    worker: from.peer.identity.clone(),
                    certificate: from.certificate,
                    scope: scope.clone(),
                };
                let ticket = self.manager.send(renew).await.map_err(unavailable)?;
                ticket
                    .map(|(ticket, head_keys)| WorkerReply::Renewed { ticket, head_keys })
                    .map_err(|e| RemoteError::new(RemoteErrorKind::Forbidden, e.to_string()))
            }
            WorkerRequest::KillActor(actor) => {
                let kill = KillActor {
                    actor,
                    confined: Confinement::of(from),
                };
                self.manager.send(kill).await.map_err(unavailable)??;
                Ok(WorkerReply::Ack)
            }
        }
    }

    async fn bundles(
        &self,
        from: &Caller,
        request: BundleRequest,
    ) -> Result<BundleReply, RemoteError> {
        match request {
            BundleRequest::ReserveBundle {
                bundle,
                resources,
                job,
            } => {
                let reserve = ReserveBundle {
                    bundle,
                    resources,
                    job,
                };
                Ok(
                    match self.manager.send(reserve).await.map_err(unavailable)? {
                        Ok(()) => BundleReply::Ack,
                        Err(short) => BundleReply::NoCapacity(short.to_string()),
                    },
                )
            }
            BundleRequest::ListBundles => Ok(BundleReply::Bundles(
                self.manager.send(ListBundles).await.map_err(unavailable)?,
            )),
            BundleRequest::ReleaseBundle(bundle) => {
                let release = ReleaseBundle {
                    bundle,
                    confined: Confinement::of(from),
                };
                self.manager.send(release).await.map_err(unavailable)??;
                Ok(BundleReply::Ack)
            }
        }
    }

    async fn binaries(
        &self,
        from: Caller,
        request: BinaryRequest,
    ) -> Result<BinaryReply, RemoteError> {
        match request {
            BinaryRequest::ReadBinary { hash, offset, len } => self
                .manager
                .send(ReadBinary { hash, offset, len })
                .await
                .map_err(unavailable)?,
            BinaryRequest::UploadBinary {
                hash,
                offset,
                total,
                chunk,
            } => {
                let upload = UploadBinary {
                    uploader: from.peer.to_string(),
                    hash,
                    offset,
                    total,
                    chunk,
                };
                self.manager.send(upload).await.map_err(unavailable)??;
                Ok(BinaryReply::Ack)
            }
        }
    }
}

impl RequestHandler for NodeService {
    fn handle(
        &self,
        from: Caller,
        body: Vec<u8>,
    ) -> BoxFuture<'static, Result<Vec<u8>, HandlerError>> {
        let request: ControlRequest = match wire::decode(&body) {
            Ok(request) => request,
            Err(e) => {
                return futures::future::ready(Err(HandlerError::Malformed(e.to_string()))).boxed()
            }
        };
        let service = self.clone();
        async move {
            let reply = service.dispatch(from, request).await?;
            rmp_serde::to_vec_named(&reply).map_err(|e| {
                HandlerError::Remote(RemoteError::new(RemoteErrorKind::Internal, e.to_string()))
            })
        }
        .boxed()
    }
}

/// A subsystem's reply, as the control reply that carries it.
fn reply(
    answer: Result<impl Into<ControlReply>, RemoteError>,
) -> Result<ControlReply, RemoteError> {
    answer.map(Into::into)
}
