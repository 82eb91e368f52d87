//! Same-host channels: an ordered [`Channel`](super::Channel) between two
//! processes of one host runs over a Unix-domain socket instead of a QUIC
//! stream (no encryption, packets or acknowledgements to pay for: see the
//! floors in `benches/calibration.rs`).
//!
//! 1. **Offer.** An endpoint that accepts connections, and injects no
//!    packet faults, listens on a Unix-domain socket in the abstract
//!    namespace, named [`SOCKET_PREFIX`] and 16 random bytes: no file to
//!    create or leave behind, gone with the process, and private to its
//!    network namespace (simulated hosts in namespaces of their own never
//!    share one). Each QUIC connection it accepts gets a fresh
//!    [`KEY_LEN`]-byte key, sent in the `HelloReply` (inside TLS) with the
//!    socket's name and the host's boot id ([`LocalRoute`]).
//! 2. **Choice.** A dialer without packet faults whose boot id is the same
//!    opens its channels there: it connects, writes the key, then speaks
//!    the channel protocol as on a QUIC stream. When the socket cannot be
//!    reached (another network namespace), the connection remembers it and
//!    uses QUIC from then on. Plain requests always use QUIC.
//! 3. **Admission** (`server.rs`). The acceptor reads the key within
//!    `connect_timeout`, checks that the caller runs as its own user
//!    (`SO_PEERCRED`) and that the key is a live connection's; otherwise it
//!    drops the socket and logs why. An admitted channel is served as a
//!    stream of that connection: the same caller identity, request budget
//!    and rules.
//! 4. **Lifetime.** A channel lives no longer than its QUIC connection:
//!    when the connection closes, both ends end its local channels (their
//!    waiting requests fail as they would on QUIC) and the key is
//!    forgotten.

use std::sync::OnceLock;

use rand::RngCore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use crate::wire::LocalRoute;

/// Bytes of a connection's key.
pub(super) const KEY_LEN: usize = 32;

/// How the abstract names of nimbus sockets begin (`ss -xl` lists them).
pub(super) const SOCKET_PREFIX: &str = "nimbus-";

/// A connection's key.
pub(super) type Key = [u8; KEY_LEN];

/// This host's boot id (`/proc/sys/kernel/random/boot_id`); `None` where
/// the kernel does not say, and then no local channel is offered or used.
pub(super) fn host() -> Option<&'static str> {
    static HOST: OnceLock<Option<String>> = OnceLock::new();
    HOST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .map(|id| id.trim().to_string())
            .filter(|id| !id.is_empty())
    })
    .as_deref()
}

/// A fresh random key.
pub(super) fn key() -> Key {
    let mut key = [0u8; KEY_LEN];
    rand::rng().fill_bytes(&mut key);
    key
}

/// Step 1: listens on a new abstract socket; its name, and the listener.
pub(super) fn listen() -> std::io::Result<(String, UnixListener)> {
    use std::os::linux::net::SocketAddrExt;
    let mut suffix = [0u8; 16];
    rand::rng().fill_bytes(&mut suffix);
    let name: String = std::iter::once(SOCKET_PREFIX.to_string())
        .chain(suffix.iter().map(|b| format!("{b:02x}")))
        .collect();
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr)?;
    listener.set_nonblocking(true)?;
    Ok((name, UnixListener::from_std(listener)?))
}

/// Step 2: connects to `route`'s socket and presents its key.
pub(super) async fn connect(route: &LocalRoute) -> std::io::Result<UnixStream> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(route.socket.as_bytes())?;
    // Connecting to a Unix-domain socket completes at once or fails (a
    // full backlog fails with EAGAIN on a non-blocking socket).
    let stream = std::os::unix::net::UnixStream::connect_addr(&addr)?;
    stream.set_nonblocking(true)?;
    let mut stream = UnixStream::from_std(stream)?;
    stream.write_all(&route.key).await?;
    Ok(stream)
}

/// Why a local channel was not admitted (step 3).
#[derive(Debug, thiserror::Error)]
pub(super) enum Refused {
    /// It sent no key in time, or its socket failed.
    #[error("no key: {0}")]
    NoKey(std::io::Error),
    /// It runs as another user.
    #[error("the caller runs as uid {caller}, this process as uid {me}")]
    OtherUser {
        /// The caller's uid.
        caller: u32,
        /// Ours.
        me: u32,
    },
    /// Its key names no live connection.
    #[error("its key names no live connection")]
    UnknownKey,
}

/// Step 3, first half: the caller's key, once it runs as this user.
pub(super) async fn read_key(stream: &mut UnixStream) -> Result<Key, Refused> {
    let credentials = stream.peer_cred().map_err(Refused::NoKey)?;
    // SAFETY: a plain system call without arguments.
    let me = unsafe { libc::geteuid() };
    if credentials.uid() != me {
        return Err(Refused::OtherUser {
            caller: credentials.uid(),
            me,
        });
    }
    let mut key = [0u8; KEY_LEN];
    stream.read_exact(&mut key).await.map_err(Refused::NoKey)?;
    Ok(key)
}
