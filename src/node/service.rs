//! The node's request handler: decodes control requests and routes them to
//! the actors that answer them.
//!
//! - `Workers`, `Bundles`, `Binaries` go to this node's `NodeManager`,
//!   `Objects` to its object store, `AddPacketRule` to its own endpoint's
//!   socket; `Echo` is answered here.
//! - `RunDriver`, `StopDriver`, `ReadJobLog` go to this node's
//!   `DriverRunner` (`drivers.rs`), `EndJob` to its `NodeManager`.
//! - `Membership`, `Events`, `Directory`, the fault reports and the other
//!   job requests go to the head's actors (`HeadActors`), and are refused
//!   with `BadRequest` on any other node. An events long poll waits at most `MAX_EVENT_WAIT` (60 s)
//!   per request. A `ReportFault` that kills a node (`kills_node`) first
//!   tells the directory (`NodeDoomed`), so the actors lost with that node
//!   carry the fault in their death cause; every fault or recovery report
//!   is then published as a cluster event.
//! - Every request is first checked against the caller's proven identity
//!   (`authorize.rs`). A `Join` is accepted only from a token holder joining
//!   as the identity it connected with, and answered with its node ticket
//!   for the certificate it connected with (`crate::transport`'s
//!   `tickets.rs`, step 2).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::Addr;
use futures::future::BoxFuture;
use futures::FutureExt;

use crate::cluster::faults::FiredFault;
use crate::cluster::{
    BinaryReply, BinaryRequest, BundleReply, BundleRequest, DirectoryReply, DirectoryRequest,
    EventReply, EventRequest, FaultReply, FaultRequest, JobReply, JobRequest, MembershipReply,
    MembershipRequest, WorkerReply, WorkerRequest,
};
use crate::cluster::{ClusterEventKind, ControlReply, ControlRequest, MAX_REQUESTED_BUNDLES};
use crate::head::demands::Waiter;
use crate::head::events::{EventsSince, LastSeq, Publish};
use crate::head::{directory, jobs, membership, HeadActors};
use crate::metrics::ProcessMetrics;
use crate::transport::{Caller, Endpoint, HandlerError, RequestHandler};
use crate::wire::{self, PeerRole, RemoteError, RemoteErrorKind};

use super::authorize::{authorize, Confinement};

use crate::object_store::NodeObjectStore;

use super::drivers::{DriverRunner, ReadJobLog, RunDriver, StopDriver};
use super::manager::{
    EndJob, KillActor, ListBundles, NodeManager, ReadBinary, ReadLog, ReadNodeLog, ReadOutput,
    ReleaseBundle, ReserveBundle, StartActor, UploadBinary,
};

/// Longest a client may long-poll for events in one request.
const MAX_EVENT_WAIT: Duration = Duration::from_secs(60);
/// Longest a waiting spawn is listed without saying it still waits.
const MAX_DEMAND_WAIT: Duration = Duration::from_secs(3600);
/// The most bundles of a waiting placement group the head keeps (the
/// demand table stays bounded whatever a creator sends).
const MAX_GROUP_BUNDLES: usize = 1024;

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
                self.manager.send(EndJob(job)).await.map_err(internal)?;
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
                reply(self.drivers.send(run).await.map_err(internal)?)
            }
            ControlRequest::Jobs(JobRequest::StopDriver { job }) => {
                reply(self.drivers.send(StopDriver(job)).await.map_err(internal)?)
            }
            ControlRequest::Jobs(JobRequest::ReadJobLog { job, offset, max }) => {
                let read = ReadJobLog { job, offset, max };
                reply(
                    self.drivers
                        .send(read)
                        .await
                        .map_err(internal)?
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
                        reply(membership_request(&head, from, request).await)
                    }
                    ControlRequest::Events(EventRequest::Events { after, wait_ms }) => {
                        let wait = Duration::from_millis(wait_ms).min(MAX_EVENT_WAIT);
                        let since = head
                            .events
                            .send(EventsSince { after, wait })
                            .await
                            .map_err(internal)?;
                        reply(Ok(EventReply::Events(since)))
                    }
                    ControlRequest::Events(EventRequest::LastSeq) => {
                        let last = head.events.send(LastSeq).await.map_err(internal)?;
                        reply(Ok(EventReply::LastSeq(last)))
                    }
                    ControlRequest::Directory(request) => {
                        reply(directory_request(&head, from, request).await)
                    }
                    ControlRequest::Faults(request) => reply(fault_report(&head, request).await),
                    ControlRequest::Jobs(request) => reply(job_request(&head, from, request).await),
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
                .map_err(internal)?,
            WorkerRequest::ReadOutput { job, after, max } => self
                .manager
                .send(ReadOutput { job, after, max })
                .await
                .map_err(internal),
            WorkerRequest::ReadNodeLog { offset, max } => self
                .manager
                .send(ReadNodeLog { offset, max })
                .await
                .map_err(internal)?
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
                .map_err(internal)?
                .map(WorkerReply::Log),
            WorkerRequest::KillActor(actor) => {
                let kill = KillActor {
                    actor,
                    confined: Confinement::of(from),
                };
                self.manager.send(kill).await.map_err(internal)??;
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
                Ok(match self.manager.send(reserve).await.map_err(internal)? {
                    Ok(()) => BundleReply::Ack,
                    Err(short) => BundleReply::NoCapacity(short.to_string()),
                })
            }
            BundleRequest::ListBundles => Ok(BundleReply::Bundles(
                self.manager.send(ListBundles).await.map_err(internal)?,
            )),
            BundleRequest::ReleaseBundle(bundle) => {
                let release = ReleaseBundle {
                    bundle,
                    confined: Confinement::of(from),
                };
                self.manager.send(release).await.map_err(internal)??;
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
                .map_err(internal)?,
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
                self.manager.send(upload).await.map_err(internal)??;
                Ok(BinaryReply::Ack)
            }
        }
    }
}

