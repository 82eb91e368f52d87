//! Deployments: the user's type a replica hosts, registered by its stable
//! name in every process of the program (replicas run the same binary), and
//! its type-erased form the replica actor calls with a request's JSON body.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::{self, LocalBoxFuture};
use futures::FutureExt;
use nimbus::actor::Registry;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::HandlerError;

/// A model (or anything else) served over HTTP: each replica builds one
/// from the deployment's init arguments and calls it once per request.
///
/// Calls run concurrently on the replica's thread (up to the deployment's
/// `max_ongoing_requests`), so `call` takes `&self`: keep mutable state in
/// a `Cell` or `RefCell`. A request's JSON body (an empty body reads as
/// `null`) is decoded into `Request`; the `Response` is sent back as JSON.
///
/// ```
/// use nimbus_serve::{Deployment, HandlerError};
/// struct Echo;
/// impl Deployment for Echo {
///     const NAME: &'static str = "example.Echo";
///     type Init = ();
///     type Request = serde_json::Value;
///     type Response = serde_json::Value;
///     fn new(_: ()) -> Result<Self, String> {
///         Ok(Echo)
///     }
///     async fn call(&self, request: serde_json::Value) -> Result<serde_json::Value, HandlerError> {
///         Ok(request)
///     }
/// }
/// ```
pub trait Deployment: Sized + 'static {
    /// Stable name, the same in every build of the program that registers it.
    const NAME: &'static str;
    /// What each replica is built from (sent to every replica).
    type Init: Serialize + DeserializeOwned + Send + 'static;
    /// A request's body, decoded from JSON.
    type Request: DeserializeOwned + 'static;
    /// A response's body, encoded as JSON.
    type Response: Serialize + 'static;

    /// Builds a replica (loads the model). An `Err` fails the deployment
    /// with its text.
    fn new(init: Self::Init) -> Result<Self, String>;

    /// Answers one request.
    fn call(
        &self,
        request: Self::Request,
    ) -> impl Future<Output = Result<Self::Response, HandlerError>>;

    /// Answers a batch of requests, one result per request in order (used
    /// when the application is deployed with `Application::batching`). The
    /// default calls [`call`](Self::call) on each, concurrently; a model
    /// overrides it to run one forward pass over the whole batch.
    fn call_batch(
        &self,
        requests: Vec<Self::Request>,
    ) -> impl Future<Output = Vec<Result<Self::Response, HandlerError>>> {
        future::join_all(requests.into_iter().map(|request| self.call(request)))
    }

    /// Whether this replica can serve (asked every health period); an
    /// `Err` takes it out of routing until a later check passes.
    fn check_health(&self) -> Result<(), String> {
        Ok(())
    }

    /// Takes the application's user config (`Application::user_config`,
    /// Ray Serve's `reconfigure`): once when the replica is built, and
    /// again on each live replica whenever a redeploy changes only the
    /// config, without a restart. An `Err` fails the replica's build, or
    /// the redeploy (whose config is then taken back from the replicas
    /// that had it). Calls run on: keep what it sets in a `Cell` or
    /// `RefCell`. The default ignores the config.
    fn reconfigure(&self, config: serde_json::Value) -> Result<(), String> {
        let _ = config;
        Ok(())
    }
}

/// A request's outcome as HTTP: a status and a JSON body.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
}

impl Outcome {
    pub(crate) fn error(status: u16, message: &str) -> Self {
        Outcome {
            status,
            body: serde_json::json!({ "error": message })
                .to_string()
                .into_bytes(),
        }
    }
}

/// A deployment built in its replica, behind its erased calls.
pub(crate) trait Hosted {
    /// Decodes `body`, calls the deployment, encodes its answer; a panic
    /// of the user's code is a 500 for this request only.
    fn call(&self, body: &[u8]) -> LocalBoxFuture<'static, Outcome>;
    /// The same for a batch: one outcome per body, in order.
    fn call_batch(&self, bodies: Vec<Vec<u8>>) -> LocalBoxFuture<'static, Vec<Outcome>>;
    /// The deployment's health check.
    fn check_health(&self) -> Result<(), String>;
    /// Hands the deployment its user config, JSON text.
    fn reconfigure(&self, config: &str) -> Result<(), String>;
}

struct Typed<D>(Rc<D>);

