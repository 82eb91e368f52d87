//! Same-host channels: an ordered [`Channel`](super::Channel), and plain
//! requests, between two processes of one host run over a Unix-domain
//! socket instead of QUIC streams (no encryption, packets or acknowledgements to pay for: see the
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
//!    opens its channels there: it connects, checks that the socket's
//!    listener runs as its own user (`SO_PEERCRED`: once an acceptor has
//!    exited, another user could bind its name; such a socket gets no key,
//!    and the route is dropped for QUIC), writes the key and, once
//!    admitted, trades shared-memory rings for large frames with the
//!    acceptor (`shm_ring.rs`), then speaks the channel protocol as on a
//!    QUIC stream. Its plain requests share
//!    one more such socket, opened at the first: they are marked
//!    unordered, so the acceptor handles each on its own and answers it
//!    when it is done (responses matched by id). When the socket cannot
//!    be reached (another network namespace), the connection remembers it
//!    and uses QUIC from then on. Raw test streams (`send_raw`) always
//!    use QUIC.
//! 3. **Admission** (`server/same_host.rs`). The acceptor reads the key within
//!    `connect_timeout` (at most [`MAX_UNADMITTED`] sockets wait for
//!    theirs at once), checks that the caller runs as its own user
//!    (`SO_PEERCRED`) and that the key is a live connection's; otherwise it
//!    drops the socket (counted in `nimbus_same_host_refused_total`, logged
//!    at debug: any process of the host can knock). It answers
//!    [`ADMITTED`], or [`BUSY`] past [`MAX_CHANNELS`] sockets of the
//!    connection. The dialer waits for the answer within its
//!    `connect_timeout`: a refusal (the socket closed) means QUIC from
//!    then on, `BUSY` or no answer in time QUIC for this channel. An
//!    admitted channel is served as a stream of that connection: the same
//!    caller identity, request budget and rules.
//! 4. **Lifetime.** A channel lives no longer than its QUIC connection:
//!    when the connection closes, both ends end its local channels (their
//!    waiting requests fail as they would on QUIC) and the key is
//!    forgotten. The acceptor never ends a socket otherwise, so a socket
//!    that ends while its connection is open means the acceptor's process
//!    is gone: its requests fail at once with `NodeLost`, well before
//!    QUIC's idle timeout would tell, and the connection drops the route
//!    (its later channels use QUIC: the name is free for others to bind).

use std::sync::OnceLock;

use rand::RngCore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use crate::wire::LocalRoute;

use super::shm_ring::{self, RingReader, RingWriter};

/// Bytes of a connection's key.
pub(super) const KEY_LEN: usize = 32;

/// How the abstract names of nimbus sockets begin (`ss -xl` lists them).
pub(super) const SOCKET_PREFIX: &str = "nimbus-";

/// A connection's key.
pub(super) type Key = [u8; KEY_LEN];

/// This host's boot id (`/proc/sys/kernel/random/boot_id`), read once;
/// `None` where the kernel does not say (and then no local channel is
/// offered or used). Also what the object store and directory ownership
/// call the host.
pub fn boot_id() -> Option<&'static str> {
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

/// The acceptor's answer to a key: admitted.
pub(super) const ADMITTED: u8 = 1;
/// The acceptor's answer to a key: the connection has [`MAX_CHANNELS`]
/// open already; use QUIC for this one.
pub(super) const BUSY: u8 = 0;

/// Same-host sockets one connection may have open at once (as many as
/// its QUIC streams).
pub(super) const MAX_CHANNELS: usize = 1024;

/// Sockets waiting for their key at once, past which more are dropped
/// unread (as `admission.rs` bounds QUIC handshakes).
pub(super) const MAX_UNADMITTED: usize = 64;

/// Why a dialer cannot use the same-host route now (step 2).
#[derive(Debug, thiserror::Error)]
pub(super) enum Unusable {
    /// Not reachable from here, or refused: QUIC from now on.
    #[error("{0}")]
    ForGood(std::io::Error),
    /// Not this time (a full backlog, a busy connection): QUIC for this
    /// channel.
    #[error("{0}")]
    ForNow(std::io::Error),
}

