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
//!    `libraries.rs`). A driver states the libtorch it loaded ([`Torch`])
//!    with its job (`nimbus job list`), and gives it to its training
//!    workers, which refuse to train with another release or CUDA build
//!    than the driver's, naming both (nimbus-train's worker).
//!
//! A libtorch's release is what its distribution says beside its
//! libraries (`<lib>/..`): `version.py` in a torch Python package
//! (`__version__`, `cuda`), `build-version` in a libtorch archive (and in
//! the container image's layout, `scripts/image-runtime.sh`), whose
//! `+cuXYZ` suffix names the CUDA build.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::death::bounded_text;
use crate::host::probe;
use crate::wire::PROTOCOL_VERSION;

/// The libtorch library whose directory [`Torch::loaded`] looks for.
const LIBTORCH: &str = "libtorch_cpu.so";

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
    /// The libtorch it loaded, if it has one (programs that train).
    #[serde(default)]
    pub libtorch: Option<Torch>,
}

impl Versions {
    /// The versions of this process and its machine.
    pub fn here() -> Self {
        Versions {
            nimbus: env!("CARGO_PKG_VERSION").to_string(),
            protocol: PROTOCOL_VERSION,
            nvidia_driver: probe::nvidia_version_file().and_then(|text| nvidia_driver(&text)),
            libtorch: Torch::loaded(),
        }
    }

    /// `self` with every text cut to [`bounded_text`]'s bound (what the head
    /// keeps of what a peer says).
    pub fn bounded(self) -> Versions {
        Versions {
            nimbus: bounded_text(self.nimbus),
            protocol: self.protocol,
            nvidia_driver: self.nvidia_driver.map(bounded_text),
            libtorch: self.libtorch.map(Torch::bounded),
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
        if let Some(torch) = &self.libtorch {
            write!(f, " {}", torch.release())?;
        }
        Ok(())
    }
}

/// A libtorch a process loaded: its release, as its distribution says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Torch {
    /// Its release (`2.11.0+cu130`); `None` when nothing beside its
    /// libraries says.
    pub version: Option<String>,
    /// The CUDA it was built for (`13.0`); `None` for a CPU build.
    pub cuda: Option<String>,
    /// The directory of its libraries.
    pub directory: PathBuf,
}

impl Torch {
    /// The libtorch this process has loaded, if any: the directory of its
    /// `libtorch_cpu.so` among the process's mapped files.
    pub fn loaded() -> Option<Torch> {
        let maps = probe::mapped_files()?;
        let library = mapped_libtorch(&maps)?;
        Some(Torch::in_directory(Path::new(library).parent()?))
    }

    /// The libtorch whose libraries are in `directory`, with the release
    /// its distribution states beside them, if it does.
    pub fn in_directory(directory: &Path) -> Torch {
        let above = directory.join("..");
        let (version, cuda) = match probe::file_beside(&above, "version.py") {
            Some(text) => python_release(&text),
            None => match probe::file_beside(&above, "build-version") {
                Some(text) => archive_release(&text),
                None => (None, None),
            },
        };
        Torch {
            version,
            cuda,
            directory: directory.to_path_buf(),
        }
    }

    /// Whether programs of `self` and `other` cannot train together:
    /// both releases are known and differ, or their CUDA builds do.
    pub fn differs(&self, other: &Torch) -> bool {
        match (&self.version, &other.version) {
            (Some(mine), Some(theirs)) => mine != theirs || self.cuda != other.cuda,
            _ => false,
        }
    }

    /// `self` with every text cut to [`bounded_text`]'s bound (what the head
    /// keeps of what a peer says).
    pub fn bounded(self) -> Torch {
        Torch {
            version: self.version.map(bounded_text),
            cuda: self.cuda.map(bounded_text),
            directory: PathBuf::from(bounded_text(self.directory.to_string_lossy().into_owned())),
        }
    }

    /// Its release and CUDA build in words, without the directory.
    pub fn release(&self) -> String {
        let version = self.version.as_deref().unwrap_or("of unknown release");
        match &self.cuda {
            Some(cuda) => format!("libtorch {version} (CUDA {cuda})"),
            None => format!("libtorch {version} (no CUDA)"),
        }
    }
}

impl fmt::Display for Torch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} in {}", self.release(), self.directory.display())
    }
}

/// The path of the `libtorch_cpu.so` among a process's mapped files
/// (`host::probe::mapped_files`). A line: address, permissions, offset,
/// device, inode, then the path, which may hold spaces, and ends
/// ` (deleted)` once its file is gone.
fn mapped_libtorch(maps: &str) -> Option<&str> {
    maps.lines()
        .filter_map(|line| line.find('/').map(|at| &line[at..]))
        .map(|path| path.strip_suffix(" (deleted)").unwrap_or(path))
        .find(|path| Path::new(path).file_name() == Some(LIBTORCH.as_ref()))
}

