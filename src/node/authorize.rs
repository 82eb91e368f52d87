//! Who may ask a node what: every control request is checked against the
//! caller's proven identity (`crate::transport`'s `tickets.rs`) before it
//! is routed.
//!
//! | caller | may |
//! |---|---|
//! | a certified node | heartbeat and leave as itself; report its own actors up and down; end a job, start and stop a submitted job's driver (the head); report that a job's driver exited (its own, checked by the head's `Jobs`); everything a worker may |
//! | a certified worker | within its job and program (below): objects (reference changes as itself only; no bulk streams), spawns, kills, bundles, binaries, name lookups (its job's actors and shared ones, checked by the head), job listings and logs, task and training-run reports and listings, its job's library records; report a fault that kills its own node; report recoveries and its own packet faults |
//! | a token holder (a driver, the CLI, a node before it joined) | join as the node it announced; keep its job alive; submit and stop jobs; everything a worker may, with any fault report and packet rules; release the name of a spawn that never started |
//! | unverified (this node cannot check proofs yet) | `Echo` only |
//!
//! A worker's ticket names its job and the program it runs
//! (`WorkerScope`), and a worker is confined to them ([`confine`]): it
//! spawns actors only of its own job, running its own program (so it
//! uploads and relays only that program's bytes, checked by their SHA-256);
//! reserves bundles only for its job; reads only its job's output and
//! driver log and never the node's own log; reads and writes only its
//! job's library records (`StateRequest`); lists no node's objects and
//! drops no node's copies, and sees and reports only its own job's tasks
//! (a task's id is its result object's). Kills and actor logs are checked
//! by the node that holds the actor (`manager/`: its job's actors only),
//! object reads and changes by the store that holds the object
//! (`crate::object_store`'s `node/`: each object records its job, and a
//! worker reads, appends to, seals, fails and takes references to only its
//! own job's).
//!
//! So no token holder can evict a member or keep a dead one alive, and no
//! actor's code can rewrite another actor's record, release another
//! process's references, or join as a node. Only the head expels (its
//! membership state machine, in its own process). The directory also
//! ignores an `ActorDown` from a node that is not the actor's
//! (`head/directory.rs`).

use crate::cluster::{
    BinaryRequest, BundleRequest, ControlRequest, DirectoryRequest, FaultRequest, JobRequest,
    MembershipRequest, ObjectRequest, RefHolder, WorkerRequest,
};
use crate::transport::{Caller, Standing, WorkerScope};
use crate::wire::{Incarnation, PeerRole, RemoteError, RemoteErrorKind};

/// A request its caller may not make.
#[derive(Debug, thiserror::Error)]
#[error("{caller} may not send {request}: {rule}")]
pub struct Forbidden {
    /// Who asked, and how far that is proven.
    pub caller: String,
    /// What it asked.
    pub request: &'static str,
    /// The rule it broke.
    pub rule: &'static str,
}

impl From<Forbidden> for RemoteError {
    fn from(e: Forbidden) -> Self {
        RemoteError::new(RemoteErrorKind::Forbidden, e.to_string())
    }
}

