//! The worker sandbox: what a node does in each worker process between
//! `fork` and `exec`, so that actor code reaches neither the cluster's
//! secrets nor the processes around it (SECURITY.md §4).
//!
//! When the node starts, [`WorkerSandbox::start`] forks a probe that runs
//! the steps below and exits; the layers that held are what every worker
//! gets. `--worker-sandbox auto` (the default) starts workers with what the
//! host allows and warns once naming what it does not; `required` refuses
//! to start the node instead; `off` runs workers without any of it. In each
//! worker, in this order:
//! 1. **Namespaces** (layer `namespaces`): a user namespace that maps only
//!    this user and group, to themselves, and a mount namespace of its own
//!    whose mounts do not propagate.
//! 2. **The state directory covered**: an empty read-only tmpfs hides
//!    `state_dir` (`$NIMBUS_HOME`: the token file, `head.redb`, every job's
//!    logs, cached programs). The worker's own program, cached there, and
//!    its job's working directory (`jobs/JOB`, a submitted job's files,
//!    where this node runs its driver) are bound back read-only at their
//!    paths (mount flags they had kept). The working directory is entered
//!    again by its path; `/` if it was under the hidden one. Likewise an
//!    empty tmpfs hides the directory of this user's nodes' shared-memory
//!    directories (`/dev/shm/nimbus-objects-UID`: every job's large
//!    objects and segments, `crate::host::shared_memory`), and only its
//!    job's directories there are bound back, writable: its objects in its
//!    node's directory (`nimbus-NODE-PID/job-JOB`) and the segments its
//!    job's processes share (`jobs/job-JOB`). It reads and writes its own
//!    job's in place, and finds no other job's.
//! 3. **Landlock** (layer `landlock`; no new privileges first): a domain
//!    of the worker's own, so it may not trace a process outside it nor
//!    read its memory, environment or root directory (its node, drivers,
//!    other workers; its own children are its own), and, where the kernel
//!    has Landlock ABI 6, nor signal one. A node whose cluster injects
//!    `kill_node` faults ([`WORKERS_KILL_NODE_ENV`]) leaves signals
//!    unscoped: such a fault kills the node from inside a worker.
//! 4. **No capabilities** (a node running as root): the worker's bounding
//!    and ambient sets are emptied and securebits keep root from regaining
//!    them at `exec`, so it cannot undo step 2.
//!
//! Step 2 goes with step 1; a step that fails in a worker fails its start.

use std::ffi::{CStr, CString};
use std::fmt;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use landlock::{AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr, Scope};

use crate::cluster::faults::WORKERS_KILL_NODE_ENV;
use crate::host::files::private_dir;
use crate::host::shared_memory::{job_dir_name, job_segments_dir};

/// Which of the sandbox's layers a node's workers must get
/// (`--worker-sandbox`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SandboxMode {
    /// What the host allows; warn for the rest.
    #[default]
    Auto,
    /// Every layer, or the node does not start.
    Required,
    /// None.
    Off,
}

impl std::str::FromStr for SandboxMode {
    type Err = SandboxError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "auto" => Ok(SandboxMode::Auto),
            "required" => Ok(SandboxMode::Required),
            "off" => Ok(SandboxMode::Off),
            other => Err(SandboxError::BadMode(other.to_string())),
        }
    }
}

/// A step of a worker's entry into its sandbox (the module's steps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Step {
    /// 1: the user and mount namespaces.
    Unshare = 1,
    /// 1: the user and group maps.
    Maps,
    /// 1: the mounts made private.
    Private,
    /// 2: the tmpfs over the state directory.
    Cover,
    /// 2: the program bound back.
    Bind,
    /// 2: the tmpfs over the nodes' shared-memory directories.
    CoverObjects,
    /// 3: no new privileges.
    NoNewPrivileges,
    /// 3: the Landlock domain.
    Landlock,
    /// 4: the capabilities dropped.
    Capabilities,
}

impl Step {
    fn from_byte(byte: u8) -> Option<Step> {
        [
            Step::Unshare,
            Step::Maps,
            Step::Private,
            Step::Cover,
            Step::Bind,
            Step::CoverObjects,
            Step::NoNewPrivileges,
            Step::Landlock,
            Step::Capabilities,
        ]
        .into_iter()
        .find(|step| *step as u8 == byte)
    }

