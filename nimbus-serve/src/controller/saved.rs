//! What the controller keeps in the head's store, so that a controller
//! started again (its process died, its node was lost, or the head
//! restarted with it) takes its applications, replicas and ingresses back
//! instead of starting empty while they serve on.
//!
//! 1. One record per `Serve`, `controller/<serve id>` in its job's
//!    `serve` records (`nimbus::library::Records`): MessagePack of
//!    [`Saved`].
//! 2. Written when a start, deploy or delete ends, and after each health
//!    round whose state differs from the last write; a write that fails
//!    (the head is down) is tried again after the next round.
//! 3. Read when the controller starts, before any round runs or any
//!    request changes anything: found (a restart), its state is restored
//!    (the replicas routed to at once and checked by the next round, the
//!    autoscalers resuming at the replicas' count). A read that fails is
//!    tried again at the next round or request.
//! 4. Deleted at `Shutdown`, after which nothing is written.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;

use nimbus::actor::ActorHandle;
use nimbus::library::Records;
use serde::{Deserialize, Serialize};

use super::autoscale::Autoscaler;
use super::{Controller, ReplicaEntry, Running, State};
use crate::config::Application;
use crate::ingress::Ingress;
use crate::replica::Replica;

/// The library name of Serve's records.
pub(super) const RECORDS: &str = "serve";

/// What one controller keeps (step 1).
#[derive(Serialize, Deserialize)]
struct Saved {
    me: Option<ActorHandle<Controller>>,
    deploys: u64,
    ingresses: Vec<(String, ActorHandle<Ingress>, Option<SocketAddr>)>,
    applications: Vec<SavedApplication>,
}

#[derive(Serialize, Deserialize)]
struct SavedApplication {
    app: Application,
    generation: u64,
    replicas: Vec<ActorHandle<Replica>>,
}

fn key(serve: u64) -> String {
    format!("controller/{serve:016x}")
}

/// Step 2: writes the state if it changed since the last write.
pub(super) async fn save(state: &Rc<RefCell<State>>) {
    let (bytes, serve) = {
        let state = state.borrow();
        if !state.restored || state.shut_down {
            return;
        }
        let saved = Saved {
            me: state.me.clone(),
            deploys: state.deploys,
            ingresses: state.ingresses.clone(),
            applications: state
                .applications
                .iter()
                .map(|running| SavedApplication {
                    app: running.app.clone(),
                    generation: running.generation,
                    replicas: running.replicas.iter().map(|r| r.handle.clone()).collect(),
                })
                .collect(),
        };
        match rmp_serde::to_vec_named(&saved) {
            Ok(bytes) => (bytes, state.serve),
            Err(e) => {
                tracing::warn!("the serve controller's state does not encode: {e}");
                return;
            }
        }
    };
    if state.borrow().last_saved.as_deref() == Some(bytes.as_slice()) {
        return;
    }
    let written = match Records::of_this_job(RECORDS) {
        Ok(records) => records.put(&key(serve), &bytes).await,
        Err(e) => Err(e),
    };
    match written {
        Ok(()) => state.borrow_mut().last_saved = Some(bytes),
        Err(e) => tracing::warn!("the serve controller's state is not saved yet: {e}"),
    }
}

/// Step 3: restores a saved state, once; false while it could not be read.
pub(super) async fn restore(state: &Rc<RefCell<State>>) -> bool {
    if state.borrow().restored {
        return true;
    }
    let serve = state.borrow().serve;
    let read = match Records::of_this_job(RECORDS) {
        Ok(records) => records.get(&key(serve)).await,
        Err(e) => Err(e),
    };
    let bytes = match read {
        Ok(bytes) => bytes,
        Err(e) => {
            tracing::warn!("the serve controller cannot read its saved state yet: {e}");
            return false;
        }
    };
    let mut state = state.borrow_mut();
    if state.restored {
        return true;
    }
    state.restored = true;
    let Some(bytes) = bytes else {
        return true; // a first start
    };
    let saved: Saved = match rmp_serde::from_slice(&bytes) {
        Ok(saved) => saved,
        Err(e) => {
            tracing::error!(
                "the serve controller's saved state does not decode, starting empty: {e}"
            );
            return true;
        }
    };
    state.last_saved = Some(bytes);
    state.me = saved.me.or(state.me.take());
    state.deploys = saved.deploys;
    state.ingresses = saved.ingresses;
    state.applications = saved
        .applications
        .into_iter()
        .map(|saved| Running {
            autoscaler: saved
                .app
                .autoscaling
                .map(|config| Autoscaler::resumed(config, saved.replicas.len() as u32)),
            app: saved.app,
            generation: saved.generation,
            replicas: saved
                .replicas
                .into_iter()
                .map(|handle| ReplicaEntry {
                    handle,
                    healthy: true,
                    error: None,
                    ongoing: 0.0,
                    replacing: false,
                })
                .collect(),
            starting: 0,
            queued: 0,
        })
        .collect();
    tracing::info!(
        applications = state.applications.len(),
        ingresses = state.ingresses.len(),
        "the serve controller took its saved state back"
    );
    true
}

/// Step 4.
pub(super) async fn forget(state: &Rc<RefCell<State>>) {
    let serve = state.borrow().serve;
    let deleted = match Records::of_this_job(RECORDS) {
        Ok(records) => records.delete(&key(serve)).await.map(drop),
        Err(e) => Err(e),
    };
    if let Err(e) = deleted {
        tracing::warn!("the serve controller's saved state is not deleted: {e}");
    }
}
