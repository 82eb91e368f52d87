//! QUIC transport between nimbus processes: one [`Endpoint`] per process,
//! mutually authenticated connections on demand, one stream per request.
//!
//! This layer moves opaque request and response bodies; it knows nothing of
//! actors or the control plane. The node layer gives it a [`RequestHandler`]
//! for what arrives, and calls [`Connection::request`] for what leaves.
//!
//! ```no_run
//! # async fn demo(token: nimbus::transport::JoinToken) -> anyhow::Result<()> {
//! use nimbus::transport::{Credentials, Endpoint, RequestOptions, TransportConfig};
//! use nimbus::wire::{Incarnation, NodeIdentity, PeerIdentity, PeerRole};
//!
//! let me = PeerIdentity {
//!     role: PeerRole::Client,
//!     identity: NodeIdentity { name: "my-tool".into(), incarnation: Incarnation::fresh() },
//! };
//! let credentials = Credentials::issue(&token, "my-tool")?;
//! let endpoint = Endpoint::client(me, &credentials, TransportConfig::default())?;
//! let head = endpoint.connect("127.0.0.1:6379".parse()?, None).await?;
//! let reply = head.request(b"raw body".to_vec(), RequestOptions::control()).await;
//! # Ok(()) }
//! ```

mod channel;
mod config;
mod connection;
mod credentials;
mod endpoint;
mod error;
pub mod faults;
mod server;

pub use channel::{Channel, PendingReply};
pub use config::{RequestOptions, TransportConfig};
pub use connection::Connection;
pub use credentials::{CredentialError, Credentials, JoinToken};
pub use endpoint::Endpoint;
pub use error::{ConnectError, EndpointError, FaultPlanError, NoPacketFaults, RequestError};
pub use faults::{FaultCounters, FaultCounts, PacketFaults, PacketRule};
pub use server::{HandlerError, RequestHandler};