    /// Whether the step belongs to layer `namespaces` (1 and 2).
    fn of_namespaces(self) -> bool {
        matches!(
            self,
            Step::Unshare
                | Step::Maps
                | Step::Private
                | Step::Cover
                | Step::Bind
                | Step::CoverObjects
        )
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Unshare => "a user and mount namespace of its own (unshare)",
            Step::Maps => "its user namespace's uid and gid maps",
            Step::Private => "private mounts",
            Step::Cover => "a tmpfs over the state directory",
            Step::Bind => "its program bound back",
            Step::CoverObjects => "a tmpfs over the nodes' shared-memory directories",
            Step::NoNewPrivileges => "no new privileges",
            Step::Landlock => "a Landlock domain (landlock_restrict_self)",
            Step::Capabilities => "dropping its capabilities",
        })
    }
}

/// Why the worker sandbox could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// `--worker-sandbox` has an unknown value.
    #[error("--worker-sandbox {0:?}: expected auto, required or off")]
    BadMode(String),
    /// `--worker-sandbox required`, and the host refused a layer.
    #[error("--worker-sandbox required: workers cannot get {step} on this host: {source}; {hint}, or start the node with --worker-sandbox auto (what the host allows, warned) or off")]
    Refused {
        /// The step the probe failed at.
        step: Step,
        /// The OS error.
        source: std::io::Error,
        /// What to change on the host.
        hint: &'static str,
    },
    /// The probe could not run, or Landlock is missing with `required`.
    #[error("--worker-sandbox: cannot {action}: {source}")]
    Probe {
        /// What was being done.
        action: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

/// What the host needs for a step to hold.
fn hint(step: Step) -> &'static str {
    if step.of_namespaces() {
        "enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, \
         kernel.apparmor_restrict_unprivileged_userns=0; in a container, a seccomp profile \
         that allows unshare)"
    } else {
        "boot a kernel with Landlock enabled (5.13 or later, `landlock` in the lsm= list)"
    }
}

/// The layers a node's workers get, found by the probe at node start.
#[derive(Clone, Debug)]
pub struct WorkerSandbox {
    shared: Option<Arc<Shared>>,
}

/// What every worker's entry shares.
#[derive(Debug)]
struct Shared {
    /// The state directory (canonical), covered in step 2, with its path
    /// for `mount`; `None`: layer `namespaces` is off.
    cover: Option<(PathBuf, CString)>,
    /// The directory of this user's nodes' shared-memory directories
    /// (canonical), covered in step 2 too, and this node's in it; `None`:
    /// it has none, or layer `namespaces` is off.
    objects: Option<(PathBuf, CString)>,
    own_objects: PathBuf,
    /// The uid and gid maps and `setgroups` (step 1).
    maps: [CString; 3],
    /// The Landlock ruleset (step 3), if the kernel has Landlock.
    ruleset: Option<OwnedFd>,
    /// Whether the ruleset scopes signals.
    signals: bool,
    /// Whether the node runs as root (step 4).
    root: bool,
}

impl WorkerSandbox {
    /// No sandbox (`--worker-sandbox off`).
    pub fn off() -> Self {
        WorkerSandbox { shared: None }
    }