/// Job requests, on the head (`crate::head::jobs`).
async fn job_request(
    head: &HeadActors,
    from: Caller,
    request: JobRequest,
) -> Result<JobReply, RemoteError> {
    let refused = |e: jobs::JobError| RemoteError::new(RemoteErrorKind::BadRequest, e.to_string());
    let jobs = &head.jobs;
    match request {
        JobRequest::DriverAlive {
            job,
            entrypoint,
            versions,
        } => {
            if !crate::cluster::valid_job_id(&job) {
                return Err(RemoteError::new(
                    RemoteErrorKind::BadRequest,
                    format!("job id {job:?} is malformed: 1 to {} letters, digits, '-' or '_' (NIMBUS_JOB_ID)", crate::cluster::MAX_JOB_ID),
                ));
            }
            let entrypoint = crate::cluster::bounded_text(entrypoint);
            let alive = jobs
                .send(jobs::DriverAlive {
                    job: job.clone(),
                    entrypoint,
                    versions: versions.map(crate::cluster::Versions::bounded),
                })
                .await
                .map_err(internal)?;
            match alive {
                true => Ok(JobReply::Ack),
                false => Err(RemoteError::new(
                    RemoteErrorKind::BadRequest,
                    format!("job {job} has ended (nimbus job status {job} says why), and its actors were killed"),
                )),
            }
        }
        JobRequest::DriverDone { job, ok } => {
            jobs.send(jobs::DriverDone { job, ok })
                .await
                .map_err(internal)?;
            Ok(JobReply::Ack)
        }
        JobRequest::SubmitJob(submission) => {
            let record = jobs
                .send(jobs::Submit(submission))
                .await
                .map_err(internal)?
                .map_err(refused)?;
            Ok(JobReply::Job(Box::new(record)))
        }
        JobRequest::StopJob { job } => {
            let record = jobs
                .send(jobs::Stop(job))
                .await
                .map_err(internal)?
                .map_err(refused)?;
            Ok(JobReply::Job(Box::new(record)))
        }
        JobRequest::ListJobs => Ok(JobReply::Jobs(
            jobs.send(jobs::List).await.map_err(internal)?,
        )),
        JobRequest::TaskStates(records) => {
            if records.len() > crate::cluster::MAX_TASK_STATES {
                return Err(RemoteError::new(
                    RemoteErrorKind::BadRequest,
                    format!(
                        "{} task states in one report; at most {}",
                        records.len(),
                        crate::cluster::MAX_TASK_STATES
                    ),
                ));
            }
            jobs.send(jobs::TaskStates(records))
                .await
                .map_err(internal)?;
            Ok(JobReply::Ack)
        }
        JobRequest::ListTasks => {
            let mut tasks = jobs.send(jobs::ListTasks).await.map_err(internal)?;
            // A worker sees its own job's tasks only: their ids are their
            // result objects' (`authorize.rs`).
            if let Some(scope) = from.worker_scope() {
                tasks.retain(|task| task.job == scope.job);
            }
            Ok(JobReply::Tasks(tasks))
        }
        JobRequest::RunEvents { run, events } => {
            if events.len() > crate::cluster::MAX_RUN_EVENTS {
                return Err(RemoteError::new(
                    RemoteErrorKind::BadRequest,
                    format!(
                        "{} run events in one report; at most {}",
                        events.len(),
                        crate::cluster::MAX_RUN_EVENTS
                    ),
                ));
            }
            jobs.send(jobs::RunEvents(run, events))
                .await
                .map_err(internal)?;
            Ok(JobReply::Ack)
        }
        JobRequest::ListRuns => Ok(JobReply::Runs(
            jobs.send(jobs::ListRuns).await.map_err(internal)?,
        )),
        JobRequest::GetRun { run } => Ok(JobReply::Run(
            jobs.send(jobs::GetRun(run))
                .await
                .map_err(internal)?
                .map(Box::new),
        )),
        JobRequest::DriverExited { job, exit } => {
            let exited = jobs::Exited {
                job,
                node: from.peer.identity.name.clone(),
                exit,
            };
            jobs.send(exited)
                .await
                .map_err(internal)?
                .map_err(refused)?;
            Ok(JobReply::Ack)
        }
        JobRequest::EndJob { .. }
        | JobRequest::RunDriver { .. }
        | JobRequest::StopDriver { .. }
        | JobRequest::ReadJobLog { .. } => Err(RemoteError::new(
            RemoteErrorKind::Internal,
            "a node's job request reached the head's dispatcher",
        )),
    }
}

