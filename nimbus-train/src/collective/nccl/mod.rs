//! The NCCL backend (feature `cuda`), through cudarc: collectives between
//! GPU workers, on device memory.
//!
//! cudarc loads libcuda at run time and panics when it cannot, so every
//! entry point [`probe`]s for it first and fails with a clear error
//! instead; NCCL is loaded by nimbus (`library.rs`: the one that came with
//! the libtorch in use, or `NIMBUS_NCCL_LIB`, version 2.10 or newer). Rank 0 makes the group's unique id
//! ([`unique_id`]); the supervisor hands it to every rank through the actor
//! system; each rank [`NcclGroup::join`]s with it. Both first set the
//! run's NCCL variables (`ScalingConfig::nccl_env`, and with
//! `nccl_host_id_per_rank` the rank's own `NCCL_HOSTID`) in the process,
//! since NCCL reads its settings from the environment at its first call.
//!
//! Every call is bounded by the collective timeout:
//! 1. joining: the communicator is made non-blocking (NCCL 2.17 and newer;
//!    `library.rs`), so `ncclCommInitRankConfig` returns at once and the
//!    join polls `ncclCommGetAsyncError` until it is done, failed, or past
//!    the timeout (a missing peer); older NCCLs join blocking;
//! 2. operations are launched on the legacy default stream (libtorch's
//!    default); a launch may return `ncclInProgress`;
//! 3. the wait polls `ncclCommGetAsyncError` (until the launch is done,
//!    and for errors NCCL saw asynchronously, such as a peer that died),
//!    then the stream, with a deadline: a peer that died or hangs makes
//!    the wait fail or time out. Between polls it yields the thread for
//!    the first `YIELD_FOR` (most collectives of a step end within it; a
//!    sleep there would add the kernel's timer slack, ~50 µs, to each),
//!    then sleeps `POLL_SLEEP`;
//! 4. any error, timeout, or the group's abort flag aborts the
//!    communicator (`ncclCommAbort`), so a dead peer turns into a restart
//!    instead of NCCL's indefinite wait; errors name the NCCL call and
//!    NCCL's words (`ncclGetErrorString`).
//!
//! Gradients of CUDA tensors (f32, bf16 or f16, in NCCL's own types) are
//! averaged in place (`ncclAvg`), all of a step's in one NCCL group call;
//! `prepare_model`'s copy of rank 0's parameters is one group of
//! in-place `ncclBroadcast`s the same way. (A non-contiguous tensor goes
//! through a contiguous copy on its device.)
//!
//! Checked on a GPU by `scripts/gpu-check.sh` (README: "The GPU check"),
//! which is where its figures come from.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::result as cuda;
use cudarc::driver::sys as cuda_sys;
use cudarc::nccl::sys as nccl_sys;

use super::{Collective, CollectiveError};

mod library;

pub use library::{
    load, nccl, version_text, CommConfig, Nccl, MIN_VERSION, NCCL_LIB_ENV, NON_BLOCKING_VERSION,
    SONAME,
};
use library::{IN_PROGRESS, SUCCESS};

/// How long a wait (step 3) polls without sleeping, yielding the thread
/// between polls.
const YIELD_FOR: Duration = Duration::from_millis(2);
/// A wait's sleep between polls after [`YIELD_FOR`].
const POLL_SLEEP: Duration = Duration::from_micros(50);
/// A join's sleep between polls (step 1: joins take milliseconds).
const JOIN_POLL_SLEEP: Duration = Duration::from_millis(1);

/// Checks that the CUDA driver and NCCL can be loaded and the driver
/// initialised; this process's NCCL.
pub fn probe() -> Result<&'static Nccl, CollectiveError> {
    // SAFETY: loading a shared library runs no initialisers with
    // preconditions of ours.
    unsafe { libloading::Library::new("libcuda.so.1") }.map_err(|e| {
        CollectiveError::Setup(format!(
            "no CUDA driver here (libcuda.so.1 does not load: {e}); NCCL needs a GPU"
        ))
    })?;
    let nccl = nccl()?;
    cuda::init()
        .map_err(|e| CollectiveError::Setup(format!("the CUDA driver failed to start: {e}")))?;
    Ok(nccl)
}