    /// Probes what this host allows under `mode` for workers of a node
    /// whose state directory is `state_dir`, says so in the log, and
    /// returns it; `Err` only with `required` and a layer refused.
    pub fn start(mode: SandboxMode, state_dir: &Path) -> Result<Self, SandboxError> {
        if mode == SandboxMode::Off {
            tracing::warn!("--worker-sandbox off: actor code can read this node's state directory and the environment of the node's other processes");
            return Ok(Self::off());
        }
        let probe_failed = |action| move |source| SandboxError::Probe { action, source };
        let cover = state_dir
            .canonicalize()
            .map_err(probe_failed("find the state directory"))?;
        let scope_signals = std::env::var_os(WORKERS_KILL_NODE_ENV).is_none();
        let (ruleset, signals) = match landlock_ruleset(scope_signals) {
            Some(made) => made,
            None if mode == SandboxMode::Required => {
                return Err(SandboxError::Refused {
                    step: Step::Landlock,
                    source: std::io::Error::from_raw_os_error(libc::EOPNOTSUPP),
                    hint: hint(Step::Landlock),
                })
            }
            None => (None, false),
        };
        // SAFETY: getuid, geteuid and getgid cannot fail.
        let (uid, euid, gid) = unsafe { (libc::getuid(), libc::geteuid(), libc::getgid()) };
        let mut shared = Shared {
            cover: Some((cover.clone(), path_cstring(&cover))),
            objects: None,
            own_objects: PathBuf::new(),
            maps: [
                CString::from(c"deny"),
                cstring(format!("{uid} {uid} 1")),
                cstring(format!("{gid} {gid} 1")),
            ],
            ruleset,
            signals,
            root: euid == 0,
        };
        let mut missing = Vec::new();
        if shared.ruleset.is_none() {
            missing.push(format!(
                "Landlock (not in this kernel: {})",
                hint(Step::Landlock)
            ));
        }
        while let Err((step, source)) = probe(&shared) {
            if mode == SandboxMode::Required || !step.of_namespaces() || shared.cover.is_none() {
                return Err(SandboxError::Refused {
                    step,
                    source,
                    hint: hint(step),
                });
            }
            missing.push(format!("{step} ({source}: {})", hint(step)));
            shared.cover = None;
        }
        let sandbox = WorkerSandbox {
            shared: Some(Arc::new(shared)),
        };
        if missing.is_empty() {
            tracing::info!("workers run with {}", sandbox.describe());
        } else {
            tracing::warn!(
                "workers run with {}, without {}: actor code can read what those would hide (the state directory, with the token file on the head's host; other processes' environments)",
                sandbox.describe(),
                missing.join("; without "),
            );
        }
        Ok(sandbox)
    }

    /// The layers workers get, in words.
    pub fn describe(&self) -> String {
        let Some(shared) = &self.shared else {
            return "no sandbox".into();
        };
        let mut layers = Vec::new();
        if let Some((cover, _)) = &shared.cover {
            layers.push(format!(
                "namespaces of their own ({} hidden)",
                cover.display()
            ));
        }
        if shared.ruleset.is_some() {
            layers.push(format!(
                "Landlock (other processes unreachable{})",
                if shared.signals {
                    ", signals scoped"
                } else {
                    ""
                }
            ));
        }
        if shared.root {
            layers.push("no capabilities".into());
        }
        layers.join(", ")
    }

    /// Hides the shared-memory directories of this user's nodes (the
    /// parent of this node's, `dir`) from its workers too, but for their
    /// job's own in this node's (step 2), once a probe shows that this
    /// host allows it; else says so (`Err` with `required`).
    pub fn with_objects(self, dir: Option<&Path>, mode: SandboxMode) -> Result<Self, SandboxError> {
        let Some(dir) = dir else {
            return Ok(self);
        };
        let Some(mut shared) = self.shared else {
            return Ok(WorkerSandbox::off());
        };
        let Some(inner) = Arc::get_mut(&mut shared).filter(|s| s.cover.is_some()) else {
            return Ok(WorkerSandbox {
                shared: Some(shared),
            });
        };
        let find = |source| SandboxError::Probe {
            action: "find the nodes' shared-memory directory",
            source,
        };
        inner.own_objects = dir.canonicalize().map_err(find)?;
        // The per-user directory of every node's: a node started later
        // is hidden too.
        let dir = inner.own_objects.parent().unwrap_or(dir).to_path_buf();
        inner.objects = Some((dir.clone(), path_cstring(&dir)));
        match probe(inner) {
            Ok(()) => Ok(WorkerSandbox {
                shared: Some(shared),
            }),
            Err((step, source)) if mode == SandboxMode::Required => Err(SandboxError::Refused {
                step,
                source,
                hint: hint(step),
            }),
            Err((step, source)) => {
                tracing::warn!(
                    "workers see all of {} (every job's large objects): {step} failed ({source})",
                    dir.display()
                );
                inner.objects = None;
                Ok(WorkerSandbox {
                    shared: Some(shared),
                })
            }
        }
    }

