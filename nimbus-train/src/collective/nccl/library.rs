//! Finding and loading NCCL: the NCCL that came with the libtorch in use,
//! not whichever `libnccl.so` the loader would find first. (cudarc's own
//! loader never tries `libnccl.so.2`, the only name a torch wheel's NCCL
//! has, so nimbus loads NCCL itself and takes only cudarc's type
//! definitions.)
//!
//! Where it looks, the first that loads wins:
//! 1. [`NCCL_LIB_ENV`] (`NIMBUS_NCCL_LIB`), a file: that library, or an
//!    error naming it (nothing else is tried);
//! 2. beside the libtorch this process loaded: its own directory (the
//!    container image's layout, `scripts/image-runtime.sh`), then
//!    `../../nvidia/nccl/lib` (a torch wheel: `site-packages/torch/lib`
//!    and `site-packages/nvidia/nccl/lib`);
//! 3. [`SONAME`] by the dynamic loader's search (a system install).
//!
//! Then `ncclGetVersion` says its version; one older than [`MIN_VERSION`]
//! (2.10, the first with `ncclAvg`) is refused. Which file and which
//! version were loaded is logged once per process. From
//! [`NON_BLOCKING_VERSION`] (2.17) on, communicators are made non-blocking
//! ([`CommConfig::non_blocking`]), so that joining one can be bounded by a
//! timeout and aborted.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::nccl::sys::{cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclUniqueId};

use super::super::CollectiveError;
use nimbus::cluster::Torch;

/// Names the NCCL library file to load.
pub const NCCL_LIB_ENV: &str = "NIMBUS_NCCL_LIB";
/// NCCL's shared library, as every NCCL 2 install names it.
pub const SONAME: &str = "libnccl.so.2";
/// The oldest NCCL accepted (2.10.0, as `ncclGetVersion` codes it:
/// major × 10000 + minor × 100 + patch).
pub const MIN_VERSION: c_int = 21000;
/// The oldest NCCL nimbus makes non-blocking communicators with (2.17.0:
/// the [`CommConfig`] layout nimbus passes).
pub const NON_BLOCKING_VERSION: c_int = 21700;
/// `ncclSuccess`.
pub(super) const SUCCESS: c_int = 0;
/// `ncclInProgress`: a non-blocking communicator's operation still runs.
pub(super) const IN_PROGRESS: c_int = 7;

/// `ncclConfig_t` as NCCL 2.17 lays it out (`nccl.h`); newer NCCLs read
/// an older layout by its `size` and `version`.
#[repr(C)]
pub struct CommConfig {
    size: usize,
    magic: c_uint,
    version: c_uint,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
}

impl CommConfig {
    /// `NCCL_CONFIG_INITIALIZER` (every setting NCCL's default) with
    /// `blocking = 0`: calls on the communicator return `ncclInProgress`
    /// while they run, and `ncclCommGetAsyncError` says when they are done.
    pub fn non_blocking() -> Self {
        // NCCL_CONFIG_UNDEF_INT.
        let undefined = c_int::MIN;
        CommConfig {
            size: std::mem::size_of::<CommConfig>(),
            magic: 0xcafe_beef,
            version: NON_BLOCKING_VERSION as c_uint,
            blocking: 0,
            cga_cluster_size: undefined,
            min_ctas: undefined,
            max_ctas: undefined,
            net_name: std::ptr::null(),
        }
    }
}

/// The NCCL functions nimbus calls, from one loaded library.
pub struct Nccl {
    /// The file loaded (or [`SONAME`] when the dynamic loader found it).
    pub path: PathBuf,
    /// Its version, as `ncclGetVersion` codes it.
    pub version: c_int,
    /// `ncclGetUniqueId`.
    pub get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> c_int,
    /// `ncclCommInitRank`.
    pub comm_init_rank: unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> c_int,
    /// `ncclCommInitRankConfig`, from [`NON_BLOCKING_VERSION`] on.
    pub comm_init_rank_config: Option<
        unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int, *mut CommConfig) -> c_int,
    >,
    /// `ncclCommGetAsyncError`: a communicator's asynchronous error, or
    /// `ncclInProgress` while a non-blocking operation runs.
    pub comm_get_async_error: unsafe extern "C" fn(ncclComm_t, *mut c_int) -> c_int,
    /// `ncclCommAbort`.
    pub comm_abort: unsafe extern "C" fn(ncclComm_t) -> c_int,
    /// `ncclCommDestroy`.
    pub comm_destroy: unsafe extern "C" fn(ncclComm_t) -> c_int,
    /// `ncclAllReduce`.
    pub all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclRedOp_t,
        ncclComm_t,
        cudaStream_t,
    ) -> c_int,
    /// `ncclBroadcast`.
    pub broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        c_int,
        ncclComm_t,
        cudaStream_t,
    ) -> c_int,
    /// `ncclGroupStart`.
    pub group_start: unsafe extern "C" fn() -> c_int,
    /// `ncclGroupEnd`.
    pub group_end: unsafe extern "C" fn() -> c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    /// Keeps the functions above loaded.
    _library: libloading::Library,
}

