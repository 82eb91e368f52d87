//! nimbus: Ray's distributed training stack, rebuilt in Rust as an actor system.
pub mod client;
pub mod cluster;
pub mod node;
pub mod transport;
pub mod wire;

/// The libtorch bindings nimbus is built against, so training code uses the
/// same version.
#[cfg(feature = "torch")]
pub use tch;
pub mod local;
