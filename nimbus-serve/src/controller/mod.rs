//! `Controller`: the actor (0 CPU, one per `Serve`) that starts the
//! ingresses, deploys applications onto replicas, checks their health and
//! publishes the route table.
//!
//! 1. **Start** ([`Start`]): one [`Ingress`] per alive node, pinned to it,
//!    each told to listen; their addresses are the answer.
//! 2. **Deploy** ([`Deploy`]): the new version's replicas are spawned
//!    (restarted by the runtime up to [`REPLICA_RESTARTS`] times if their
//!    process dies) and asked for their health until all pass, one says
//!    it could not be built, or [`STARTUP_TIMEOUT`] passes (then the new
//!    replicas are stopped and the old version, if any, serves on). Then
//!    the routes are published to every ingress, and the old version's
//!    replicas drained ([`Drain`], up to [`DRAIN_TIMEOUT`]) and stopped:
//!    a redeploy is a rolling update. One that changes only the user
//!    config is not: the live replicas take it (`replicas.rs`, step 4).
//! 3. **Health** every [`HEALTH_PERIOD`]: a node that joined gets an
//!    ingress (one whose node died, or that is dead for good, is
//!    forgotten, and a node without one gets a new one); each replica is asked within
//!    [`HEALTH_TIMEOUT`]; one that fails is routed around until it passes;
//!    one dead for good is replaced (in the background: `replicas.rs`).
//!    Each ingress is told to listen (a no-op unless it was restarted)
//!    and sent the routes.
//! 4. **Autoscale**, after each health round, for applications with
//!    `Application::autoscaling`: the requests the replicas hold (their
//!    health answers) go to the application's `autoscale.rs` policy; new
//!    replicas are started in the background and routed to once healthy,
//!    or the ones with the fewest requests are taken out of the routes,
//!    drained and stopped (`replicas.rs`). The cluster's pending demands
//!    (`nimbus::library::pending_demands`) say whether something else
//!    waits for the CPUs, GPUs or custom resources replicas hold: then
//!    replicas above the minimum are given back.
//! 5. **Shutdown** ([`Shutdown`]): replicas and ingresses are stopped.
//!
//! Replicas and ingresses survive the controller
//! (`SpawnOptions::survives_spawner`): if it dies, the data path serves
//! on with the routes it last published; they end with the job.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

mod autoscale;
mod replicas;
mod saved;

use actix::prelude::*;
use autoscale::Autoscaler;
use futures::future::join_all;
use nimbus::actor::{self, ActorHandle, CallError, SpawnOptions, Strategy};
use replicas::{autoscale, reconfigure, replace, start_replicas, stop_replicas};
use saved::{forget, restore, save};
use serde::{Deserialize, Serialize};

use crate::config::{Application, HttpOptions};
use crate::error::ControllerError;
use crate::ingress::{Ingress, IngressArgs, Listen, RouteWire, SetRoutes};
use crate::replica::{Health, Replica};
use crate::status::{DeploymentStatus, IngressAddress, ReplicaStatus, ServeStatus};

/// How often replicas are health-checked and routes republished.
pub const HEALTH_PERIOD: Duration = Duration::from_secs(1);
/// How long a health check may take before it counts as failed.
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a new version's replicas have to become healthy.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(120);
/// How long an old version's replica has to finish its requests.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the runtime restarts a replica whose process died.
pub const REPLICA_RESTARTS: u32 = 1_000;
/// How often the runtime restarts an ingress whose process died.
pub const INGRESS_RESTARTS: u32 = 1_000;
/// How often the runtime restarts the controller (on its node, or on
/// another when its node is lost); it takes its state back (`saved.rs`).
pub const CONTROLLER_RESTARTS: u32 = 1_000;

/// Reconciles deployed applications with their replicas.
pub struct Controller {
    state: Rc<RefCell<State>>,
}

struct State {
    http: HttpOptions,
    ingresses: Vec<(String, ActorHandle<Ingress>, Option<SocketAddr>)>,
    applications: Vec<Running>,
    checking: bool,
    /// Deploys so far: each deploy's `Running::generation`.
    deploys: u64,
    /// This controller, for its replicas to ask for each other
    /// (`DeploymentHandle`); known from `Start`.
    me: Option<ActorHandle<Controller>>,
    /// Its `Serve`'s id: the key of its saved state (`saved.rs`).
    serve: u64,
    /// Whether the saved state was read (step 3 of `saved.rs`).
    restored: bool,
    /// What was last written.
    last_saved: Option<Vec<u8>>,
    /// `Shutdown` came: nothing is written any more.
    shut_down: bool,
}