/// Sets the run's NCCL variables (`NCCL_*`, checked by the driver) in this
/// process before NCCL reads them: NCCL reads its settings from the
/// environment, most of them once, at its first call.
fn apply_settings(env: &[(String, String)]) {
    for (name, value) in env {
        if std::env::var(name).ok().as_deref() != Some(value) {
            tracing::info!("NCCL setting {name}={value} (the run's)");
            // The process has other threads, but none of nimbus's reads
            // NCCL_* variables, and glibc keeps the environment it
            // replaces alive, so a concurrent getenv reads the old value
            // or the new one.
            std::env::set_var(name, value);
        }
    }
}

/// A new NCCL unique id, for rank 0 to hand to the group, after setting
/// rank 0's NCCL variables `env`.
pub fn unique_id(env: &[(String, String)]) -> Result<Vec<u8>, CollectiveError> {
    apply_settings(env);
    let nccl = probe()?;
    let mut id = nccl_sys::ncclUniqueId { internal: [0; 128] };
    // SAFETY: `id` is a valid out-pointer.
    nccl.check("ncclGetUniqueId", unsafe { (nccl.get_unique_id)(&mut id) })
        .map_err(CollectiveError::Setup)?;
    Ok(id.internal.iter().map(|&c| c as u8).collect())
}

/// One rank of an NCCL communicator.
pub struct NcclGroup {
    nccl: &'static Nccl,
    comm: nccl_sys::ncclComm_t,
    rank: usize,
    world: usize,
    timeout: Duration,
    aborted: Arc<AtomicBool>,
    dead: bool,
}

// SAFETY: the communicator is used by one thread at a time (the loop
// thread that owns the group); NCCL allows a communicator to move between
// threads.
unsafe impl Send for NcclGroup {}

impl NcclGroup {
    /// Joins the communicator of unique id `id` as `rank` of `world`, on the
    /// calling thread's current CUDA device, after setting this rank's NCCL
    /// variables `env`. Returns once every rank has joined.
    pub fn join(
        id: &[u8],
        rank: usize,
        world: usize,
        timeout: Duration,
        env: &[(String, String)],
    ) -> Result<Self, CollectiveError> {
        apply_settings(env);
        let nccl = probe()?;
        let mut unique = nccl_sys::ncclUniqueId { internal: [0; 128] };
        if id.len() != unique.internal.len() {
            return Err(CollectiveError::Setup(format!(
                "an NCCL unique id is 128 bytes, not {}",
                id.len()
            )));
        }
        for (slot, byte) in unique.internal.iter_mut().zip(id) {
            *slot = *byte as std::ffi::c_char;
        }
        let mut comm = std::ptr::null_mut();
        let (world_i, rank_i) = (world as i32, rank as i32);
        // Step 1.
        let (call, result) = match nccl.comm_init_rank_config {
            Some(init) => {
                let mut config = CommConfig::non_blocking();
                // SAFETY: `comm` and `config` are valid pointers; the id is
                // 128 bytes; NCCL reads `config` during the call only.
                let result = unsafe { init(&mut comm, world_i, unique, rank_i, &mut config) };
                ("ncclCommInitRankConfig", result)
            }
            // SAFETY: as above.
            None => ("ncclCommInitRank", unsafe {
                (nccl.comm_init_rank)(&mut comm, world_i, unique, rank_i)
            }),
        };
        let what = format!("{call} (rank {rank} of {world})");
        if let Err(e) = nccl.check_launch(&what, result) {
            if !comm.is_null() {
                // SAFETY: the half-made communicator is ours, unused after.
                let _ = unsafe { (nccl.comm_abort)(comm) };
            }
            return Err(CollectiveError::Setup(e));
        }
        let mut group = NcclGroup {
            nccl,
            comm,
            rank,
            world,
            timeout,
            aborted: Arc::new(AtomicBool::new(false)),
            dead: false,
        };
        group.poll(&what, false).map_err(|e| match e {
            CollectiveError::Aborted(reason) => CollectiveError::Setup(reason),
            e => e,
        })?;
        Ok(group)
    }