/// Whether `caller` may send `request` (the table in the module docs).
pub(super) fn authorize(caller: &Caller, request: &ControlRequest) -> Result<(), Forbidden> {
    let token = caller.standing == Standing::TokenHolder;
    let node = caller.certified_as(PeerRole::Node);
    let worker = caller.certified_as(PeerRole::Worker);
    let deny = |request, rule| {
        Err(Forbidden {
            caller: caller.to_string(),
            request,
            rule,
        })
    };
    if caller.standing == Standing::Unverified {
        return match request {
            ControlRequest::Echo(_) => Ok(()),
            _ => deny(
                "a request",
                "this node cannot check who its callers are yet (it has not joined)",
            ),
        };
    }
    if let Some(scope) = caller.worker_scope() {
        confine(scope, request).map_err(|(request, rule)| Forbidden {
            caller: format!("{caller} of job {}", scope.job),
            request,
            rule,
        })?;
    }
    match request {
        ControlRequest::Workers(WorkerRequest::RenewTicket) => match worker {
            true => Ok(()),
            false => deny(
                "RenewTicket",
                "only a worker renews its ticket, with its node",
            ),
        },
        ControlRequest::Echo(_)
        | ControlRequest::Events(_)
        | ControlRequest::Membership(MembershipRequest::Status)
        | ControlRequest::Binaries(_)
        | ControlRequest::Workers(_)
        | ControlRequest::Bundles(_)
        | ControlRequest::State(_) => Ok(()),
        ControlRequest::Membership(MembershipRequest::Join { registration, .. }) => {
            match token
                && caller.peer.role == PeerRole::Node
                && caller.peer.identity == registration.node
            {
                true => Ok(()),
                false => deny(
                    "Join",
                    "a node joins holding the token, as the identity it connected with",
                ),
            }
        }
        ControlRequest::Membership(MembershipRequest::Heartbeat { node, .. }) => {
            match caller.is_node(node) {
                true => Ok(()),
                false => deny("Heartbeat", "a node heartbeats only as itself"),
            }
        }
        ControlRequest::Membership(MembershipRequest::Leave { node }) => {
            match caller.is_node(node) {
                true => Ok(()),
                false => deny(
                    "Leave",
                    "a node leaves only as itself; only the head expels",
                ),
            }
        }
        ControlRequest::Directory(DirectoryRequest::ActorUp { record, .. }) => {
            match caller.is_node(&record.node) {
                true => Ok(()),
                false => deny("ActorUp", "only the node an actor runs on reports it up"),
            }
        }
        ControlRequest::Directory(DirectoryRequest::ActorDown { incarnation, .. }) => {
            match node || *incarnation == Incarnation(0) {
                true => Ok(()),
                false => deny(
                    "ActorDown",
                    "only the node an actor runs on reports it down; a spawner may only \
                     release the name of a spawn that never started (incarnation 0)",
                ),
            }
        }
        ControlRequest::Membership(MembershipRequest::Autoscaler(_)) => match token {
            true => Ok(()),
            false => deny(
                "Autoscaler",
                "only a token holder (the autoscaler nimbus up starts) reports node types",
            ),
        },
        ControlRequest::Membership(MembershipRequest::RequestResources { .. }) => match token {
            true => Ok(()),
            false => deny(
                "RequestResources",
                "only a token holder (a driver, the CLI) asks for capacity: it starts machines",
            ),
        },
        ControlRequest::Membership(MembershipRequest::RotateTicketKey) => match token {
            true => Ok(()),
            false => deny(
                "RotateTicketKey",
                "only a token holder (the cluster's operator) rotates the head's ticket key",
            ),
        },
        ControlRequest::Directory(_) => Ok(()),
        ControlRequest::Faults(FaultRequest::AddPacketRule(_)) => match token {
            true => Ok(()),
            false => deny(
                "AddPacketRule",
                "only a token holder (the fault-injection harness) adds packet rules",
            ),
        },
        ControlRequest::Faults(FaultRequest::ReportFault { kills_node, .. }) => {
            let own_node = match &caller.standing {
                Standing::Certified { host, .. } => {
                    kills_node.as_ref().is_none_or(|name| *name == host.name)
                }
                _ => false,
            };
            match token || (worker && own_node) {
                true => Ok(()),
                false => deny(
                    "ReportFault",
                    "a worker reports only faults of its own node; nodes report none",
                ),
            }
        }
        ControlRequest::Faults(FaultRequest::ReportRecovery { .. }) => match token || worker {
            true => Ok(()),
            false => deny("ReportRecovery", "nodes report no recoveries"),
        },
        ControlRequest::Faults(FaultRequest::ReportPacketFaults { process, .. }) => {
            match token || *process == caller.peer.identity.name {
                true => Ok(()),
                false => deny(
                    "ReportPacketFaults",
                    "a node or worker reports only its own packet faults",
                ),
            }
        }
        ControlRequest::Objects(
            ObjectRequest::UpdateRefs { holder, .. } | ObjectRequest::PutObjects { holder, .. },
        ) => match !worker || speaks_for_itself(caller, holder) {
            true => Ok(()),
            false => deny(
                "UpdateRefs/PutObjects",
                "a worker changes only its own references (its actor and incarnation)",
            ),
        },
        ControlRequest::Objects(ObjectRequest::StreamObject { .. }) => match !worker {
            true => Ok(()),
            false => deny(
                "StreamObject",
                "a worker reads objects through its node, not over bulk streams",
            ),
        },
        ControlRequest::Objects(_) => Ok(()),
        ControlRequest::Jobs(JobRequest::DriverAlive { .. } | JobRequest::DriverDone { .. }) => {
            match token {
                true => Ok(()),
                false => deny(
                    "DriverAlive",
                    "only a driver (a token holder) keeps its job alive",
                ),
            }
        }
        ControlRequest::Jobs(JobRequest::SubmitJob(_) | JobRequest::StopJob { .. }) => {
            match token {
                true => Ok(()),
                false => deny(
                    "SubmitJob/StopJob",
                    "only a token holder (the CLI, a driver) submits or stops jobs",
                ),
            }
        }
        ControlRequest::Jobs(
            JobRequest::ListJobs
            | JobRequest::ReadJobLog { .. }
            | JobRequest::ListTasks
            | JobRequest::TaskStates(_)
            | JobRequest::RunEvents { .. }
            | JobRequest::ListRuns
            | JobRequest::GetRun { .. },
        ) => Ok(()),
        ControlRequest::Jobs(JobRequest::EndJob { .. }) => match node {
            true => Ok(()),
            false => deny("EndJob", "only the head ends a job"),
        },
        ControlRequest::Jobs(JobRequest::RunDriver { .. } | JobRequest::StopDriver { .. }) => {
            match node {
                true => Ok(()),
                false => deny(
                    "RunDriver/StopDriver",
                    "only the head starts or stops a submitted job's driver",
                ),
            }
        }
        ControlRequest::Jobs(JobRequest::DriverExited { .. }) => match node {
            true => Ok(()),
            false => deny(
                "DriverExited",
                "only the node that runs a job's driver reports its exit",
            ),
        },
    }
}