struct Running {
    app: Application,
    /// Which deploy made it (a reconfigure keeps it): what a replica
    /// started in the background joins only if it is still the same.
    generation: u64,
    replicas: Vec<ReplicaEntry>,
    /// Replicas being started in the background (`replicas.rs`, step 2).
    starting: u32,
    /// Requests waiting at the ingresses for a replica, at the last
    /// publish: load the autoscaler counts (an application scaled to zero
    /// has nothing else).
    queued: u32,
    /// With `Application::autoscaling`: the replica count's policy.
    autoscaler: Option<Autoscaler>,
}

struct ReplicaEntry {
    handle: ActorHandle<Replica>,
    healthy: bool,
    error: Option<String>,
    /// The requests it held on average between its last two health checks.
    ongoing: f64,
    /// Dead for good, a replacement being started (`replicas.rs`, step 1).
    replacing: bool,
}

impl Actor for Controller {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(HEALTH_PERIOD, |controller, ctx| {
            let state = controller.state.clone();
            if std::mem::replace(&mut state.borrow_mut().checking, true) {
                return;
            }
            ctx.spawn(
                async move {
                    if restore(&state).await {
                        follow_nodes(&state).await;
                        check_health(&state).await;
                        autoscale(&state).await;
                        publish(&state).await;
                        save(&state).await;
                    }
                    state.borrow_mut().checking = false;
                }
                .into_actor(controller),
            );
        });
    }
}

impl Controller {
    fn new(args: ControllerArgs) -> Self {
        Controller {
            state: Rc::new(RefCell::new(State {
                http: args.http,
                ingresses: Vec::new(),
                applications: Vec::new(),
                checking: false,
                deploys: 0,
                me: None,
                serve: args.serve,
                restored: false,
                last_saved: None,
                shut_down: false,
            })),
        }
    }
}

/// What a controller is started with.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ControllerArgs {
    /// Where the ingresses listen.
    pub(crate) http: HttpOptions,
    /// Its `Serve`'s id, drawn at random by `Serve::start`.
    pub(crate) serve: u64,
}

nimbus::remote_actor!(Controller, args: ControllerArgs, new: Controller::new, handles: [Start, Deploy, Delete, Status, Shutdown, Replicas]);

/// Starts an ingress on every alive node; answers their addresses.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<Vec<IngressAddress>, ControllerError>")]
pub struct Start(pub(crate) ActorHandle<Controller>);

nimbus::remote_message!(Start);

impl Handler<Start> for Controller {
    type Result = ResponseFuture<Result<Vec<IngressAddress>, ControllerError>>;

    fn handle(&mut self, Start(me): Start, _: &mut Context<Self>) -> Self::Result {
        let state = self.state.clone();
        state.borrow_mut().me = Some(me);
        Box::pin(async move {
            if !restore(&state).await {
                return Err(ControllerError::Restoring);
            }
            let http = state.borrow().http.clone();
            let status =
                nimbus::library::cluster_status()
                    .await
                    .map_err(|e| ControllerError::Spawn {
                        what: "the HTTP ingresses".into(),
                        detail: e.to_string(),
                    })?;
            let nodes: Vec<String> = status.alive().map(|node| node.id.clone()).collect();
            let started = join_all(nodes.iter().map(|node| start_ingress(node, &http))).await;
            let mut ingresses = Vec::new();
            let mut failure = None;
            for (node, started) in nodes.into_iter().zip(started) {
                match started {
                    Ok((handle, address)) => ingresses.push((node, handle, Some(address))),
                    Err(e) => {
                        failure.get_or_insert(e);
                    }
                }
            }
            if let Some(failure) = failure {
                join_all(ingresses.iter().map(|(_, handle, _)| handle.kill())).await;
                return Err(failure);
            }
            let addresses = ingresses
                .iter()
                .filter_map(|(node, _, address)| {
                    address.map(|address| IngressAddress {
                        node: node.clone(),
                        address,
                    })
                })
                .collect();
            state.borrow_mut().ingresses = ingresses;
            save(&state).await;
            Ok(addresses)
        })
    }
}