/// The release and CUDA build a torch package's `version.py` states
/// (`__version__ = '2.11.0+cu130'`, `cuda: Optional[str] = '13.0'`).
fn python_release(text: &str) -> (Option<String>, Option<String>) {
    let assigned = |name: &str| {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (target, value) = rest.split_once('=')?;
            if !(target.trim().is_empty() || target.trim_start().starts_with(':')) {
                return None;
            }
            let value = value.trim();
            let quoted = value
                .strip_prefix('\'')
                .and_then(|v| v.strip_suffix('\''))
                .or_else(|| value.strip_prefix('"').and_then(|v| v.strip_suffix('"')));
            Some(quoted.map(String::from))
        })
    };
    (
        assigned("__version__").flatten(),
        assigned("cuda").flatten(),
    )
}

/// The release a libtorch archive's `build-version` states
/// (`2.11.0+cu130`), and the CUDA build its suffix names.
fn archive_release(text: &str) -> (Option<String>, Option<String>) {
    let version = text.lines().next().map(str::trim).filter(|v| !v.is_empty());
    let cuda = version
        .and_then(|v| v.split_once("+cu"))
        .and_then(|(_, digits)| {
            let digits = digits.split(|c: char| !c.is_ascii_digit()).next()?;
            (digits.len() >= 2).then(|| {
                format!(
                    "{}.{}",
                    &digits[..digits.len() - 1],
                    &digits[digits.len() - 1..]
                )
            })
        });
    (version.map(String::from), cuda)
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
            libtorch: None,
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

    #[test]
    fn a_torch_packages_release_is_read_from_its_version_py() {
        let text = "from typing import Optional\n\n__all__ = ['__version__', 'cuda']\n\
                    __version__ = '2.11.0+cu130'\ndebug = False\n\
                    cuda: Optional[str] = '13.0'\ngit_version = '70d99e9'\n";
        assert_eq!(
            python_release(text),
            (Some("2.11.0+cu130".into()), Some("13.0".into()))
        );
        let cpu = "__version__ = '2.11.0+cpu'\ncuda: Optional[str] = None\n";
        assert_eq!(python_release(cpu), (Some("2.11.0+cpu".into()), None));
        assert_eq!(python_release("nothing here\n"), (None, None));
    }

    #[test]
    fn a_libtorch_archives_release_and_cuda_are_read_from_build_version() {
        assert_eq!(
            archive_release("2.11.0+cu130\n"),
            (Some("2.11.0+cu130".into()), Some("13.0".into()))
        );
        assert_eq!(
            archive_release("2.4.1+cu118\n"),
            (Some("2.4.1+cu118".into()), Some("11.8".into()))
        );
        assert_eq!(
            archive_release("2.11.0+cpu\n"),
            (Some("2.11.0+cpu".into()), None)
        );
        assert_eq!(archive_release(""), (None, None));
    }

    #[test]
    fn releases_differ_only_when_both_are_known() {
        let at = |version: Option<&str>, cuda: Option<&str>| Torch {
            version: version.map(String::from),
            cuda: cuda.map(String::from),
            directory: PathBuf::from("/opt/torch/lib"),
        };
        let driver = at(Some("2.11.0+cu130"), Some("13.0"));
        assert!(!driver.differs(&at(Some("2.11.0+cu130"), Some("13.0"))));
        assert!(driver.differs(&at(Some("2.11.1+cu130"), Some("13.0"))));
        assert!(driver.differs(&at(Some("2.11.0+cu130"), None)));
        assert!(!driver.differs(&at(None, None)));
        assert_eq!(
            driver.to_string(),
            "libtorch 2.11.0+cu130 (CUDA 13.0) in /opt/torch/lib"
        );
    }

    #[test]
    fn the_loaded_libtorch_is_found_among_mapped_files_whose_paths_hold_spaces() {
        let maps = "7f00-7f01 r--p 00000000 fd:01 42   /usr/lib/libc.so.6\n\
                    7f02-7f03 r-xp 00001000 fd:01 43   /opt/my torch/lib/libtorch_cpu.so (deleted)\n\
                    7ffd-7ffe rw-p 00000000 00:00 0    [stack]\n";
        assert_eq!(
            mapped_libtorch(maps),
            Some("/opt/my torch/lib/libtorch_cpu.so")
        );
        assert_eq!(
            mapped_libtorch("7ffd-7ffe rw-p 00000000 00:00 0 [stack]\n"),
            None
        );
    }
}