    /// `ncclCommGetAsyncError`: `Ok(true)` when nothing is pending,
    /// `Ok(false)` while a non-blocking operation runs, `Err` with NCCL's
    /// result code on an error.
    fn async_state(&self) -> Result<bool, i32> {
        let mut state = SUCCESS;
        // SAFETY: our communicator, and a valid out-pointer.
        let result = unsafe { (self.nccl.comm_get_async_error)(self.comm, &mut state) };
        match (result, state) {
            (SUCCESS, SUCCESS) => Ok(true),
            (SUCCESS, IN_PROGRESS) => Ok(false),
            (SUCCESS, error) | (error, _) => Err(error),
        }
    }

    /// A launch's result (step 2): an error aborts the communicator.
    fn launched(&mut self, call: &str, result: i32) -> Result<(), CollectiveError> {
        self.nccl.check_launch(call, result).map_err(|e| {
            self.abort();
            CollectiveError::Aborted(e)
        })
    }

    /// A flag that, once set, aborts the communicator at the next wait.
    pub fn abort_flag(&self) -> Arc<AtomicBool> {
        self.aborted.clone()
    }

    /// Steps 3 and 4: waits for the launched operations, then the default
    /// stream's work, aborting the communicator on an error, the timeout or
    /// the abort flag.
    fn wait(&mut self, what: &str) -> Result<(), CollectiveError> {
        self.poll(what, true)
    }

    /// Polls `ncclCommGetAsyncError` until nothing is pending, then (with
    /// `stream`) the default stream until its work is done; aborts the
    /// communicator on an error, the timeout or the abort flag. Step 1's
    /// join polls without `stream`.
    fn poll(&mut self, what: &str, stream: bool) -> Result<(), CollectiveError> {
        let started = Instant::now();
        loop {
            match self.async_state() {
                Err(code) => {
                    self.abort();
                    return Err(CollectiveError::Aborted(self.nccl.describe(what, code)));
                }
                Ok(false) => {}
                Ok(true) if !stream => return Ok(()),
                Ok(true) => {
                    // SAFETY: querying the legacy default stream.
                    let status = unsafe { cuda_sys::cuStreamQuery(std::ptr::null_mut()) };
                    match status {
                        cuda_sys::CUresult::CUDA_SUCCESS => return Ok(()),
                        cuda_sys::CUresult::CUDA_ERROR_NOT_READY => {}
                        error => {
                            self.abort();
                            return Err(CollectiveError::Aborted(format!(
                                "{what}: CUDA error {error:?}"
                            )));
                        }
                    }
                }
            }
            let aborted = self.aborted.load(Ordering::Acquire);
            if aborted || started.elapsed() > self.timeout {
                self.abort();
                return Err(if aborted {
                    CollectiveError::Aborted(format!("{what} aborted by the supervisor"))
                } else {
                    CollectiveError::Timeout {
                        after: self.timeout,
                        missing: Vec::new(),
                    }
                });
            }
            if !stream {
                std::thread::sleep(JOIN_POLL_SLEEP);
            } else if started.elapsed() < YIELD_FOR {
                std::thread::yield_now();
            } else {
                std::thread::sleep(POLL_SLEEP);
            }
        }
    }

    fn abort(&mut self) {
        if !self.dead {
            self.dead = true;
            // SAFETY: the communicator is ours and not used after this.
            let _ = unsafe { (self.nccl.comm_abort)(self.comm) };
        }
    }

    fn check_alive(&self) -> Result<(), CollectiveError> {
        if self.dead {
            Err(CollectiveError::Aborted(
                "the NCCL communicator was aborted".into(),
            ))
        } else {
            Ok(())
        }
    }

