//! The driver's side: [`Serve`] starts serving on the cluster (a
//! controller and an HTTP ingress per node), runs applications, answers
//! their status, and stops everything it started.

use std::net::SocketAddr;
use std::time::Duration;

use nimbus::actor::{self, ActorHandle, CallError, SpawnOptions};

use crate::config::{Application, HttpOptions};
use crate::controller::{
    Controller, ControllerArgs, Delete, Deploy, Shutdown, Start, CONTROLLER_RESTARTS,
    STARTUP_TIMEOUT,
};
use crate::error::ServeError;
use crate::status::{IngressAddress, ServeStatus};

/// How long the controller has to answer a status request.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(10);

/// Serving on a cluster: its controller and ingresses. Dropping it leaves
/// them running with the job (they end with it); [`Serve::shutdown`]
/// stops them now.
pub struct Serve {
    controller: ActorHandle<Controller>,
    ingresses: Vec<IngressAddress>,
}

impl Serve {
    /// Starts a controller and an HTTP ingress on every alive node; returns
    /// once every ingress listens.
    pub async fn start(http: HttpOptions) -> Result<Serve, ServeError> {
        http.check()?;
        let args = ControllerArgs {
            http,
            serve: rand::random(),
        };
        let options = SpawnOptions::default()
            .num_cpus(0.0)
            .max_restarts(CONTROLLER_RESTARTS);
        let controller = actor::spawn::<Controller>(args, options)
            .await
            .map_err(|source| ServeError::Spawn {
                what: "the serve controller".into(),
                source,
            })?;
        let failed = match controller.send(Start(controller.clone())).await {
            Ok(Ok(ingresses)) => {
                return Ok(Serve {
                    controller,
                    ingresses,
                })
            }
            Ok(Err(refused)) => ServeError::from(refused),
            Err(source) => call("the serve controller (start)", source),
        };
        let _ = controller.kill().await;
        Err(failed)
    }

    /// The ingresses' addresses, one per node, as at the start (nodes that
    /// join later get one too: [`status`](Self::status) lists them all).
    pub fn addresses(&self) -> Vec<SocketAddr> {
        self.ingresses
            .iter()
            .map(|ingress| ingress.address)
            .collect()
    }

    /// Deploys `app` and returns once its replicas are healthy and every
    /// ingress routes to them; an application of the same name is
    /// replaced (its replicas drained first).
    pub async fn run(&self, app: Application) -> Result<(), ServeError> {
        app.check()?;
        let what = format!("the serve controller (deploying {})", app.name);
        self.controller
            .send_with_deadline(Deploy(app), STARTUP_TIMEOUT * 2)
            .await
            .map_err(|source| call(&what, source))??;
        Ok(())
    }

    /// Stops application `name` (its replicas drained first).
    pub async fn delete(&self, name: &str) -> Result<(), ServeError> {
        let what = format!("the serve controller (deleting {name})");
        self.controller
            .send(Delete(name.to_string()))
            .await
            .map_err(|source| call(&what, source))??;
        Ok(())
    }

    /// The ingresses and each application's replicas.
    pub async fn status(&self) -> Result<ServeStatus, ServeError> {
        self.controller
            .send_with_deadline(crate::controller::Status, STATUS_TIMEOUT)
            .await
            .map_err(|source| call("the serve controller (status)", source))
    }

    /// Stops every replica, ingress and the controller.
    pub async fn shutdown(self) -> Result<(), ServeError> {
        self.controller
            .send(Shutdown)
            .await
            .map_err(|source| call("the serve controller (shutdown)", source))?;
        self.controller
            .kill()
            .await
            .map_err(|source| call("the serve controller (stop)", source))
    }
}

fn call(what: &str, source: CallError) -> ServeError {
    ServeError::Call {
        what: what.into(),
        source,
    }
}