/// Whether a worker confined to `scope` may send `request` as far as its
/// job and program go (the request and the rule it breaks if not); the
/// rules every caller meets follow in [`authorize`].
fn confine(
    scope: &WorkerScope,
    request: &ControlRequest,
) -> Result<(), (&'static str, &'static str)> {
    let holds = |holds: bool, request, rule| if holds { Ok(()) } else { Err((request, rule)) };
    match request {
        ControlRequest::Workers(WorkerRequest::StartActor(spec)) => {
            holds(
                spec.job == scope.job,
                "StartActor",
                "a worker spawns actors only for its own job",
            )?;
            holds(
                spec.binary.hash == scope.binary,
                "StartActor",
                "a worker spawns actors only of the program it runs (a driver starts others)",
            )
        }
        ControlRequest::Binaries(
            BinaryRequest::UploadBinary { hash, .. } | BinaryRequest::ReadBinary { hash, .. },
        ) => holds(
            *hash == scope.binary,
            "UploadBinary/ReadBinary",
            "a worker ships and reads only the program it runs (a driver uploads others)",
        ),
        ControlRequest::Workers(WorkerRequest::ReadOutput { job, .. })
        | ControlRequest::Jobs(JobRequest::ReadJobLog { job, .. })
        | ControlRequest::Bundles(BundleRequest::ReserveBundle { job, .. }) => holds(
            *job == scope.job,
            "ReadOutput/ReadJobLog/ReserveBundle",
            "a worker reads the output and logs of, and reserves bundles for, its own job only",
        ),
        ControlRequest::Workers(WorkerRequest::ReadNodeLog { .. }) => Err((
            "ReadNodeLog",
            "a worker does not read its node's log (it tells of every job)",
        )),
        ControlRequest::Objects(ObjectRequest::ListObjects) => Err((
            "ListObjects",
            "a worker does not list a node's objects (every job's ids; an id is what lets one read an object)",
        )),
        ControlRequest::Objects(ObjectRequest::FreeObject(_)) => Err((
            "FreeObject",
            "a worker does not drop a node's copies (the owner's node does, once an object is freed)",
        )),
        ControlRequest::Jobs(JobRequest::TaskStates(records)) => holds(
            records.iter().all(|task| task.job == scope.job),
            "TaskStates",
            "a worker reports the states of its own job's tasks only",
        ),
        ControlRequest::State(request) => holds(
            request.scope().job == scope.job,
            "a State request",
            "a worker reads and writes its own job's library records only",
        ),
        _ => Ok(()),
    }
}