impl<D: Deployment> Hosted for Typed<D> {
    fn call(&self, body: &[u8]) -> LocalBoxFuture<'static, Outcome> {
        let request = match decode::<D>(body) {
            Ok(request) => request,
            Err(outcome) => return future::ready(outcome).boxed_local(),
        };
        let deployment = self.0.clone();
        let answer = async move { deployment.call(request).await };
        CaughtPanic(answer.boxed_local())
            .map(|answered| match answered {
                Ok(result) => encode::<D>(result),
                Err(panic) => Outcome::error(500, &format!("the handler panicked: {panic}")),
            })
            .boxed_local()
    }

    fn call_batch(&self, bodies: Vec<Vec<u8>>) -> LocalBoxFuture<'static, Vec<Outcome>> {
        let mut outcomes: Vec<Option<Outcome>> = Vec::with_capacity(bodies.len());
        let (mut requests, mut slots) = (Vec::new(), Vec::new());
        for body in &bodies {
            match decode::<D>(body) {
                Ok(request) => {
                    slots.push(outcomes.len());
                    requests.push(request);
                    outcomes.push(None);
                }
                Err(outcome) => outcomes.push(Some(outcome)),
            }
        }
        let deployment = self.0.clone();
        async move {
            let count = requests.len();
            if count > 0 {
                let answer = async move { deployment.call_batch(requests).await };
                let answered = CaughtPanic(answer.boxed_local()).await;
                let failed = |message: String| {
                    slots
                        .iter()
                        .map(move |&slot| (slot, Outcome::error(500, &message)))
                };
                let answers: Vec<(usize, Outcome)> = match answered {
                    Ok(results) if results.len() == count => slots
                        .iter()
                        .zip(results)
                        .map(|(&slot, result)| (slot, encode::<D>(result)))
                        .collect(),
                    Ok(results) => failed(format!(
                        "{}::call_batch answered {} results for {count} requests",
                        D::NAME,
                        results.len()
                    ))
                    .collect(),
                    Err(panic) => failed(format!("the batch handler panicked: {panic}")).collect(),
                };
                for (slot, outcome) in answers {
                    outcomes[slot] = Some(outcome);
                }
            }
            outcomes
                .into_iter()
                .map(|outcome| outcome.unwrap_or_else(|| Outcome::error(500, "no answer")))
                .collect()
        }
        .boxed_local()
    }

    fn check_health(&self) -> Result<(), String> {
        nimbus::library::catch_panic(|| self.0.check_health())
            .unwrap_or_else(|panic| Err(format!("the health check panicked: {panic}")))
    }

    fn reconfigure(&self, config: &str) -> Result<(), String> {
        let config = serde_json::from_str(config)
            .map_err(|e| format!("its user config is not JSON: {e}"))?;
        nimbus::library::catch_panic(|| self.0.reconfigure(config))
            .unwrap_or_else(|panic| Err(format!("reconfigure panicked: {panic}")))
            .map_err(|e| format!("{}::reconfigure refused the user config: {e}", D::NAME))
    }
}

/// A request body decoded for `D` (an empty body reads as `null`), or
/// the 400 that says why not.
fn decode<D: Deployment>(body: &[u8]) -> Result<D::Request, Outcome> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        &b"null"[..]
    } else {
        body
    };
    serde_json::from_slice(body).map_err(|e| {
        Outcome::error(
            400,
            &format!("the request body is not a valid {} request: {e}", D::NAME),
        )
    })
}

/// A handler's result as HTTP.
fn encode<D: Deployment>(result: Result<D::Response, HandlerError>) -> Outcome {
    match result {
        Ok(response) => match serde_json::to_vec(&response) {
            Ok(body) => Outcome { status: 200, body },
            Err(e) => Outcome::error(500, &format!("the response could not be encoded: {e}")),
        },
        Err(HandlerError::BadRequest(message)) => Outcome::error(400, &message),
        Err(HandlerError::Failed(message)) => Outcome::error(500, &message),
    }
}

