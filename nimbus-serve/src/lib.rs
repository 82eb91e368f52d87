//! nimbus Serve: models served over HTTP from replica actors on the same
//! cluster as training (Ray Serve).
//!
//! A user writes a [`Deployment`] (built once per replica from its init
//! arguments, called once per request with the decoded JSON body),
//! registers it ([`RegistryExt::deployment`]: replicas run the same
//! binary), starts [`Serve`] and runs [`Application`]s:
//!
//! 1. **Controller** (`controller/`): an actor that spawns the replicas,
//!    waits for their health, publishes the route table to the ingresses,
//!    health-checks replicas and replaces the dead ones; redeploying an
//!    application is a rolling update.
//! 2. **Ingress** (`ingress/`): an actor on every node running an HTTP
//!    server (axum, multi-threaded); the path picks the application, two
//!    random choices among its replicas (by the requests each has) pick
//!    the replica, and the request goes to it as an actor call.
//! 3. **Replica** (`replica.rs`): an actor hosting one instance of the
//!    deployment, running up to `max_ongoing_requests` calls at once and
//!    reporting its load in every answer.
//!
//! Bad input is answered, never fatal: a body that does not decode → 400
//! naming the deployment; an unknown path → 404; overload → 503 with
//! `Retry-After`; a handler's error → 400/500; a handler that panics → 500
//! for that request, and the replica keeps serving.
//!
//! ```no_run
//! use nimbus_serve::{Application, Deployment, HandlerError, HttpOptions, RegistryExt, Serve};
//!
//! struct Echo;
//! impl Deployment for Echo {
//!     const NAME: &'static str = "example.Echo";
//!     type Init = ();
//!     type Request = serde_json::Value;
//!     type Response = serde_json::Value;
//!     fn new(_: ()) -> Result<Self, String> {
//!         Ok(Echo)
//!     }
//!     async fn call(&self, request: serde_json::Value) -> Result<serde_json::Value, HandlerError> {
//!         Ok(request)
//!     }
//! }
//!
//! fn main() -> anyhow::Result<()> {
//!     let driver = nimbus::init(nimbus::actor::Registry::new().deployment::<Echo>())?;
//!     driver.block_on(async {
//!         let serve = Serve::start(HttpOptions::default()).await?;
//!         serve.run(Application::new::<Echo>(())?.route_prefix("/echo").num_replicas(2)).await?;
//!         // POST http://127.0.0.1:8000/echo with a JSON body: the body comes back.
//!         serve.shutdown().await?;
//!         Ok(())
//!     })
//! }
//! ```

mod batcher;
mod config;
mod controller;
mod deployment;
mod error;
mod handle;
mod ingress;
mod replica;
mod serve;
mod status;

pub use config::{
    Application, Autoscaling, Batching, HttpOptions, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_ONGOING,
    DEFAULT_MAX_QUEUED, DEFAULT_PORT, DEFAULT_REQUEST_TIMEOUT,
};
pub use controller::{
    Controller, ControllerArgs, Delete, Deploy, Replicas, Shutdown, Start, Status,
    CONTROLLER_RESTARTS, DRAIN_TIMEOUT, HEALTH_PERIOD, HEALTH_TIMEOUT, INGRESS_RESTARTS,
    REPLICA_RESTARTS, STARTUP_TIMEOUT,
};
pub use deployment::{Deployment, RegistryExt};
pub use error::{ControllerError, HandleError, HandlerError, ServeError};
pub use handle::{DeploymentHandle, MAX_ATTEMPTS};
pub use ingress::{
    Ingress, IngressArgs, Listen, RouteWire, SetRoutes, DOWN_HOLD, INGRESS_THREADS, RETRY_AFTER_S,
};
pub use replica::{Answer, Cancel, Drain, Health, HealthError, Replica, ReplicaArgs, Request};
pub use serve::{Serve, STATUS_TIMEOUT};
pub use status::{DeploymentStatus, IngressAddress, ReplicaStatus, ServeStatus};
