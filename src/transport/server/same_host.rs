//! Same-host peers: connections accepted on the node's local socket
//! (`local.rs`), admitted by key and served as QUIC streams are (steps 3
//! to 5 of `mod.rs`).

use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::debug;

use super::stream::StreamTask;
use super::RequestHandler;
use crate::transport::answer::Direct;
use crate::transport::frames::LocalFrames;
use crate::transport::local;
use crate::transport::tickets::Caller;
use crate::transport::Endpoint;

/// A connection admitted to this endpoint's same-host socket
/// (`local.rs`): who it is, and what its channels there share with its
/// QUIC streams.
#[derive(Clone)]
pub(in crate::transport) struct LocalAdmission {
    pub(super) quic: quinn::Connection,
    pub(super) peer: Caller,
    pub(super) budget: Arc<Semaphore>,
    /// Its open same-host sockets ([`local::MAX_CHANNELS`]).
    pub(super) channels: Arc<Semaphore>,
}

/// A connection's same-host key, forgotten when the connection ends.
pub(super) struct LocalKey {
    pub(super) endpoint: Endpoint,
    pub(super) key: local::Key,
}

impl Drop for LocalKey {
    fn drop(&mut self) {
        if let Some(offer) = self.endpoint.local() {
            offer.admitted.remove(&self.key);
        }
    }
}

/// Admits channels to this endpoint's same-host socket (`local.rs`, step
/// 3) until aborted (when the endpoint closes): each is served as a stream of the
/// connection its key names, and ends with that connection.
pub(in crate::transport) async fn accept_local(
    endpoint: Endpoint,
    listener: tokio::net::UnixListener,
    handler: Arc<dyn RequestHandler>,
) {
    let unadmitted = Arc::new(Semaphore::new(local::MAX_UNADMITTED));
    let mut backoff = ACCEPT_BACKOFF_MIN;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, say: wait, as the error stays
                // until some are closed.
                debug!("cannot accept a same-host channel ({e}); trying again in {backoff:?}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        backoff = ACCEPT_BACKOFF_MIN;
        let Ok(waiting) = unadmitted.clone().try_acquire_owned() else {
            local_refused(&local::Refused::TooMany);
            continue;
        };
        tokio::spawn(serve_local(
            endpoint.clone(),
            stream,
            handler.clone(),
            waiting,
        ));
    }
}

/// How long the same-host accept loop waits after a failed accept: from
/// this, doubling up to [`ACCEPT_BACKOFF_MAX`].
pub(super) const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
pub(super) const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Admits one same-host socket (`local.rs`, step 3), holding `waiting`
/// until it is, then serves it until it or its connection ends.
pub(super) async fn serve_local(
    endpoint: Endpoint,
    mut stream: tokio::net::UnixStream,
    handler: Arc<dyn RequestHandler>,
    waiting: OwnedSemaphorePermit,
) {
    let timeout = endpoint.config().connect_timeout;
    let admitted = match tokio::time::timeout(timeout, local::read_key(&mut stream)).await {
        Ok(Ok(key)) => endpoint
            .local()
            .and_then(|offer| offer.admitted.get(&key).map(|a| a.clone()))
            .ok_or(local::Refused::UnknownKey),
        Ok(Err(refused)) => Err(refused),
        Err(_) => Err(local::Refused::NoKey(std::io::ErrorKind::TimedOut.into())),
    };
    drop(waiting);
    let admitted = match admitted {
        Ok(admitted) => admitted,
        Err(refusal) => return local_refused(&refusal),
    };
    let Ok(_open) = admitted.channels.clone().try_acquire_owned() else {
        let _ = stream.write_all(&[local::BUSY]).await;
        return;
    };
    if stream.write_all(&[local::ADMITTED]).await.is_err() {
        return;
    }
    let rings = local::exchange_rings(stream, local::Side::Acceptor);
    let socket = match tokio::time::timeout(timeout, rings).await {
        Ok(Ok(socket)) => socket,
        Ok(Err(e)) => return debug!("a same-host channel's rings failed: {e}"),
        Err(_) => return debug!("a same-host channel's rings did not come within {timeout:?}"),
    };
    let quic = admitted.quic.clone();
    let task = StreamTask {
        endpoint,
        quic: admitted.quic,
        peer: admitted.peer,
        handler,
        budget: admitted.budget,
    };
    let (recv, send) = socket.stream.into_split();
    let recv = LocalFrames::new(recv, socket.from_peer);
    let config = task.endpoint.config();
    let direct = Arc::new(Direct::new(
        send,
        socket.out,
        config.max_frame_bytes,
        config.request_read_timeout,
    ));
    tokio::select! {
        () = task.run_local(direct, recv) => {}
        _ = quic.closed() => {}
    }
}

/// A same-host socket not admitted: counted, and logged at debug only
/// (any process of the host can knock on the socket).
pub(super) fn local_refused(refusal: &local::Refused) {
    metrics::counter!("nimbus_same_host_refused_total").increment(1);
    debug!("refused a same-host channel: {refusal}");
}