/// A future whose panics, in any poll, are its output's `Err` (the text),
/// caught as `nimbus::library::catch_panic` does, so the worker lives on.
struct CaughtPanic<T>(LocalBoxFuture<'static, T>);

impl<T> Future for CaughtPanic<T> {
    type Output = Result<T, String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = AssertUnwindSafe(&mut self.0);
        match nimbus::library::catch_panic(move || { inner }.0.as_mut().poll(cx)) {
            Ok(Poll::Ready(value)) => Poll::Ready(Ok(value)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

/// Builds a deployment from its init arguments (MessagePack).
type Build = Arc<dyn Fn(&[u8]) -> Result<Box<dyn Hosted>, String> + Send + Sync>;

/// The deployments a program registered, by name (its table in the
/// [`Registry`]).
#[derive(Clone, Default)]
pub(crate) struct DeploymentTable(HashMap<&'static str, Build>);

impl DeploymentTable {
    /// Builds deployment `name` from `init`, in this process.
    pub(crate) fn build(name: &str, init: &[u8]) -> Result<Box<dyn Hosted>, String> {
        let registry = nimbus::library::registry().ok_or("this worker is not initialised")?;
        let build = registry
            .table::<DeploymentTable>()
            .and_then(|table| table.0.get(name).cloned())
            .ok_or_else(|| {
                format!("this binary registers no deployment {name} (Registry::deployment)")
            })?;
        nimbus::library::catch_panic(|| build(init))
            .unwrap_or_else(|panic| Err(format!("its constructor panicked: {panic}")))
    }
}

/// Registers deployments on a program's [`Registry`].
pub trait RegistryExt {
    /// Registers deployment type `D`, so replicas (which run this binary)
    /// can build it.
    fn deployment<D: Deployment>(self) -> Self;
}

impl RegistryExt for Registry {
    fn deployment<D: Deployment>(self) -> Self {
        let build: Build = Arc::new(|init: &[u8]| {
            let init: D::Init = rmp_serde::from_slice(init)
                .map_err(|e| format!("its init arguments do not decode: {e}"))?;
            let hosted: Box<dyn Hosted> = Box::new(Typed(Rc::new(D::new(init)?)));
            Ok(hosted)
        });
        self.extend(|table: &mut DeploymentTable| {
            table.0.insert(D::NAME, build);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sums exactly three numbers.
    struct Sum;

    impl Deployment for Sum {
        const NAME: &'static str = "tests.Sum";
        type Init = ();
        type Request = Vec<f64>;
        type Response = f64;

        fn new(_: ()) -> Result<Self, String> {
            Ok(Sum)
        }

        async fn call(&self, numbers: Vec<f64>) -> Result<f64, HandlerError> {
            match numbers.len() {
                3 => Ok(numbers.iter().sum()),
                n => Err(HandlerError::BadRequest(format!("3 numbers, not {n}"))),
            }
        }
    }

    /// A seeded generator (xorshift), so a failure is repeatable.
    struct Seeded(u64);

    impl Seeded {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    /// Bytes that matter to JSON.
    const JSON_BYTES: &[u8] = b"{}[]\":,.-+e0123456789 \n\\tnul\xff\x00";

    /// The request decoding, fuzzed: bodies mutated from valid and
    /// invalid JSON (bytes flipped, set to JSON's own, inserted, deleted,
    /// ranges repeated) are answered 200 or 400 with a JSON body, singly
    /// and in batches, never a panic (which would be a 500).
    #[test]
    fn any_body_is_answered_200_or_400_with_json() {
        let hosted = Typed(Rc::new(Sum));
        let seeds: [&[u8]; 5] = [
            b"[1, 2, 3.5]",
            b"[1e308, -0.0, 2]",
            b"{\"a\": [1]}",
            b"",
            b"null",
        ];
        let mut random = Seeded(0x5eed);
        let mut bodies = Vec::new();
        for _ in 0..20_000 {
            let mut body = seeds[random.below(seeds.len())].to_vec();
            for _ in 0..=random.below(4) {
                let at = random.below(body.len() + 1);
                match random.below(4) {
                    0 if at < body.len() => body[at] ^= 1 << random.below(8),
                    1 => body.insert(at, JSON_BYTES[random.below(JSON_BYTES.len())]),
                    2 if at < body.len() => drop(body.remove(at)),
                    _ => {
                        let end = (at + random.below(8)).min(body.len());
                        let repeated = body[at..end].repeat(random.below(64));
                        body.splice(at..at, repeated);
                    }
                }
            }
            let outcome = futures::executor::block_on(hosted.call(&body));
            check(&body, &outcome);
            bodies.push(body);
        }
        for batch in bodies.chunks(16).take(200) {
            let outcomes = futures::executor::block_on(hosted.call_batch(batch.to_vec()));
            assert_eq!(outcomes.len(), batch.len());
            for (body, outcome) in batch.iter().zip(&outcomes) {
                check(body, outcome);
            }
        }
    }

    fn check(body: &[u8], outcome: &Outcome) {
        assert!(
            matches!(outcome.status, 200 | 400),
            "{:?} -> {} {}",
            String::from_utf8_lossy(body),
            outcome.status,
            String::from_utf8_lossy(&outcome.body)
        );
        assert!(
            serde_json::from_slice::<serde_json::Value>(&outcome.body).is_ok(),
            "{:?} -> a body that is not JSON: {:?}",
            String::from_utf8_lossy(body),
            String::from_utf8_lossy(&outcome.body)
        );
    }
}
