//! What a user configures: the HTTP ingresses ([`HttpOptions`]) and each
//! application ([`Application`]: a deployment type, its init arguments and
//! options, Ray Serve's names and defaults), checked before anything
//! starts.

use std::time::Duration;

use nimbus::cluster::{ResourceSet, CPU, GPU};
use serde::{Deserialize, Serialize};

use crate::deployment::Deployment;
use crate::error::ServeError;

/// Ray Serve's default `max_ongoing_requests`.
pub const DEFAULT_MAX_ONGOING: u32 = 5;
/// Requests each ingress queues per deployment while every replica is
/// full (Ray's default is unbounded; a bound answers 503 instead of
/// growing memory).
pub const DEFAULT_MAX_QUEUED: u32 = 1_000;
/// Ray Serve's default HTTP port.
pub const DEFAULT_PORT: u16 = 8000;
/// The largest request body taken by default (larger: 413).
pub const DEFAULT_MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
/// How long a request may take by default, queueing included (then 504).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Where and how the HTTP ingresses (one per node) listen.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HttpOptions {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) max_body_bytes: usize,
    pub(crate) request_timeout: Duration,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            host: "127.0.0.1".into(),
            port: DEFAULT_PORT,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }
}

impl HttpOptions {
    /// The address to listen on (default `127.0.0.1`; `0.0.0.0` for every
    /// interface).
    pub fn host(mut self, host: impl Into<String>) -> Self {
        self.host = host.into();
        self
    }

    /// The port (default 8000; 0: one chosen by each ingress, see
    /// `Serve::addresses`).
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// The largest request body (default 16 MiB).
    pub fn max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body_bytes = bytes;
        self
    }

    /// How long a request may take, queueing included (default 60 s).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    pub(crate) fn check(&self) -> Result<(), ServeError> {
        if self.max_body_bytes == 0 {
            return Err(setting("max_body_bytes", "must be at least 1".into()));
        }
        if self.request_timeout.is_zero() {
            return Err(setting("request_timeout", "must be longer than 0".into()));
        }
        Ok(())
    }
}

/// A deployment to run: its type, init arguments and options.
///
/// ```
/// # use nimbus_serve::{Application, Deployment, HandlerError};
/// # struct Echo;
/// # impl Deployment for Echo {
/// #     const NAME: &'static str = "example.Echo";
/// #     type Init = (); type Request = (); type Response = ();
/// #     fn new(_: ()) -> Result<Self, String> { Ok(Echo) }
/// #     async fn call(&self, _: ()) -> Result<(), HandlerError> { Ok(()) }
/// # }
/// let app = Application::new::<Echo>(())?.route_prefix("/echo").num_replicas(2).num_cpus(0.5);
/// # Ok::<(), nimbus_serve::ServeError>(())
/// ```
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Application {
    pub(crate) name: String,
    pub(crate) kind: String,
    #[serde(with = "serde_bytes")]
    pub(crate) init: Vec<u8>,
    pub(crate) route_prefix: String,
    pub(crate) num_replicas: u32,
    pub(crate) max_ongoing: u32,
    pub(crate) max_queued: u32,
    pub(crate) num_cpus: f64,
    pub(crate) num_gpus: f64,
    /// Custom resources each replica holds, beside its CPUs and GPUs.
    #[serde(default)]
    pub(crate) resources: ResourceSet,
    pub(crate) batching: Option<Batching>,
    pub(crate) autoscaling: Option<Autoscaling>,
    /// What each replica's `Deployment::reconfigure` takes, JSON text.
    #[serde(default)]
    pub(crate) user_config: Option<String>,
}

/// How an application's replica count follows its load
/// (`controller/autoscale.rs`): as many replicas as keep about
/// `target_ongoing_requests` requests on each, within `min_replicas` and
/// `max_replicas`, changed once the want has lasted `upscale_delay` (more)
/// or `downscale_delay` (fewer). Ray Serve's defaults: target 2, 30 s up,
/// 600 s down.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Autoscaling {
    pub(crate) min_replicas: u32,
    pub(crate) max_replicas: u32,
    pub(crate) target_ongoing_requests: f64,
    pub(crate) upscale_delay: Duration,
    pub(crate) downscale_delay: Duration,
}

