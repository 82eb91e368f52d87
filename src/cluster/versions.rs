//! What a node runs, stated when it joins: the versions that must agree
//! across a cluster, and those an operator wants to see.
//!
//! At join:
//! 1. The wire protocol is compared first, by the transport, when the
//!    node connects ([`crate::wire::PROTOCOL_VERSION`] in the stream
//!    preamble): a node speaking another refuses, or is refused, with both
//!    versions named.
//! 2. The node's registration carries its [`Versions`]; the head admits a
//!    node of another nimbus release speaking the same protocol, and warns
//!    ([`Versions::differences`], in the head's log and `nimbus status`).
//! 3. libtorch is not a node's: only programs that train link it, and
//!    their workers run the program's own binary. A node that cannot load
//!    a program's libraries refuses its workers, naming them (the node's
//!    `libraries.rs`).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::wire::PROTOCOL_VERSION;

/// Where the NVIDIA kernel driver says its version.
const NVIDIA_VERSION_FILE: &str = "/proc/driver/nvidia/version";

/// The versions a node runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Versions {
    /// The nimbus release (the `nimbus` crate's version).
    pub nimbus: String,
    /// The wire protocol it speaks.
    pub protocol: u32,
    /// The NVIDIA driver of its machine, if it has one.
    #[serde(default)]
    pub nvidia_driver: Option<String>,
}

impl Versions {
    /// The versions of this process and its machine.
    pub fn here() -> Self {
        Versions {
            nimbus: env!("CARGO_PKG_VERSION").to_string(),
            protocol: PROTOCOL_VERSION,
            nvidia_driver: std::fs::read_to_string(NVIDIA_VERSION_FILE)
                .ok()
                .and_then(|text| nvidia_driver(&text)),
        }
    }

    /// How `self` (a node's) differs from `head`'s in what does not stop
    /// it from joining, in words; `None` when nothing does. NVIDIA
    /// drivers may differ between machines: not a difference.
    pub fn differences(&self, head: &Versions) -> Option<String> {
        (self.nimbus != head.nimbus).then(|| {
            format!(
                "runs nimbus {} and the head {} (the same protocol, v{}): run one release on every node",
                or_unknown(&self.nimbus),
                or_unknown(&head.nimbus),
                head.protocol
            )
        })
    }
}

impl fmt::Display for Versions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "nimbus {}", or_unknown(&self.nimbus))?;
        // A node too old to say its versions says protocol 0.
        match self.protocol {
            0 => write!(f, " protocol unknown")?,
            protocol => write!(f, " protocol v{protocol}")?,
        }
        if let Some(driver) = &self.nvidia_driver {
            write!(f, " nvidia {driver}")?;
        }
        Ok(())
    }
}

/// A version, or `unknown` for a node too old to say.
fn or_unknown(version: &str) -> &str {
    if version.is_empty() {
        "unknown"
    } else {
        version
    }
}

/// The driver version in the NVIDIA kernel module's version text
/// (`NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Wed ...`).
fn nvidia_driver(text: &str) -> Option<String> {
    let line = text.lines().next()?;
    let after = line.split("Kernel Module").nth(1)?;
    after.split_whitespace().next().map(String::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nvidia_driver_version_is_read_from_the_kernel_modules_text() {
        let text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Wed Jan 15 2025\n\
                    GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";
        assert_eq!(nvidia_driver(text).as_deref(), Some("570.86.15"));
        assert_eq!(nvidia_driver("something else\n"), None);
    }

    #[test]
    fn another_release_is_a_difference_and_another_driver_is_not() {
        let head = Versions {
            nimbus: "0.1.0".into(),
            protocol: 4,
            nvidia_driver: Some("570.86.15".into()),
        };
        let driver = Versions {
            nvidia_driver: None,
            ..head.clone()
        };
        assert_eq!(driver.differences(&head), None);
        let release = Versions {
            nimbus: "0.2.0".into(),
            ..head.clone()
        };
        let said = release.differences(&head).unwrap();
        assert!(said.contains("nimbus 0.2.0 and the head 0.1.0"), "{said}");
        assert_eq!(
            head.to_string(),
            "nimbus 0.1.0 protocol v4 nvidia 570.86.15"
        );
    }
}
