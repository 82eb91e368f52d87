//! Model composition: a deployment calls another application's deployment
//! through a [`DeploymentHandle`] (Ray Serve's `DeploymentHandle`), from
//! inside its own replica, without going through HTTP.
//!
//! 1. Each replica knows its controller (`ReplicaArgs::controller`, kept
//!    for the replica's thread when it is built).
//! 2. A call asks the controller for the target application's healthy
//!    replicas ([`Replicas`]), kept for [`HEALTH_PERIOD`], then sends the
//!    request straight to one of them (two drawn at random, the one this
//!    handle has fewer calls on), as an ingress does.
//! 3. A replica that is full answers at once and another is tried; one
//!    that cannot be reached is left out, the replicas are asked again,
//!    and another is tried; up to [`MAX_ATTEMPTS`] tries in all.

use std::cell::RefCell;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::time::Instant;

use nimbus::actor::ActorHandle;
use nimbus::cluster::ActorId;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::controller::{Controller, Replicas, HEALTH_PERIOD};
use crate::deployment::Deployment;
use crate::error::HandleError;
use crate::replica::{Answer, Replica, Request};

/// How many replicas one call tries before it fails.
pub const MAX_ATTEMPTS: u32 = 8;

thread_local! {
    /// The controller of the replica this thread hosts (step 1).
    static CONTROLLER: RefCell<Option<ActorHandle<Controller>>> = const { RefCell::new(None) };
}

/// Step 1: the replica on this thread is `controller`'s.
pub(crate) fn set_controller(controller: Option<ActorHandle<Controller>>) {
    CONTROLLER.with(|slot| *slot.borrow_mut() = controller);
}

/// Calls application `application`'s deployment `D` from inside a
/// replica's `call` (an ensemble, a pipeline of models).
///
/// ```no_run
/// # use nimbus_serve::{Deployment, DeploymentHandle, HandlerError};
/// # struct Model;
/// # impl Deployment for Model {
/// #     const NAME: &'static str = "example.Model";
/// #     type Init = (); type Request = f32; type Response = f32;
/// #     fn new(_: ()) -> Result<Self, String> { Ok(Model) }
/// #     async fn call(&self, x: f32) -> Result<f32, HandlerError> { Ok(x) }
/// # }
/// struct Pipeline(DeploymentHandle<Model>);
/// # impl Deployment for Pipeline {
/// #     const NAME: &'static str = "example.Pipeline";
/// #     type Init = (); type Request = f32; type Response = f32;
/// #     fn new(_: ()) -> Result<Self, String> { Ok(Pipeline(DeploymentHandle::new("model"))) }
/// async fn call(&self, x: f32) -> Result<f32, HandlerError> {
///     let y = self.0.call(&x).await.map_err(|e| HandlerError::Failed(e.to_string()))?;
///     Ok(y + 1.0)
/// }
/// # }
/// ```
pub struct DeploymentHandle<D: Deployment> {
    application: String,
    /// The replicas last asked for, when, and this handle's calls on each.
    replicas: RefCell<Option<(Instant, Vec<ActorHandle<Replica>>)>>,
    in_flight: RefCell<HashMap<ActorId, u32>>,
    deployment: PhantomData<fn() -> D>,
}

impl<D: Deployment> DeploymentHandle<D> {
    /// A handle on the application named `application` (its
    /// `Application::name`).
    pub fn new(application: impl Into<String>) -> Self {
        DeploymentHandle {
            application: application.into(),
            replicas: RefCell::new(None),
            in_flight: RefCell::default(),
            deployment: PhantomData,
        }
    }

    /// Sends `request` to one of the application's replicas (steps 2-3)
    /// and decodes its answer.
    pub async fn call(&self, request: &D::Request) -> Result<D::Response, HandleError>
    where
        D::Request: Serialize,
        D::Response: DeserializeOwned,
    {
        let application = &self.application;
        let body = serde_json::to_vec(request).map_err(|e| HandleError::Encode {
            application: application.clone(),
            detail: e.to_string(),
        })?;
        let mut last = String::from("every replica was full");
        for attempt in 0..MAX_ATTEMPTS {
            let replica = self.pick(attempt > 0).await?;
            *self.in_flight.borrow_mut().entry(replica.id()).or_default() += 1;
            let request = Request {
                id: rand::random(),
                body: body.clone(),
            };
            let answer = replica.send(request).await;
            if let Some(count) = self.in_flight.borrow_mut().get_mut(&replica.id()) {
                *count = count.saturating_sub(1);
            }
            match answer {
                Ok(Answer::Done { status, body, .. }) if (200..300).contains(&status) => {
                    return serde_json::from_slice(&body).map_err(|e| HandleError::Decode {
                        application: application.clone(),
                        detail: e.to_string(),
                    });
                }
                Ok(Answer::Done { status, body, .. }) => {
                    return Err(HandleError::Status {
                        application: application.clone(),
                        status,
                        body: String::from_utf8_lossy(&body).into_owned(),
                    })
                }
                Ok(Answer::Full { .. }) => {}
                Err(e) => {
                    last = format!("replica {}: {e}", replica.id());
                    self.replicas.borrow_mut().take();
                }
            }
        }
        Err(HandleError::Unavailable {
            application: application.clone(),
            attempts: MAX_ATTEMPTS,
            last,
        })
    }

    /// Step 2: a replica, asking the controller first if the replicas
    /// known are older than the health period (or `again`).
    async fn pick(&self, again: bool) -> Result<ActorHandle<Replica>, HandleError> {
        let known = self
            .replicas
            .borrow()
            .as_ref()
            .filter(|(at, replicas)| !again && at.elapsed() < HEALTH_PERIOD && !replicas.is_empty())
            .map(|(_, replicas)| replicas.clone());
        let replicas = match known {
            Some(replicas) => replicas,
            None => {
                let replicas = self.ask_controller().await?;
                *self.replicas.borrow_mut() = Some((Instant::now(), replicas.clone()));
                replicas
            }
        };
        let in_flight = self.in_flight.borrow();
        let load = |replica: &ActorHandle<Replica>| in_flight.get(&replica.id()).copied();
        let (a, b) = (
            &replicas[rand::random::<u32>() as usize % replicas.len()],
            &replicas[rand::random::<u32>() as usize % replicas.len()],
        );
        Ok(if load(b).unwrap_or(0) < load(a).unwrap_or(0) {
            b.clone()
        } else {
            a.clone()
        })
    }

    /// The application's healthy replicas, as its controller knows them;
    /// at least one.
    async fn ask_controller(&self) -> Result<Vec<ActorHandle<Replica>>, HandleError> {
        let controller = CONTROLLER
            .with(|slot| slot.borrow().clone())
            .ok_or(HandleError::NotInReplica)?;
        let replicas = controller
            .send(Replicas(self.application.clone()))
            .await
            .map_err(|e| HandleError::Controller(e.to_string()))?
            .map_err(|e| HandleError::Controller(e.to_string()))?;
        if replicas.is_empty() {
            return Err(HandleError::Unavailable {
                application: self.application.clone(),
                attempts: 0,
                last: "it has no healthy replica".into(),
            });
        }
        Ok(replicas)
    }
}