impl Autoscaling {
    /// Between `min_replicas` (where it starts) and `max_replicas`. With
    /// `min_replicas` 0 it scales to zero once idle for the downscale
    /// delay; a request that arrives then waits at the ingress (up to
    /// `HttpOptions::request_timeout`) while a replica starts, at once.
    pub fn new(min_replicas: u32, max_replicas: u32) -> Self {
        Autoscaling {
            min_replicas,
            max_replicas,
            target_ongoing_requests: 2.0,
            upscale_delay: Duration::from_secs(30),
            downscale_delay: Duration::from_secs(600),
        }
    }

    /// Requests each replica should hold (default 2).
    pub fn target_ongoing_requests(mut self, requests: f64) -> Self {
        self.target_ongoing_requests = requests;
        self
    }

    /// How long more replicas must be wanted before they start (default 30 s).
    pub fn upscale_delay(mut self, delay: Duration) -> Self {
        self.upscale_delay = delay;
        self
    }

    /// How long fewer replicas must be wanted before some are drained and
    /// stopped (default 600 s).
    pub fn downscale_delay(mut self, delay: Duration) -> Self {
        self.downscale_delay = delay;
        self
    }

    fn check(&self) -> Result<(), ServeError> {
        if self.max_replicas == 0 {
            return Err(setting(
                "max_replicas",
                "must be at least 1 (min_replicas 0 scales to zero)".into(),
            ));
        }
        if self.max_replicas < self.min_replicas {
            return Err(setting(
                "max_replicas",
                format!(
                    "{} is below min_replicas {}",
                    self.max_replicas, self.min_replicas
                ),
            ));
        }
        let target = self.target_ongoing_requests;
        if !target.is_finite() || target <= 0.0 {
            return Err(setting(
                "target_ongoing_requests",
                format!("{target} is not a number above 0"),
            ));
        }
        Ok(())
    }
}

/// Dynamic batching of an application's requests in each replica
/// (`batcher.rs`).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Batching {
    pub(crate) max_batch_size: u32,
    pub(crate) max_wait: Duration,
}

impl Application {
    /// Deployment `D` built from `init` in each replica; named after `D`,
    /// served at `/`, one replica of 1 CPU by default.
    pub fn new<D: Deployment>(init: D::Init) -> Result<Self, ServeError> {
        let init = rmp_serde::to_vec(&init).map_err(|e| {
            setting(
                "init",
                format!("{} init arguments do not encode: {e}", D::NAME),
            )
        })?;
        Ok(Application {
            name: D::NAME.into(),
            kind: D::NAME.into(),
            init,
            route_prefix: "/".into(),
            num_replicas: 1,
            max_ongoing: DEFAULT_MAX_ONGOING,
            max_queued: DEFAULT_MAX_QUEUED,
            num_cpus: 1.0,
            num_gpus: 0.0,
            resources: ResourceSet::default(),
            batching: None,
            autoscaling: None,
            user_config: None,
        })
    }