    /// In-place mean over the group of `count` f32 at device address `ptr`.
    ///
    /// # Safety
    /// `ptr` must point to `count` f32 of device memory of this rank's
    /// device, not used by anything else until this returns.
    pub unsafe fn allreduce_mean_device(
        &mut self,
        ptr: *mut f32,
        count: usize,
    ) -> Result<(), CollectiveError> {
        self.check_alive()?;
        let ptr = ptr as *mut std::ffi::c_void;
        let result = (self.nccl.all_reduce)(
            ptr,
            ptr,
            count,
            nccl_sys::ncclDataType_t::ncclFloat32,
            nccl_sys::ncclRedOp_t::ncclAvg,
            self.comm,
            std::ptr::null_mut(),
        );
        self.launched("ncclAllReduce", result)?;
        self.wait("allreduce")
    }

    /// Host buffers go through a device buffer.
    fn through_device(
        &mut self,
        values: &mut [f32],
        op: impl FnOnce(&mut Self, cuda_sys::CUdeviceptr) -> Result<(), CollectiveError>,
    ) -> Result<(), CollectiveError> {
        self.check_alive()?;
        let device_error = |e: cuda::DriverError| CollectiveError::Aborted(format!("CUDA: {e}"));
        let bytes = std::mem::size_of_val(values).max(4);
        // SAFETY: a fresh allocation of `bytes`, copied into and out of with
        // slices of that size, freed below.
        unsafe {
            let buffer = cuda::malloc_sync(bytes).map_err(device_error)?;
            let result = cuda::memcpy_htod_sync(buffer, values)
                .map_err(device_error)
                .and_then(|_| op(self, buffer))
                .and_then(|_| cuda::memcpy_dtoh_sync(values, buffer).map_err(device_error));
            let _ = cuda::free_sync(buffer);
            result
        }
    }
}

impl Collective for NcclGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn allreduce_mean(&mut self, values: &mut [f32]) -> Result<(), CollectiveError> {
        let count = values.len();
        // SAFETY: the buffer holds `count` f32 on this device.
        self.through_device(values, |group, buffer| unsafe {
            group.allreduce_mean_device(buffer as *mut f32, count)
        })
    }

    fn allreduce_sum(&mut self, values: &mut [f32]) -> Result<(), CollectiveError> {
        let count = values.len();
        self.through_device(values, |group, buffer| {
            let ptr = buffer as *mut std::ffi::c_void;
            // SAFETY: as above.
            let result = unsafe {
                (group.nccl.all_reduce)(
                    ptr,
                    ptr,
                    count,
                    nccl_sys::ncclDataType_t::ncclFloat32,
                    nccl_sys::ncclRedOp_t::ncclSum,
                    group.comm,
                    std::ptr::null_mut(),
                )
            };
            group.launched("ncclAllReduce", result)?;
            group.wait("allreduce")
        })
    }

    fn broadcast(&mut self, values: &mut [f32], root: usize) -> Result<(), CollectiveError> {
        if root >= self.world {
            return Err(CollectiveError::Invalid(format!(
                "broadcast root {root} in a group of {}",
                self.world
            )));
        }
        let count = values.len();
        self.through_device(values, |group, buffer| {
            let ptr = buffer as *mut std::ffi::c_void;
            // SAFETY: as above.
            let result = unsafe {
                (group.nccl.broadcast)(
                    ptr,
                    ptr,
                    count,
                    nccl_sys::ncclDataType_t::ncclFloat32,
                    root as i32,
                    group.comm,
                    std::ptr::null_mut(),
                )
            };
            group.launched("ncclBroadcast", result)?;
            group.wait("broadcast")
        })
    }

    fn barrier(&mut self) -> Result<(), CollectiveError> {
        self.allreduce_sum(&mut [0.0])
    }

    /// Every CUDA tensor (f32, bf16 or f16) averaged in place, in one
    /// NCCL group call.
    fn allreduce_mean_tensors(
        &mut self,
        tensors: &[tch::Tensor],
    ) -> Option<Result<(), CollectiveError>> {
        self.grouped(tensors, "allreduce", |nccl, ptr, count, dtype, comm| {
            // SAFETY: see `grouped`.
            let result = unsafe {
                (nccl.all_reduce)(
                    ptr,
                    ptr,
                    count,
                    dtype,
                    nccl_sys::ncclRedOp_t::ncclAvg,
                    comm,
                    std::ptr::null_mut(),
                )
            };
            ("ncclAllReduce", result)
        })
    }

    /// Every CUDA tensor (f32, bf16 or f16) overwritten with `root`'s, in
    /// one NCCL group call.
    fn broadcast_tensors(
        &mut self,
        tensors: &[tch::Tensor],
        root: usize,
    ) -> Option<Result<(), CollectiveError>> {
        if root >= self.world {
            return Some(Err(CollectiveError::Invalid(format!(
                "broadcast root {root} in a group of {}",
                self.world
            ))));
        }
        self.grouped(tensors, "broadcast", |nccl, ptr, count, dtype, comm| {
            // SAFETY: see `grouped`.
            let result = unsafe {
                (nccl.broadcast)(
                    ptr,
                    ptr,
                    count,
                    dtype,
                    root as i32,
                    comm,
                    std::ptr::null_mut(),
                )
            };
            ("ncclBroadcast", result)
        })
    }
}