/// Step 2: connects to `route`'s socket, presents its key and waits for
/// the acceptor's answer, all within `timeout`.
pub(super) async fn connect(
    route: &LocalRoute,
    timeout: std::time::Duration,
) -> Result<LocalSocket, Unusable> {
    let name = format!("\0{}", route.socket);
    let dial = async {
        let mut stream = UnixStream::connect(&name)
            .await
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                    Unusable::ForGood(e)
                }
                _ => Unusable::ForNow(e),
            })?;
        let refused = |e: std::io::Error| Unusable::ForGood(e);
        let listener = stream.peer_cred().map_err(refused)?;
        // SAFETY: a plain system call without arguments.
        let me = unsafe { libc::geteuid() };
        if listener.uid() != me {
            return Err(refused(std::io::Error::other(format!(
                "the same-host socket {} is held by uid {}, not this process's user (uid {me}): \
                 it gets no key",
                route.socket,
                listener.uid()
            ))));
        }
        stream.write_all(&route.key).await.map_err(refused)?;
        let mut answer = [0u8; 1];
        stream.read_exact(&mut answer).await.map_err(refused)?;
        if answer[0] != ADMITTED {
            return Err(Unusable::ForNow(std::io::Error::other(
                "the connection has as many same-host channels as it may",
            )));
        }
        exchange_rings(stream, Side::Dialer)
            .await
            .map_err(Unusable::ForNow)
    };
    tokio::time::timeout(timeout, dial)
        .await
        .unwrap_or_else(|_| Err(Unusable::ForNow(std::io::ErrorKind::TimedOut.into())))
}

/// An admitted same-host socket and its two rings (`shm_ring.rs`).
pub(super) struct LocalSocket {
    pub(super) stream: UnixStream,
    /// The ring this end writes its large frames into.
    pub(super) out: RingWriter,
    /// The ring the peer writes its large frames into.
    pub(super) from_peer: RingReader,
}

/// Which end of a socket this is: the dialer hands its ring over first.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Dialer,
    Acceptor,
}

/// `shm_ring.rs`, step 1: each end makes its ring and hands it over.
pub(super) async fn exchange_rings(stream: UnixStream, side: Side) -> std::io::Result<LocalSocket> {
    let (out, fd) = shm_ring::create()?;
    let from_peer = if side == Side::Dialer {
        shm_ring::send_fd(&stream, &fd).await?;
        shm_ring::receive_fd(&stream).await?
    } else {
        let theirs = shm_ring::receive_fd(&stream).await?;
        shm_ring::send_fd(&stream, &fd).await?;
        theirs
    };
    drop(fd);
    Ok(LocalSocket {
        stream,
        out,
        from_peer: shm_ring::open(from_peer)?,
    })
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
    /// [`MAX_UNADMITTED`] sockets wait for their key already.
    #[error("{MAX_UNADMITTED} same-host sockets are waiting for their key already")]
    TooMany,
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// Medium finding 8 of #51: a listener of another user on a route's
    /// name (its acceptor gone) gets no key, and the route is dropped for
    /// good. Before, the key was written to it. Needs root (to run the
    /// listener as another user); elsewhere it says so and checks nothing.
    #[tokio::test]
    async fn a_listener_of_another_user_gets_no_key() {
        // SAFETY: a plain system call without arguments.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root to start a listener as another user");
            return;
        }
        let (name, listener) = listen().unwrap();
        drop(listener);
        let socket = std::ffi::CString::new(name.clone()).unwrap();
        let mut impostor = std::process::Command::new("sleep");
        impostor.arg("60").uid(65534).gid(65534);
        // SAFETY: socket, bind and listen are async-signal-safe system
        // calls, as pre_exec requires; the name was allocated before.
        unsafe {
            impostor.pre_exec(move || {
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                let mut addr: libc::sockaddr_un = std::mem::zeroed();
                addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
                let bytes = socket.as_bytes();
                for (slot, byte) in addr.sun_path[1..].iter_mut().zip(bytes) {
                    *slot = *byte as libc::c_char;
                }
                let len = std::mem::size_of::<libc::sa_family_t>() + 1 + bytes.len();
                let bound = libc::bind(fd, std::ptr::addr_of!(addr).cast(), len as u32);
                if fd < 0 || bound != 0 || libc::listen(fd, 8) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut impostor = impostor.spawn().unwrap();
        let route = LocalRoute {
            host: boot_id().unwrap_or_default().to_string(),
            socket: name,
            key: key().to_vec(),
        };
        let outcome = connect(&route, std::time::Duration::from_secs(5)).await;
        impostor.kill().unwrap();
        impostor.wait().unwrap();
        match outcome {
            Err(Unusable::ForGood(e)) => {
                assert!(e.to_string().contains("uid 65534"), "{e}")
            }
            Err(Unusable::ForNow(e)) => panic!("refused for now only: {e}"),
            Ok(_) => panic!("connected to another user's socket"),
        }
    }
}