/// A worker's confinement to its job, for the checks only the node holding
/// the target can make (kills, actor logs, bundle releases: `manager/`).
#[derive(Clone, Debug)]
pub struct Confinement {
    /// Who asked.
    caller: String,
    /// The job it is confined to.
    job: String,
}

impl Confinement {
    /// `caller`'s confinement: `None` for anyone but a certified worker.
    pub fn of(caller: &Caller) -> Option<Self> {
        let scope = caller.worker_scope()?;
        Some(Confinement {
            caller: caller.to_string(),
            job: scope.job.clone(),
        })
    }

    /// Whether the worker may send `request` about something of `job`
    /// (`None`: nothing this node knows, so not its job's).
    pub fn allows(
        &self,
        request: &'static str,
        job: Option<&str>,
        rule: &'static str,
    ) -> Result<(), Forbidden> {
        match job == Some(self.job.as_str()) {
            true => Ok(()),
            false => Err(Forbidden {
                caller: format!("{} of job {}", self.caller, self.job),
                request,
                rule,
            }),
        }
    }
}

/// Whether `holder` is the worker process `caller` (named `worker-ACTOR`,
/// `crate::object_store`'s `process/refs.rs`).
fn speaks_for_itself(caller: &Caller, holder: &RefHolder) -> bool {
    match holder {
        RefHolder::Process {
            worker: Some((actor, incarnation)),
            ..
        } => {
            caller.peer.identity.name == format!("worker-{actor}")
                && caller.peer.identity.incarnation == *incarnation
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{ActorId, NodeRegistration, ResourceSet};
    use crate::transport::CertificateHash;
    use crate::wire::{NodeIdentity, PeerIdentity};

    fn identity(name: &str, incarnation: u64) -> NodeIdentity {
        NodeIdentity {
            name: name.into(),
            incarnation: Incarnation(incarnation),
        }
    }

    fn caller(role: PeerRole, who: &NodeIdentity, standing: Standing) -> Caller {
        Caller {
            peer: PeerIdentity {
                role,
                identity: who.clone(),
            },
            certificate: CertificateHash([0; 32]),
            standing,
        }
    }

    fn node_standing(node: &NodeIdentity) -> Standing {
        Standing::Certified {
            host: node.clone(),
            scope: None,
        }
    }

    fn worker_standing(node: &NodeIdentity, job: &str) -> Standing {
        Standing::Certified {
            host: node.clone(),
            scope: Some(WorkerScope {
                job: job.into(),
                binary: "b1".into(),
            }),
        }
    }

    fn leave(node: &NodeIdentity) -> ControlRequest {
        ControlRequest::Membership(MembershipRequest::Leave { node: node.clone() })
    }

    #[test]
    fn a_node_leaves_and_heartbeats_only_as_itself() {
        let n1 = identity("n1", 1);
        let head = identity("head", 2);
        let certified = Standing::Certified {
            host: n1.clone(),
            scope: None,
        };
        let node = caller(PeerRole::Node, &n1, certified);
        assert!(authorize(&node, &leave(&n1)).is_ok());
        assert!(authorize(&node, &leave(&head)).is_err());
        assert!(authorize(&node, &leave(&identity("n1", 3))).is_err());
        let holder = caller(PeerRole::Node, &n1, Standing::TokenHolder);
        assert!(authorize(&holder, &leave(&n1)).is_err());
        let beat = ControlRequest::Membership(MembershipRequest::Heartbeat {
            node: head,
            used: ResourceSet::default(),
            host: None,
            renew: None,
        });
        assert!(authorize(&node, &beat).is_err());
        assert!(authorize(&holder, &beat).is_err());
    }

    #[test]
    fn a_worker_reads_and_writes_its_own_jobs_library_records_only() {
        let n1 = identity("n1", 1);
        let put = |job: &str| {
            ControlRequest::State(crate::cluster::StateRequest::Put {
                scope: crate::cluster::StateScope {
                    library: "serve".into(),
                    job: job.into(),
                },
                key: "deployment/a".into(),
                value: vec![1],
            })
        };
        let me = identity("worker-ab", 1);
        let worker = caller(PeerRole::Worker, &me, worker_standing(&n1, "j1"));
        assert!(authorize(&worker, &put("j1")).is_ok());
        let refused = authorize(&worker, &put("j2")).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("its own job's library records"),
            "{refused}"
        );
        let holder = caller(PeerRole::Client, &n1, Standing::TokenHolder);
        assert!(authorize(&holder, &put("j2")).is_ok());
    }

    #[test]
    fn only_a_worker_renews_a_workers_ticket_and_only_a_token_holder_rotates_the_key() {
        let n1 = identity("n1", 1);
        let rotate = ControlRequest::Membership(MembershipRequest::RotateTicketKey);
        let renew = ControlRequest::Workers(WorkerRequest::RenewTicket);
        let worker = caller(
            PeerRole::Worker,
            &identity("worker-ab", 1),
            worker_standing(&n1, "j"),
        );
        assert!(authorize(&worker, &renew).is_ok());
        let node = caller(PeerRole::Node, &n1, node_standing(&n1));
        let holder = caller(PeerRole::Client, &n1, Standing::TokenHolder);
        assert!(authorize(&holder, &rotate).is_ok());
        for other in [&worker, &node] {
            let refused = authorize(other, &rotate).unwrap_err();
            assert!(
                refused.to_string().contains("may not send RotateTicketKey"),
                "{refused}"
            );
        }
        for other in [node, holder] {
            let refused = authorize(&other, &renew).unwrap_err();
            assert!(
                refused.to_string().contains("may not send RenewTicket"),
                "{refused}"
            );
        }
    }

    #[test]
    fn a_worker_asks_for_no_bulk_stream() {
        let n1 = identity("n1", 1);
        let stream = ControlRequest::Objects(ObjectRequest::StreamObject {
            id: crate::cluster::ObjectId(7),
            size: 1 << 20,
            copy_at: None,
        });
        let node = caller(PeerRole::Node, &n1, node_standing(&n1));
        assert!(authorize(&node, &stream).is_ok());
        let me = identity("worker-ab", 1);
        let worker = caller(PeerRole::Worker, &me, worker_standing(&n1, "j"));
        assert!(authorize(&worker, &stream).is_err());
        // The head, say.
        let holder = caller(PeerRole::Node, &n1, Standing::TokenHolder);
        assert!(authorize(&holder, &stream).is_ok());
    }

    #[test]
    fn only_a_token_holder_joins_and_only_as_itself() {
        let n1 = identity("n1", 1);
        let join = |node: &NodeIdentity| {
            ControlRequest::Membership(MembershipRequest::Join {
                registration: NodeRegistration {
                    node: node.clone(),
                    address: ([127, 0, 0, 1], 1).into(),
                    resources: ResourceSet::default(),
                    versions: Default::default(),
                },
                signs_workers: Vec::new(),
            })
        };
        let holder = caller(PeerRole::Node, &n1, Standing::TokenHolder);
        assert!(authorize(&holder, &join(&n1)).is_ok());
        assert!(authorize(&holder, &join(&identity("head", 1))).is_err());
        let worker = caller(
            PeerRole::Node,
            &n1,
            Standing::Certified {
                host: identity("n2", 1),
                scope: None,
            },
        );
        assert!(authorize(&worker, &join(&n1)).is_err());
        let unverified = caller(PeerRole::Node, &n1, Standing::Unverified);
        assert!(authorize(&unverified, &join(&n1)).is_err());
    }

    #[test]
    fn a_worker_speaks_only_for_its_own_actor() {
        let actor = ActorId(0xab);
        let me = identity(&format!("worker-{actor}"), 9);
        let n1 = identity("n1", 1);
        let worker = caller(PeerRole::Worker, &me, worker_standing(&n1, "j"));
        let holder = |actor, incarnation| RefHolder::Process {
            id: 1,
            label: "worker".into(),
            worker: Some((actor, Incarnation(incarnation))),
            job: None,
        };
        let refs = |actor, incarnation| {
            ControlRequest::Objects(ObjectRequest::UpdateRefs {
                holder: holder(actor, incarnation),
                updates: Vec::new(),
            })
        };
        assert!(authorize(&worker, &refs(actor, 9)).is_ok());
        assert!(authorize(&worker, &refs(ActorId(0xac), 9)).is_err());
        assert!(authorize(&worker, &refs(actor, 8)).is_err());
        // Small puts name their holder too: only the worker's own.
        let puts = |actor, incarnation| {
            ControlRequest::Objects(ObjectRequest::PutObjects {
                holder: holder(actor, incarnation),
                objects: Vec::new(),
            })
        };
        assert!(authorize(&worker, &puts(actor, 9)).is_ok());
        assert!(authorize(&worker, &puts(ActorId(0xac), 9)).is_err());
        let down = |incarnation| {
            ControlRequest::Directory(DirectoryRequest::ActorDown {
                actor: ActorId(0xac),
                incarnation: Incarnation(incarnation),
                reason: crate::cluster::DeathCause::Stopped,
                restarting: false,
            })
        };
        assert!(authorize(&worker, &down(5)).is_err());
        assert!(authorize(&worker, &down(0)).is_ok());
        let kill = |node: &str| {
            ControlRequest::Faults(FaultRequest::ReportFault {
                fault: "kill_node".into(),
                target: "a".into(),
                trigger: "t".into(),
                kills_node: Some(node.into()),
            })
        };
        assert!(authorize(&worker, &kill("n1")).is_ok());
        assert!(authorize(&worker, &kill("head")).is_err());
    }

    #[test]
    fn only_token_holders_submit_jobs_and_only_nodes_run_their_drivers() {
        let n1 = identity("n1", 1);
        let worker = caller(
            PeerRole::Worker,
            &identity("worker-00000000000000ab", 9),
            worker_standing(&n1, "j"),
        );
        let node = caller(PeerRole::Node, &n1, node_standing(&n1));
        let cli = caller(
            PeerRole::Client,
            &identity("client-1", 1),
            Standing::TokenHolder,
        );
        let submission = crate::cluster::JobSubmission {
            name: None,
            entrypoint: vec!["prog".into()],
            env: Vec::new(),
            working_dir: None,
            node: None,
        };
        let submit = ControlRequest::Jobs(JobRequest::SubmitJob(submission.clone()));
        let stop = ControlRequest::Jobs(JobRequest::StopJob { job: "j".into() });
        let run = ControlRequest::Jobs(JobRequest::RunDriver {
            job: "j".into(),
            submission,
            head: "127.0.0.1:1".parse().unwrap(),
        });
        let exited = ControlRequest::Jobs(JobRequest::DriverExited {
            job: "j".into(),
            exit: crate::cluster::DeathCause::Exited { code: 0 },
        });
        let list = ControlRequest::Jobs(JobRequest::ListJobs);
        for request in [&submit, &stop] {
            assert!(authorize(&cli, request).is_ok());
            assert!(
                authorize(&worker, request).is_err(),
                "actor code submits no jobs"
            );
        }
        for request in [&run, &exited] {
            assert!(authorize(&node, request).is_ok());
            assert!(authorize(&cli, request).is_err(), "{request:?}");
            assert!(authorize(&worker, request).is_err(), "{request:?}");
        }
        for who in [&cli, &worker, &node] {
            assert!(authorize(who, &list).is_ok());
        }
        let report = ControlRequest::Membership(MembershipRequest::Autoscaler(
            crate::cluster::AutoscalerReport::default(),
        ));
        assert!(authorize(&cli, &report).is_ok(), "the autoscaler reports");
        assert!(
            authorize(&worker, &report).is_err(),
            "actor code does not make spawns wait for node types"
        );
        let request = ControlRequest::Membership(MembershipRequest::RequestResources {
            bundles: vec![crate::cluster::ResourceSet::of(crate::cluster::CPU, 2.0)],
        });
        assert!(
            authorize(&cli, &request).is_ok(),
            "a driver asks for capacity"
        );
        assert!(
            authorize(&worker, &request).is_err(),
            "actor code starts no machines"
        );
    }

    #[test]
    fn a_worker_is_confined_to_its_job_and_program() {
        let n1 = identity("n1", 1);
        let worker = caller(
            PeerRole::Worker,
            &identity("worker-00000000000000ab", 9),
            worker_standing(&n1, "j"),
        );
        let driver = caller(
            PeerRole::Client,
            &identity("driver-1", 1),
            Standing::TokenHolder,
        );
        let start = |job: &str, binary: &str| {
            ControlRequest::Workers(WorkerRequest::StartActor(crate::cluster::ActorSpec {
                actor: ActorId(1),
                type_name: "t".into(),
                name: None,
                args: Vec::new(),
                resources: ResourceSet::default(),
                max_restarts: 0,
                restarts: 0,
                node: None,
                job: job.into(),
                detached: false,
                shared: false,
                binary: crate::cluster::BinaryId {
                    hash: binary.into(),
                    len: 1,
                },
                bundle: None,
                owner: None,
            }))
        };
        let upload = |hash: &str| {
            ControlRequest::Binaries(BinaryRequest::UploadBinary {
                hash: hash.into(),
                offset: 0,
                total: 1,
                chunk: vec![0],
            })
        };
        let output = |job: &str| {
            ControlRequest::Workers(WorkerRequest::ReadOutput {
                job: job.into(),
                after: 0,
                max: 1,
            })
        };
        let log = |job: &str| {
            ControlRequest::Jobs(JobRequest::ReadJobLog {
                job: job.into(),
                offset: 0,
                max: 1,
            })
        };
        let node_log = ControlRequest::Workers(WorkerRequest::ReadNodeLog { offset: 0, max: 1 });
        for own in [start("j", "b1"), upload("b1"), output("j"), log("j")] {
            assert!(authorize(&worker, &own).is_ok(), "{own:?}");
        }
        for other in [
            start("k", "b1"),
            start("j", "b2"),
            upload("b2"),
            output("k"),
            log("k"),
            node_log,
            ControlRequest::Objects(ObjectRequest::ListObjects),
            ControlRequest::Objects(ObjectRequest::FreeObject(crate::cluster::ObjectId(7))),
        ] {
            let refused = authorize(&worker, &other).unwrap_err();
            assert!(refused.caller.ends_with("of job j"), "{refused}");
            assert!(authorize(&driver, &other).is_ok(), "{other:?}");
        }
        let confined = Confinement::of(&worker).unwrap();
        assert!(confined.allows("KillActor", Some("j"), "r").is_ok());
        assert!(confined.allows("KillActor", Some("k"), "r").is_err());
        assert!(confined.allows("KillActor", None, "r").is_err());
        assert!(Confinement::of(&driver).is_none());
    }
}