    /// What a worker of `job` running `binary` does before `exec`
    /// (`None`: no sandbox); its fields are made here, so that
    /// [`Entry::enter`] allocates nothing.
    pub(super) fn entry(&self, binary: &Path, job: &str) -> std::io::Result<Option<Entry>> {
        let Some(shared) = &self.shared else {
            return Ok(None);
        };
        let mut binds = [None, None, None, None];
        if let Some((cover, _)) = &shared.cover {
            binds[0] = bind_back(cover, binary, false)?;
            let one_name = Path::new(job).components().count() == 1
                && Path::new(job).file_name().is_some_and(|name| name == job);
            let job_dir = cover.join("jobs").join(job);
            if one_name && job_dir.is_dir() {
                binds[1] = bind_back(cover, &job_dir, true)?;
            }
        }
        if let (Some((objects, _)), Some(name)) = (&shared.objects, job_dir_name(job)) {
            let shm = objects.parent().unwrap_or(objects);
            let own = [
                Some(shared.own_objects.join(name)),
                job_segments_dir(shm, job),
            ];
            for (bind, dir) in binds[2..].iter_mut().zip(own.into_iter().flatten()) {
                private_dir(&dir)?;
                *bind = bind_back(objects, &dir, true)?.map(|bind| Bind {
                    writable: true,
                    ..bind
                });
            }
        }
        let cwd = std::env::current_dir().ok().map(|dir| path_cstring(&dir));
        Ok(Some(Entry {
            shared: shared.clone(),
            binds,
            cwd,
        }))
    }
}

/// A Landlock ruleset that handles only device-node creation (no worker
/// needs it) and, when `signals` and the kernel allow, scopes signals;
/// `None` where the kernel has no Landlock. The bool: signals scoped.
fn landlock_ruleset(signals: bool) -> Option<(Option<OwnedFd>, bool)> {
    let made = |scope: bool| -> Result<Option<OwnedFd>, landlock::RulesetError> {
        let ruleset = Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessFs::MakeChar | AccessFs::MakeBlock)?;
        let ruleset = if scope {
            ruleset.scope(Scope::Signal)?
        } else {
            ruleset
        };
        Ok(ruleset.create()?.into())
    };
    if signals {
        if let Ok(Some(fd)) = made(true) {
            return Some((Some(fd), true));
        }
    }
    match made(false) {
        Ok(Some(fd)) => Some((Some(fd), false)),
        _ => None,
    }
}

/// How `path` (a file, or a directory when `dir`) is bound back in the
/// covered `cover` (step 2); `None` when it is not under it.
fn bind_back(cover: &Path, path: &Path, dir: bool) -> std::io::Result<Option<Bind>> {
    let path = path.canonicalize()?;
    let Ok(inside) = path.strip_prefix(cover) else {
        return Ok(None);
    };
    let flags = mount_flags(&std::fs::File::open(&path)?)?;
    let mut dirs = Vec::new();
    let mut at = cover.to_path_buf();
    let parts: Vec<_> = inside.components().collect();
    for part in &parts[..parts.len().saturating_sub(1)] {
        at.push(part);
        dirs.push(path_cstring(&at));
    }
    Ok(Some(Bind {
        dirs,
        target: path_cstring(&path),
        dir,
        flags,
        writable: false,
    }))
}