    /// Its name (default: the deployment type's); deploying a name again
    /// replaces that application (a rolling update).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The path prefix it serves (default `/`).
    pub fn route_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.route_prefix = prefix.into();
        self
    }

    /// How many replicas (default 1).
    pub fn num_replicas(mut self, replicas: u32) -> Self {
        self.num_replicas = replicas;
        self
    }

    /// Requests one replica runs at once (default 5).
    pub fn max_ongoing_requests(mut self, requests: u32) -> Self {
        self.max_ongoing = requests;
        self
    }

    /// Requests each ingress queues while every replica is full (default
    /// 1,000); past that, 503.
    pub fn max_queued_requests(mut self, requests: u32) -> Self {
        self.max_queued = requests;
        self
    }

    /// CPUs each replica holds (default 1).
    pub fn num_cpus(mut self, cpus: f64) -> Self {
        self.num_cpus = cpus;
        self
    }

    /// GPUs each replica holds (default 0).
    pub fn num_gpus(mut self, gpus: f64) -> Self {
        self.num_gpus = gpus;
        self
    }

    /// A custom resource each replica holds (a node's `--resources`, such
    /// as `accelerator_type:A100`): replicas go only to nodes that offer
    /// it.
    pub fn resource(mut self, name: &str, amount: f64) -> Self {
        self.resources.set(name, amount);
        self
    }

    /// A config handed to each replica's `Deployment::reconfigure` once it
    /// is built (Ray Serve's `user_config`): a redeploy that changes only
    /// this updates the live replicas in place, without restarting them
    /// (a thresholds file, a model version to load, a feature flag).
    pub fn user_config(mut self, config: serde_json::Value) -> Self {
        self.user_config = Some(config.to_string());
        self
    }

    /// Whether `self` and `other` differ in their user config only.
    pub(crate) fn differs_only_in_config(&self, other: &Application) -> bool {
        self.user_config != other.user_config
            && Application {
                user_config: other.user_config.clone(),
                ..self.clone()
            } == *other
    }

    /// What each replica holds: its CPUs, GPUs and custom resources.
    pub(crate) fn replica_resources(&self) -> ResourceSet {
        let mut held = self.resources.clone();
        held.set(CPU, self.num_cpus);
        held.set(GPU, self.num_gpus);
        held
    }

    /// Batches requests in each replica (its `Deployment::call_batch`): up
    /// to `max_batch_size` gathered while the replica is busy, started at
    /// once when it is idle, none waiting longer than `max_wait` for a
    /// batch to start. `max_ongoing_requests` must be at least
    /// `max_batch_size`.
    pub fn batching(mut self, max_batch_size: u32, max_wait: Duration) -> Self {
        self.batching = Some(Batching {
            max_batch_size,
            max_wait,
        });
        self
    }

    /// Scales its replicas with their load (replacing `num_replicas`:
    /// it starts with `min_replicas`).
    pub fn autoscaling(mut self, autoscaling: Autoscaling) -> Self {
        self.autoscaling = Some(autoscaling);
        self
    }

    pub(crate) fn check(&self) -> Result<(), ServeError> {
        if let Some(autoscaling) = &self.autoscaling {
            autoscaling.check()?;
        }
        if let Some(batching) = self.batching {
            if batching.max_batch_size == 0 {
                return Err(setting("max_batch_size", "must be at least 1".into()));
            }
            if self.max_ongoing < batching.max_batch_size {
                return Err(setting(
                    "max_ongoing_requests",
                    format!(
                        "{} is below max_batch_size {}: a replica could never gather a full batch",
                        self.max_ongoing, batching.max_batch_size
                    ),
                ));
            }
        }
        let prefix = &self.route_prefix;
        if !prefix.starts_with('/') || (prefix.len() > 1 && prefix.ends_with('/')) {
            return Err(setting(
                "route_prefix",
                format!("{prefix:?} must start with / and not end with one (\"/\" alone serves every path)"),
            ));
        }
        if self.num_replicas == 0 {
            return Err(setting("num_replicas", "must be at least 1".into()));
        }
        if self.max_ongoing == 0 {
            return Err(setting("max_ongoing_requests", "must be at least 1".into()));
        }
        for (name, amount) in [("num_cpus", self.num_cpus), ("num_gpus", self.num_gpus)] {
            if !amount.is_finite() || amount < 0.0 {
                return Err(setting(
                    name,
                    format!("{amount} is not a number of at least 0"),
                ));
            }
        }
        for (name, amount) in self.resources.iter() {
            if name.is_empty() || name == CPU || name == GPU {
                return Err(setting(
                    "resource",
                    format!("{name:?} is not a custom resource's name (num_cpus and num_gpus set CPUs and GPUs)"),
                ));
            }
            if !amount.is_finite() || amount < 0.0 {
                return Err(setting(
                    "resource",
                    format!("{name}: {amount} is not a number of at least 0"),
                ));
            }
        }
        if self.name.is_empty() {
            return Err(setting("name", "must not be empty".into()));
        }
        Ok(())
    }
}

fn setting(setting: &'static str, detail: String) -> ServeError {
    ServeError::Setting { setting, detail }
}