/// Membership requests, on the head.
async fn membership_request(
    head: &HeadActors,
    from: Caller,
    request: MembershipRequest,
) -> Result<MembershipReply, RemoteError> {
    let membership = &head.membership;
    match request {
        MembershipRequest::Join {
            registration,
            signs_workers,
        } => {
            if from.peer.role != PeerRole::Node || from.peer.identity != registration.node {
                return Err(RemoteError::new(
                    RemoteErrorKind::BadRequest,
                    format!("{from} cannot join as {}", registration.node),
                ));
            }
            let node = registration.node.clone();
            let join = membership::Join {
                registration,
                head: false,
            };
            match membership.send(join).await.map_err(internal)? {
                Ok(()) => Ok(MembershipReply::Joined {
                    heartbeat_interval_ms: head.heartbeat_interval.as_millis() as u64,
                    ticket: head
                        .tickets
                        .certify_node(&node, from.certificate, &signs_workers),
                    head_key: head.tickets.public_key(),
                }),
                Err(membership::MembershipError::NameTaken {
                    holder,
                    address,
                    retry_after,
                    ..
                }) => Ok(MembershipReply::NodeNameTaken {
                    holder,
                    address,
                    retry_after_ms: retry_after.map(|d| d.as_millis() as u64),
                }),
                Err(e) => Err(e.into()),
            }
        }
        MembershipRequest::Heartbeat { node, used, host } => {
            membership
                .send(membership::Heartbeat { node, used, host })
                .await
                .map_err(internal)??;
            Ok(MembershipReply::Ack)
        }
        MembershipRequest::Leave { node } => {
            membership
                .send(membership::Leave { node })
                .await
                .map_err(internal)??;
            Ok(MembershipReply::Ack)
        }
        MembershipRequest::Status => {
            let status = membership
                .send(membership::Status)
                .await
                .map_err(internal)?;
            Ok(MembershipReply::Status(status))
        }
        MembershipRequest::Autoscaler(report) => {
            membership.do_send(membership::Report(report));
            Ok(MembershipReply::Ack)
        }
        MembershipRequest::RequestResources { bundles } => {
            if bundles.len() > MAX_REQUESTED_BUNDLES {
                return Err(RemoteError::new(
                    RemoteErrorKind::BadRequest,
                    format!(
                        "{from} requested {} bundles; at most {MAX_REQUESTED_BUNDLES} are kept",
                        bundles.len()
                    ),
                ));
            }
            if let Some((index, e)) = bundles
                .iter()
                .enumerate()
                .find_map(|(i, b)| b.validate().err().map(|e| (i, e)))
            {
                return Err(RemoteError::new(
                    RemoteErrorKind::BadRequest,
                    format!("{from} requested bundle {index}: {e}"),
                ));
            }
            membership.do_send(membership::Request(bundles));
            Ok(MembershipReply::Ack)
        }
    }
}