/// The mount flags of the filesystem `file` is on, as `mount(2)` takes
/// them (a bind remount must keep those a user namespace may not clear).
fn mount_flags(file: &std::fs::File) -> std::io::Result<libc::c_ulong> {
    // SAFETY: an all-zero statvfs is a valid out-parameter.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: the descriptor is open for the call; `stat` outlives it.
    if unsafe { libc::fstatvfs(file.as_raw_fd(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let pairs = [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ];
    Ok(pairs
        .into_iter()
        .filter(|(st, _)| stat.f_flag & st != 0)
        .fold(0, |flags, (_, ms)| flags | ms))
}

fn cstring(text: String) -> CString {
    CString::new(text).unwrap_or_default()
}

fn path_cstring(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap_or_default()
}

/// A file or directory bound back into the covered state directory.
#[derive(Debug)]
struct Bind {
    /// Directories to make in the tmpfs, outermost first.
    dirs: Vec<CString>,
    /// Its path, where it is bound back.
    target: CString,
    /// It is a directory.
    dir: bool,
    /// The mount flags of its filesystem.
    flags: libc::c_ulong,
    /// Left writable (the job's shared-memory directory); else remounted
    /// read-only.
    writable: bool,
}

/// One worker's way into its sandbox, made before `fork`.
pub(super) struct Entry {
    shared: Arc<Shared>,
    /// The worker's program, its job's directory, and its job's two
    /// shared-memory directories (its objects on this node, the segments
    /// its processes share).
    binds: [Option<Bind>; 4],
    cwd: Option<CString>,
}

impl Entry {
    /// Runs the module's steps in the calling (single-threaded, forked)
    /// process; `Err`: the step that failed and its errno. Only
    /// async-signal-safe system calls: it runs between `fork` and `exec`.
    pub(super) fn enter(&self) -> Result<(), (Step, i32)> {
        enter(&self.shared, &self.binds, self.cwd.as_ref())
    }
}

/// The steps, for a worker (`binds`, `cwd`) or the probe (neither).
fn enter(
    shared: &Shared,
    binds: &[Option<Bind>; 4],
    cwd: Option<&CString>,
) -> Result<(), (Step, i32)> {
    if let Some((_, cover)) = &shared.cover {
        namespaces(shared)?;
        // What is bound back is opened first (in this mount namespace: a
        // bind takes its source from the caller's own), and bound from its
        // descriptor once its path is covered.
        let mut fds = [-1; 4];
        for (fd, bind) in fds.iter_mut().zip(binds) {
            if let Some(bind) = bind {
                *fd = sys::open(&bind.target, libc::O_PATH | libc::O_CLOEXEC, 0);
                check(Step::Bind, *fd)?;
            }
        }
        covered((cover, Step::Cover), &binds[..2], &fds[..2])?;
        if let Some((_, objects)) = &shared.objects {
            covered((objects, Step::CoverObjects), &binds[2..], &fds[2..])?;
        }
        // A working directory under the hidden one is gone: then `/`.
        if cwd.is_none_or(|cwd| sys::chdir(cwd) != 0) {
            sys::chdir(c"/");
        }
    }
    check(
        Step::NoNewPrivileges,
        sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0),
    )?;
    if let Some(ruleset) = &shared.ruleset {
        check(Step::Landlock, sys::landlock_restrict_self(ruleset))?;
    }
    if shared.root {
        drop_capabilities()?;
    }
    Ok(())
}

/// Step 1.
fn namespaces(shared: &Shared) -> Result<(), (Step, i32)> {
    check(
        Step::Unshare,
        sys::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS),
    )?;
    let files = [
        c"/proc/self/setgroups",
        c"/proc/self/uid_map",
        c"/proc/self/gid_map",
    ];
    for (file, text) in files.into_iter().zip(&shared.maps) {
        write_file(file, text).map_err(|errno| (Step::Maps, errno))?;
    }
    check(
        Step::Private,
        sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None),
    )
}

/// Step 2 for one directory: `cover` hidden under an empty tmpfs (`step`
/// names it), `binds` bound back from their descriptors `fds`.
fn covered(
    (cover, step): (&CStr, Step),
    binds: &[Option<Bind>],
    fds: &[i32],
) -> Result<(), (Step, i32)> {
    let hidden = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    let tmpfs = (c"tmpfs", c"mode=0700,size=64k");
    check(
        step,
        sys::mount(
            Some(c"nimbus-sandbox"),
            cover,
            Some(tmpfs.0),
            hidden,
            Some(tmpfs.1),
        ),
    )?;
    for (fd, bind) in fds.iter().zip(binds) {
        if let Some(bind) = bind {
            bound(bind, *fd)?;
        }
    }
    check(
        step,
        sys::mount(
            None,
            cover,
            None,
            libc::MS_REMOUNT | libc::MS_RDONLY | hidden,
            None,
        ),
    )
}

/// Binds `bind` back from its descriptor `fd`, read-only unless it is
/// writable.
fn bound(bind: &Bind, fd: i32) -> Result<(), (Step, i32)> {
    let made = |result: i32| match result < 0 && errno() != libc::EEXIST {
        true => Err((Step::Bind, errno())),
        false => Ok(()),
    };
    for dir in &bind.dirs {
        made(sys::mkdir(dir, 0o700))?;
    }
    if bind.dir {
        made(sys::mkdir(&bind.target, 0o700))?;
    } else {
        let file = sys::open(
            &bind.target,
            libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
            0o600,
        );
        check(Step::Bind, file)?;
        sys::close(file);
    }
    let mut source = [0u8; 32];
    let source = fd_path(fd, &mut source);
    check(
        Step::Bind,
        sys::mount(Some(source), &bind.target, None, libc::MS_BIND, None),
    )?;
    if bind.writable {
        return Ok(());
    }
    let read_only = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | bind.flags;
    check(
        Step::Bind,
        sys::mount(None, &bind.target, None, read_only, None),
    )
}