impl Nccl {
    /// `result` of NCCL call `call`, as an error naming the call and
    /// NCCL's own words for it.
    pub fn check(&self, call: &str, result: c_int) -> Result<(), String> {
        if result == SUCCESS {
            return Ok(());
        }
        Err(self.describe(call, result))
    }

    /// As [`check`](Self::check), but an operation still running on a
    /// non-blocking communicator (`ncclInProgress`) is no error: its end
    /// is waited for through `ncclCommGetAsyncError`.
    pub fn check_launch(&self, call: &str, result: c_int) -> Result<(), String> {
        if result == IN_PROGRESS {
            return Ok(());
        }
        self.check(call, result)
    }

    /// NCCL result `result` of `call`, in NCCL's words, naming the library.
    pub fn describe(&self, call: &str, result: c_int) -> String {
        // SAFETY: ncclGetErrorString returns a static string for any code.
        let text = unsafe { (self.get_error_string)(result) };
        let text = if text.is_null() {
            "unknown error".into()
        } else {
            // SAFETY: a NUL-terminated static string, as NCCL documents.
            unsafe { CStr::from_ptr(text) }.to_string_lossy()
        };
        format!(
            "{call} failed: {text} (NCCL result {result}; {} from {})",
            version_text(self.version),
            self.path.display()
        )
    }
}

/// This process's NCCL, loaded on first use (see the module's steps).
pub fn nccl() -> Result<&'static Nccl, CollectiveError> {
    static NCCL: OnceLock<Result<Nccl, String>> = OnceLock::new();
    NCCL.get_or_init(|| {
        let named = std::env::var_os(NCCL_LIB_ENV).map(PathBuf::from);
        let torch = Torch::loaded().map(|torch| torch.directory);
        let nccl = load(named, torch.as_deref())?;
        tracing::info!(
            "NCCL {} loaded from {}",
            version_text(nccl.version),
            nccl.path.display()
        );
        Ok(nccl)
    })
    .as_ref()
    .map_err(|e| CollectiveError::Setup(e.clone()))
}

/// `version` (`ncclGetVersion`'s code) as `2.28.5`.
pub fn version_text(version: c_int) -> String {
    format!(
        "{}.{}.{}",
        version / 10000,
        version % 10000 / 100,
        version % 100
    )
}

/// Where to look for NCCL, in order: the named file alone, else beside
/// the libtorch in `torch_lib`, else [`SONAME`] for the loader to find.
fn candidates(named: Option<PathBuf>, torch_lib: Option<&Path>) -> Vec<PathBuf> {
    if let Some(named) = named {
        return vec![named];
    }
    let mut found = Vec::new();
    if let Some(lib) = torch_lib {
        found.push(lib.join(SONAME));
        found.push(lib.join("../../nvidia/nccl/lib").join(SONAME));
    }
    found.push(PathBuf::from(SONAME));
    found
}

/// The first of [`candidates`] that loads, with its functions and
/// version; an error naming every place tried.
pub fn load(named: Option<PathBuf>, torch_lib: Option<&Path>) -> Result<Nccl, String> {
    let explicit = named.is_some();
    let mut tried = Vec::new();
    for path in candidates(named, torch_lib) {
        let by_name = path.components().count() == 1;
        if !by_name && !path.exists() {
            tried.push(format!("{} (no such file)", path.display()));
            continue;
        }
        // SAFETY: loading NCCL runs its initialisers, which have no
        // preconditions of ours.
        match unsafe { libloading::Library::new(&path) } {
            Ok(library) => return functions(library, path),
            Err(e) => tried.push(format!("{} ({e})", path.display())),
        }
    }
    Err(if explicit {
        format!(
            "{NCCL_LIB_ENV} names a library that does not load: {}",
            tried.join("; ")
        )
    } else {
        format!(
            "NCCL not found: tried {}; install NCCL, or set {NCCL_LIB_ENV} to its {SONAME}",
            tried.join(", ")
        )
    })
}