/// Spawns the ingress of `node`, pinned there, and has it listen; killed
/// again if it cannot.
async fn start_ingress(
    node: &str,
    http: &HttpOptions,
) -> Result<(ActorHandle<Ingress>, SocketAddr), ControllerError> {
    let args = IngressArgs {
        node: node.to_string(),
        host: http.host.clone(),
        port: http.port,
        max_body_bytes: http.max_body_bytes,
        request_timeout: http.request_timeout,
    };
    let options = SpawnOptions::default()
        .num_cpus(0.0)
        .strategy(Strategy::Node(node.to_string()))
        .max_restarts(INGRESS_RESTARTS)
        .survives_spawner();
    let handle =
        actor::spawn::<Ingress>(args, options)
            .await
            .map_err(|e| ControllerError::Spawn {
                what: format!("the HTTP ingress on node {node}"),
                detail: e.to_string(),
            })?;
    let detail = match handle.send(Listen).await {
        Ok(Ok(address)) => return Ok((handle, address)),
        Ok(Err(detail)) => detail,
        Err(e) => e.to_string(),
    };
    let _ = handle.kill().await;
    Err(ControllerError::Listen {
        node: node.to_string(),
        address: format!("{}:{}", http.host, http.port),
        detail,
    })
}

/// Nodes that joined since the last round get an ingress; those that died
/// are forgotten (their ingress died with them).
async fn follow_nodes(state: &Rc<RefCell<State>>) {
    if state.borrow().ingresses.is_empty() {
        return; // not started (or shut down)
    }
    let status = match nimbus::library::cluster_status().await {
        Ok(status) => status,
        Err(e) => {
            tracing::debug!("the cluster's nodes could not be read: {e}");
            return;
        }
    };
    let joined: Vec<String> = {
        let mut state = state.borrow_mut();
        state.ingresses.retain(|(node, _, _)| {
            let alive = status.alive().any(|alive| alive.id == *node);
            if !alive {
                tracing::info!(%node, "its node is gone: the ingress is forgotten");
            }
            alive
        });
        status
            .alive()
            .filter(|alive| !state.ingresses.iter().any(|(node, _, _)| *node == alive.id))
            .map(|alive| alive.id.clone())
            .collect()
    };
    let http = state.borrow().http.clone();
    for node in joined {
        match start_ingress(&node, &http).await {
            Ok((handle, address)) => {
                // Listed (`Status`) only once it serves the routes.
                let routes = routes_of(&state.borrow());
                let _ = send_routes(&node, &handle, routes).await;
                tracing::info!(%node, %address, "a node joined: its ingress listens");
                state
                    .borrow_mut()
                    .ingresses
                    .push((node, handle, Some(address)));
            }
            Err(e) => tracing::warn!(%node, "a joined node got no ingress: {e}"),
        }
    }
}

/// Deploys an application (replacing the one of the same name).
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<(), ControllerError>")]
pub struct Deploy(pub(crate) Application);

nimbus::remote_message!(Deploy);

impl Handler<Deploy> for Controller {
    type Result = ResponseFuture<Result<(), ControllerError>>;

    fn handle(&mut self, Deploy(app): Deploy, _: &mut Context<Self>) -> Self::Result {
        let state = self.state.clone();
        Box::pin(async move {
            if !restore(&state).await {
                return Err(ControllerError::Restoring);
            }
            if let Some(by) = state.borrow().applications.iter().find(|running| {
                running.app.route_prefix == app.route_prefix && running.app.name != app.name
            }) {
                return Err(ControllerError::RouteTaken {
                    prefix: app.route_prefix.clone(),
                    by: by.app.name.clone(),
                    application: app.name.clone(),
                });
            }
            // Only the user config changed: the live replicas take it.
            let only_config = state.borrow().applications.iter().find_map(|running| {
                running
                    .app
                    .differs_only_in_config(&app)
                    .then_some(running.generation)
            });
            if let Some(generation) = only_config {
                return reconfigure(&state, generation, app).await;
            }
            let autoscaler = app.autoscaling.map(Autoscaler::new);
            let first = autoscaler
                .as_ref()
                .map_or(app.num_replicas, Autoscaler::target);
            let replicas = start_replicas(&state, &app, first).await?;
            let old = {
                let mut state = state.borrow_mut();
                state.deploys += 1;
                let running = Running {
                    app,
                    generation: state.deploys,
                    replicas,
                    starting: 0,
                    queued: 0,
                    autoscaler,
                };
                match state
                    .applications
                    .iter_mut()
                    .find(|old| old.app.name == running.app.name)
                {
                    Some(old) => Some(std::mem::replace(old, running)),
                    None => {
                        state.applications.push(running);
                        None
                    }
                }
            };
            publish(&state).await;
            if let Some(old) = old {
                stop_replicas(old.replicas, true).await;
            }
            save(&state).await;
            Ok(())
        })
    }
}