/// Directory requests, on the head.
async fn directory_request(
    head: &HeadActors,
    from: Caller,
    request: DirectoryRequest,
) -> Result<DirectoryReply, RemoteError> {
    let directory = &head.directory;
    match request {
        DirectoryRequest::ReserveName { name, actor } => {
            let reserved = directory
                .send(directory::ReserveName { name, actor })
                .await
                .map_err(internal)?;
            Ok(match reserved {
                Ok(()) => DirectoryReply::Ack,
                Err(holder) => DirectoryReply::NameTaken(holder),
            })
        }
        DirectoryRequest::LookupName(name) => {
            let found = directory
                .send(directory::LookupName(name))
                .await
                .map_err(internal)?;
            Ok(DirectoryReply::Actor(found.map(Box::new)))
        }
        DirectoryRequest::LocateActor(actor) => {
            let found = directory
                .send(directory::LocateActor(actor))
                .await
                .map_err(internal)?;
            Ok(DirectoryReply::Actor(found.map(Box::new)))
        }
        DirectoryRequest::ActorUp { record, spec } => {
            directory
                .send(directory::ActorUp { record, spec })
                .await
                .map_err(internal)?;
            Ok(DirectoryReply::Ack)
        }
        DirectoryRequest::Waiting {
            actor,
            class,
            resources,
            job,
            for_ms,
            node,
        } => {
            let waiting = directory::Waiting {
                actor,
                what: (
                    crate::cluster::bounded_text(class),
                    resources,
                    crate::cluster::bounded_text(job),
                    node.map(crate::cluster::bounded_text),
                ),
                for_at_most: Duration::from_millis(for_ms).min(MAX_DEMAND_WAIT),
            };
            directory.send(waiting).await.map_err(internal)?;
            Ok(DirectoryReply::Ack)
        }
        DirectoryRequest::Placed(actor) => {
            directory
                .send(directory::Placed(Waiter::Actor(actor)))
                .await
                .map_err(internal)?;
            Ok(DirectoryReply::Ack)
        }
        DirectoryRequest::GroupWaiting {
            mut group,
            job,
            for_ms,
        } => {
            group.bundles.truncate(MAX_GROUP_BUNDLES);
            let waiting = directory::GroupWaiting {
                group,
                job: crate::cluster::bounded_text(job),
                for_at_most: Duration::from_millis(for_ms).min(MAX_DEMAND_WAIT),
            };
            directory.send(waiting).await.map_err(internal)?;
            Ok(DirectoryReply::Ack)
        }
        DirectoryRequest::GroupPlaced(group) => {
            directory
                .send(directory::Placed(Waiter::Group(group)))
                .await
                .map_err(internal)?;
            Ok(DirectoryReply::Ack)
        }
        DirectoryRequest::TasksWaiting {
            queue,
            resources,
            count,
            job,
        } => {
            let waiting = directory::TasksWaiting {
                queue,
                what: (resources, crate::cluster::bounded_text(job)),
                count,
            };
            directory.send(waiting).await.map_err(internal)?;
            Ok(DirectoryReply::Ack)
        }
        DirectoryRequest::ListDemands => Ok(DirectoryReply::Demands(
            directory
                .send(directory::ListDemands)
                .await
                .map_err(internal)?,
        )),
        DirectoryRequest::ListActors => {
            let actors = directory
                .send(directory::ListActors)
                .await
                .map_err(internal)?;
            Ok(DirectoryReply::Actors(actors))
        }
        DirectoryRequest::ListDeadActors => {
            let actors = directory
                .send(directory::ListDeadActors)
                .await
                .map_err(internal)?;
            Ok(DirectoryReply::Actors(actors))
        }
        DirectoryRequest::ActorDown {
            actor,
            incarnation,
            reason,
            restarting,
        } => {
            let down = directory::ActorDown {
                actor,
                incarnation,
                reason,
                restarting,
                node: from
                    .certified_as(PeerRole::Node)
                    .then(|| from.peer.identity.clone()),
            };
            directory.send(down).await.map_err(internal)?;
            Ok(DirectoryReply::Ack)
        }
    }
}

/// Fault reports, on the head (packet rules are answered by every node).
async fn fault_report(head: &HeadActors, request: FaultRequest) -> Result<FaultReply, RemoteError> {
    let kind = match request {
        FaultRequest::ReportFault {
            fault,
            target,
            trigger,
            kills_node,
        } => {
            if let Some(node) = kills_node {
                let fault = FiredFault::new(&fault, &trigger, &target);
                head.directory
                    .send(directory::NodeDoomed { node, fault })
                    .await
                    .map_err(internal)?;
            }
            ClusterEventKind::FaultInjected {
                fault,
                target,
                trigger,
            }
        }
        FaultRequest::ReportRecovery {
            what,
            target,
            took_ms,
        } => ClusterEventKind::Recovered {
            what,
            target,
            took_ms,
        },
        FaultRequest::ReportPacketFaults {
            process,
            class,
            counts,
            rule_hits,
        } => ClusterEventKind::PacketFaults {
            process,
            class,
            counts,
            rule_hits,
        },
        FaultRequest::AddPacketRule(_) => {
            return Err(RemoteError::new(
                RemoteErrorKind::Internal,
                "a packet rule reached the head's dispatcher",
            ))
        }
    };
    head.events.send(Publish(kind)).await.map_err(internal)?;
    Ok(FaultReply::Ack)
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

fn internal(e: actix::MailboxError) -> RemoteError {
    RemoteError::new(
        RemoteErrorKind::Internal,
        format!("node actor unavailable: {e}"),
    )
}