/// NCCL's type for a tensor of `kind`, if nimbus sends that kind through
/// NCCL.
fn nccl_type(kind: tch::Kind) -> Option<nccl_sys::ncclDataType_t> {
    match kind {
        tch::Kind::Float => Some(nccl_sys::ncclDataType_t::ncclFloat32),
        tch::Kind::BFloat16 => Some(nccl_sys::ncclDataType_t::ncclBfloat16),
        tch::Kind::Half => Some(nccl_sys::ncclDataType_t::ncclFloat16),
        _ => None,
    }
}

impl NcclGroup {
    /// `call` on every tensor, in one NCCL group, then waits (steps 2–4);
    /// `None` unless every tensor is a contiguous CUDA tensor of a type
    /// NCCL gets from nimbus. `call` gets a tensor's device memory (its
    /// data pointer, element count and type) and the communicator, makes
    /// one in-place NCCL call on it, and returns the call's name and
    /// result.
    fn grouped(
        &mut self,
        tensors: &[tch::Tensor],
        what: &str,
        call: impl Fn(
            &Nccl,
            *mut std::ffi::c_void,
            usize,
            nccl_sys::ncclDataType_t,
            nccl_sys::ncclComm_t,
        ) -> (&'static str, i32),
    ) -> Option<Result<(), CollectiveError>> {
        let mut typed = Vec::with_capacity(tensors.len());
        for tensor in tensors {
            let dtype = nccl_type(tensor.kind())?;
            if !(tensor.device().is_cuda() && tensor.is_contiguous()) {
                return None;
            }
            typed.push((tensor, dtype));
        }
        Some((|| {
            self.check_alive()?;
            let nccl = self.nccl;
            // SAFETY: ncclGroupStart has no preconditions.
            let started = unsafe { (nccl.group_start)() };
            self.launched("ncclGroupStart", started)?;
            let mut launched = Ok(());
            for (tensor, dtype) in typed {
                // A contiguous CUDA tensor of `numel` elements of `dtype`
                // on this rank's device, which the caller does not touch
                // until the wait below returns.
                let (name, result) =
                    call(nccl, tensor.data_ptr(), tensor.numel(), dtype, self.comm);
                launched = nccl.check_launch(name, result);
                if launched.is_err() {
                    break;
                }
            }
            // SAFETY: closes the group started above (also after a failed
            // launch, so that this thread's group depth is back to 0).
            let ended = unsafe { (nccl.group_end)() };
            if let Err(e) = launched {
                self.abort();
                return Err(CollectiveError::Aborted(e));
            }
            self.launched("ncclGroupEnd", ended)?;
            self.wait(what)
        })())
    }
}

impl Drop for NcclGroup {
    fn drop(&mut self) {
        if !self.dead {
            // SAFETY: the communicator is ours; nothing uses it after drop.
            let _ = unsafe { (self.nccl.comm_destroy)(self.comm) };
        }
    }
}