/// Stops an application.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<(), ControllerError>")]
pub struct Delete(pub(crate) String);

nimbus::remote_message!(Delete);

impl Handler<Delete> for Controller {
    type Result = ResponseFuture<Result<(), ControllerError>>;

    fn handle(&mut self, Delete(name): Delete, _: &mut Context<Self>) -> Self::Result {
        let state = self.state.clone();
        Box::pin(async move {
            if !restore(&state).await {
                return Err(ControllerError::Restoring);
            }
            let running = {
                let mut state = state.borrow_mut();
                let index = state
                    .applications
                    .iter()
                    .position(|running| running.app.name == name)
                    .ok_or(ControllerError::NoApplication(name))?;
                state.applications.remove(index)
            };
            publish(&state).await;
            stop_replicas(running.replicas, true).await;
            save(&state).await;
            Ok(())
        })
    }
}

/// Asks the state of serving.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "ServeStatus")]
pub struct Status;

nimbus::remote_message!(Status);

impl Handler<Status> for Controller {
    type Result = MessageResult<Status>;

    fn handle(&mut self, _: Status, _: &mut Context<Self>) -> Self::Result {
        let state = self.state.borrow();
        MessageResult(ServeStatus {
            ingresses: state
                .ingresses
                .iter()
                .filter_map(|(node, _, address)| {
                    address.map(|address| IngressAddress {
                        node: node.clone(),
                        address,
                    })
                })
                .collect(),
            applications: state
                .applications
                .iter()
                .map(|running| DeploymentStatus {
                    name: running.app.name.clone(),
                    route_prefix: running.app.route_prefix.clone(),
                    replicas: running
                        .replicas
                        .iter()
                        .map(|replica| ReplicaStatus {
                            id: replica.handle.id(),
                            healthy: replica.healthy,
                            error: replica.error.clone(),
                        })
                        .collect(),
                    starting: running.starting,
                })
                .collect(),
        })
    }
}

/// The healthy replicas of an application, for a `DeploymentHandle`.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<Vec<ActorHandle<Replica>>, ControllerError>")]
pub struct Replicas(pub(crate) String);

nimbus::remote_message!(Replicas);

impl Handler<Replicas> for Controller {
    type Result = Result<Vec<ActorHandle<Replica>>, ControllerError>;

    fn handle(&mut self, Replicas(name): Replicas, _: &mut Context<Self>) -> Self::Result {
        let state = self.state.borrow();
        let running = state
            .applications
            .iter()
            .find(|running| running.app.name == name)
            .ok_or(ControllerError::NoApplication(name))?;
        Ok(running
            .replicas
            .iter()
            .filter(|replica| replica.healthy)
            .map(|replica| replica.handle.clone())
            .collect())
    }
}

/// Stops every replica and ingress.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "()")]
pub struct Shutdown;

nimbus::remote_message!(Shutdown);

impl Handler<Shutdown> for Controller {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: Shutdown, _: &mut Context<Self>) -> Self::Result {
        let state = self.state.clone();
        Box::pin(async move {
            // A restarted controller stops what it took back.
            restore(&state).await;
            let (applications, ingresses) = {
                let mut state = state.borrow_mut();
                state.shut_down = true;
                (
                    std::mem::take(&mut state.applications),
                    std::mem::take(&mut state.ingresses),
                )
            };
            let replicas = applications
                .into_iter()
                .flat_map(|running| running.replicas);
            stop_replicas(replicas.collect(), false).await;
            for (node, ingress, _) in ingresses {
                if let Err(e) = ingress.kill().await {
                    tracing::warn!(%node, "the HTTP ingress was not stopped: {e}");
                }
            }
            forget(&state).await;
        })
    }
}