/// `/proc/self/fd/FD`, written into `buffer` (no allocation: it runs
/// between `fork` and `exec`).
fn fd_path(fd: i32, buffer: &mut [u8; 32]) -> &CStr {
    let prefix = b"/proc/self/fd/";
    buffer[..prefix.len()].copy_from_slice(prefix);
    let mut digits = [0u8; 10];
    let (mut n, mut count) = (fd.unsigned_abs(), 0);
    loop {
        digits[count] = b'0' + (n % 10) as u8;
        count += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for (i, digit) in digits[..count].iter().rev().enumerate() {
        buffer[prefix.len() + i] = *digit;
    }
    buffer[prefix.len() + count] = 0;
    CStr::from_bytes_until_nul(buffer).unwrap_or(c"/")
}

/// Step 4: empties the bounding and ambient sets and locks securebits so
/// that root gains no capabilities at `exec`.
fn drop_capabilities() -> Result<(), (Step, i32)> {
    // NOROOT, NO_SETUID_FIXUP and NO_CAP_AMBIENT_RAISE, each locked, and
    // KEEP_CAPS locked off.
    const SECUREBITS: libc::c_ulong = 0b1110_1111;
    for cap in 0..64 {
        if sys::prctl(libc::PR_CAPBSET_DROP, cap, 0) != 0 && errno() != libc::EINVAL {
            return Err((Step::Capabilities, errno()));
        }
    }
    let ambient = sys::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as _, 0);
    check(Step::Capabilities, ambient)?;
    check(
        Step::Capabilities,
        sys::prctl(libc::PR_SET_SECUREBITS, SECUREBITS, 0),
    )
}

/// Writes `text` to the file at `path` (one `write`).
fn write_file(path: &CStr, text: &CStr) -> Result<(), i32> {
    let fd = sys::open(path, libc::O_WRONLY | libc::O_CLOEXEC, 0);
    if fd < 0 {
        return Err(errno());
    }
    let bytes = text.to_bytes();
    let failed = (sys::write(fd, bytes) != bytes.len() as isize).then(errno);
    sys::close(fd);
    failed.map_or(Ok(()), Err)
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn check(step: Step, result: i32) -> Result<(), (Step, i32)> {
    if result < 0 {
        Err((step, errno()))
    } else {
        Ok(())
    }
}

/// The system calls of the steps (`sys.rs`).
mod sys;

/// Runs the steps in a forked child that then exits: `Err` names the step
/// that failed and why.
fn probe(shared: &Shared) -> Result<(), (Step, std::io::Error)> {
    let failed = |source| (Step::Unshare, source);
    let (read, write): (OwnedFd, OwnedFd) = {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` has room for the two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(failed(std::io::Error::last_os_error()));
        }
        // SAFETY: pipe2 just opened both; nothing else owns them.
        unsafe {
            use std::os::fd::FromRawFd;
            (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
        }
    };
    // SAFETY: the child runs only async-signal-safe calls (`enter`,
    // write, _exit) before it exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(failed(std::io::Error::last_os_error()));
    }
    if pid == 0 {
        let code = match enter(shared, &[None, None, None, None], None) {
            Ok(()) => 0,
            Err((step, errno)) => {
                let mut report = [0u8; 5];
                report[0] = step as u8;
                report[1..].copy_from_slice(&errno.to_ne_bytes());
                // SAFETY: the pipe is open; the buffer outlives the call.
                unsafe { libc::write(write.as_raw_fd(), report.as_ptr().cast(), 5) };
                1
            }
        };
        // SAFETY: _exit ends the forked child without running anything of
        // the parent's.
        unsafe { libc::_exit(code) };
    }
    drop(write);
    let mut status = 0;
    // SAFETY: `pid` is our child.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0 && errno() == libc::EINTR {}
    let mut report = [0u8; 5];
    // SAFETY: the buffer has room for 5 bytes.
    let got = unsafe { libc::read(read.as_raw_fd(), report.as_mut_ptr().cast(), 5) };
    if got == 5 {
        let step = Step::from_byte(report[0]).unwrap_or(Step::Unshare);
        let errno = i32::from_ne_bytes([report[1], report[2], report[3], report[4]]);
        return Err((step, std::io::Error::from_raw_os_error(errno)));
    }
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        Ok(())
    } else {
        Err(failed(std::io::Error::other(format!(
            "the probe process ended with status {status}"
        ))))
    }
}
