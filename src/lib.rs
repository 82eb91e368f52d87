//! nimbus: Ray's distributed training stack, rebuilt in Rust as an actor system.
pub mod client;
pub mod cluster;
pub mod node;
pub mod transport;
pub mod wire;