/// One health round: every replica asked; the dead for good replaced.
async fn check_health(state: &Rc<RefCell<State>>) {
    let replicas: Vec<(String, ActorHandle<Replica>)> = state
        .borrow()
        .applications
        .iter()
        .flat_map(|running| {
            running
                .replicas
                .iter()
                .map(|replica| (running.app.name.clone(), replica.handle.clone()))
        })
        .collect();
    let checks = join_all(replicas.iter().map(|(_, handle)| async move {
        match handle.send_with_deadline(Health, HEALTH_TIMEOUT).await {
            Ok(Ok(ongoing)) => Ok(ongoing),
            Ok(Err(e)) => Err((e.to_string(), false)),
            Err(e @ (CallError::ActorDead { .. } | CallError::NodeLost { .. })) => {
                let gone = matches!(handle.death().await, Ok(Some(_)));
                Err((e.to_string(), gone))
            }
            Err(e) => Err((e.to_string(), false)),
        }
    }))
    .await;
    let mut gone = Vec::new();
    {
        let mut state = state.borrow_mut();
        for ((application, handle), check) in replicas.into_iter().zip(checks) {
            let Some(entry) = state
                .applications
                .iter_mut()
                .flat_map(|running| running.replicas.iter_mut())
                .find(|entry| entry.handle.id() == handle.id())
            else {
                continue;
            };
            match check {
                Ok(ongoing) => {
                    entry.healthy = true;
                    entry.error = None;
                    entry.ongoing = ongoing;
                }
                Err((error, dead)) => {
                    if entry.healthy {
                        tracing::warn!(%application, replica = %handle.id(), "unhealthy: {error}");
                    }
                    entry.healthy = false;
                    entry.error = Some(error);
                    if dead {
                        gone.push(handle.id());
                    }
                }
            }
        }
    }
    for id in gone {
        replace(state, id);
    }
}

/// Tells every ingress to listen (a restarted one starts again) and sends
/// it the routes; notes the requests waiting at them.
async fn publish(state: &Rc<RefCell<State>>) {
    let (routes, ingresses) = {
        let state = state.borrow();
        let ingresses: Vec<(String, ActorHandle<Ingress>)> = state
            .ingresses
            .iter()
            .map(|(node, handle, _)| (node.clone(), handle.clone()))
            .collect();
        (routes_of(&state), ingresses)
    };
    let sent = join_all(
        ingresses
            .iter()
            .map(|(node, ingress)| send_routes(node, ingress, routes.clone())),
    )
    .await;
    // Dead for good (lost with its node, which came back: a restarted
    // head, say): forgotten, so that the next round starts another there.
    for ((node, ingress), sent) in ingresses.iter().zip(&sent) {
        let lost = matches!(
            sent,
            Err(CallError::ActorDead { .. } | CallError::NodeLost { .. })
        );
        if lost && matches!(ingress.death().await, Ok(Some(_))) {
            tracing::info!(%node, "its HTTP ingress is dead: forgotten");
            state
                .borrow_mut()
                .ingresses
                .retain(|(_, kept, _)| kept.id() != ingress.id());
        }
    }
    for running in &mut state.borrow_mut().applications {
        running.queued = sent
            .iter()
            .flatten()
            .flatten()
            .filter(|(deployment, _)| *deployment == running.app.name)
            .map(|(_, count)| count)
            .sum();
    }
}

/// The routes of the running applications, as the ingresses take them.
fn routes_of(state: &State) -> Vec<RouteWire> {
    state
        .applications
        .iter()
        .map(|running| RouteWire {
            prefix: running.app.route_prefix.clone(),
            deployment: running.app.name.clone(),
            max_ongoing: running.app.max_ongoing,
            max_queued: running.app.max_queued,
            replicas: running
                .replicas
                .iter()
                .map(|replica| (replica.handle.clone(), replica.healthy))
                .collect(),
        })
        .collect()
}

/// Makes `node`'s ingress listen and take `routes`; answers the requests
/// waiting there per deployment. A failure is logged (the next round
/// sends them again).
async fn send_routes(
    node: &str,
    ingress: &ActorHandle<Ingress>,
    routes: Vec<RouteWire>,
) -> Result<Vec<(String, u32)>, CallError> {
    let sent = async {
        ingress
            .send_with_deadline(Listen, HEALTH_TIMEOUT)
            .await?
            .ok();
        ingress
            .send_with_deadline(SetRoutes(routes), HEALTH_TIMEOUT)
            .await
    };
    let sent = sent.await;
    if let Err(e) = &sent {
        tracing::warn!(%node, "the HTTP ingress did not take the routes: {e}");
    }
    sent
}