/// NCCL's functions in `library` (loaded from `path`), once its version
/// is known to be new enough.
fn functions(library: libloading::Library, path: PathBuf) -> Result<Nccl, String> {
    let missing = |e: libloading::Error| {
        format!(
            "{} is not NCCL 2 (a function is missing: {e})",
            path.display()
        )
    };
    // SAFETY: every `get` below gives its symbol NCCL 2's C signature
    // (nccl.h), with C enums as their values' integer type, and the
    // functions are called only while `library` is loaded (it moves into
    // the returned `Nccl`, which keeps it).
    unsafe {
        let get_version = *library
            .get::<unsafe extern "C" fn(*mut c_int) -> c_int>(b"ncclGetVersion\0")
            .map_err(missing)?;
        let mut version = 0;
        if get_version(&mut version) != SUCCESS {
            return Err(format!("{}: ncclGetVersion failed", path.display()));
        }
        if version < MIN_VERSION {
            return Err(format!(
                "{} is NCCL {}, older than {} (the first with ncclAvg, which averaging gradients needs); install a newer NCCL or set {NCCL_LIB_ENV}",
                path.display(),
                version_text(version),
                version_text(MIN_VERSION)
            ));
        }
        Ok(Nccl {
            version,
            get_unique_id: *library.get(b"ncclGetUniqueId\0").map_err(missing)?,
            comm_init_rank: *library.get(b"ncclCommInitRank\0").map_err(missing)?,
            comm_init_rank_config: if version >= NON_BLOCKING_VERSION {
                Some(*library.get(b"ncclCommInitRankConfig\0").map_err(missing)?)
            } else {
                None
            },
            comm_get_async_error: *library.get(b"ncclCommGetAsyncError\0").map_err(missing)?,
            comm_abort: *library.get(b"ncclCommAbort\0").map_err(missing)?,
            comm_destroy: *library.get(b"ncclCommDestroy\0").map_err(missing)?,
            all_reduce: *library.get(b"ncclAllReduce\0").map_err(missing)?,
            broadcast: *library.get(b"ncclBroadcast\0").map_err(missing)?,
            group_start: *library.get(b"ncclGroupStart\0").map_err(missing)?,
            group_end: *library.get(b"ncclGroupEnd\0").map_err(missing)?,
            get_error_string: *library.get(b"ncclGetErrorString\0").map_err(missing)?,
            path,
            _library: library,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_comm_config_is_laid_out_as_nccl_2_17s() {
        // size, magic, version, blocking, cgaClusterSize, minCTAs,
        // maxCTAs, then netName (8-aligned).
        let config = CommConfig::non_blocking();
        let base = &config as *const CommConfig as usize;
        let at = |field: *const u8| field as usize - base;
        assert_eq!(at(&config.magic as *const _ as *const u8), 8);
        assert_eq!(at(&config.blocking as *const _ as *const u8), 16);
        assert_eq!(at(&config.max_ctas as *const _ as *const u8), 28);
        assert_eq!(at(&config.net_name as *const _ as *const u8), 32);
        assert_eq!(config.size, 40);
        assert_eq!(
            (config.magic, config.version, config.blocking),
            (0xcafe_beef, 21700, 0)
        );
    }

    #[test]
    fn a_named_library_is_the_only_candidate_else_torchs_then_the_loaders() {
        assert_eq!(
            candidates(
                Some("/opt/nccl/libnccl.so.2".into()),
                Some(Path::new("/t/lib"))
            ),
            [PathBuf::from("/opt/nccl/libnccl.so.2")]
        );
        assert_eq!(
            candidates(None, Some(Path::new("/sp/torch/lib"))),
            [
                PathBuf::from("/sp/torch/lib/libnccl.so.2"),
                PathBuf::from("/sp/torch/lib/../../nvidia/nccl/lib/libnccl.so.2"),
                PathBuf::from("libnccl.so.2"),
            ]
        );
        assert_eq!(candidates(None, None), [PathBuf::from("libnccl.so.2")]);
        assert_eq!(version_text(22805), "2.28.5");
    }

    #[test]
    fn a_named_library_that_does_not_load_is_an_error_naming_it() {
        let dir = tempfile::TempDir::new().unwrap();
        let fake = dir.path().join("libnccl.so.2");
        std::fs::write(&fake, b"not a library").unwrap();
        let error = load(Some(fake.clone()), None).err().unwrap();
        assert!(
            error.contains(NCCL_LIB_ENV) && error.contains(&fake.display().to_string()),
            "{error}"
        );
    }
}
