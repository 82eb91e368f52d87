//! Counting this machine's GPUs.

/// The number of GPUs this node offers when `--num-gpus` is not given.
///
/// As in Ray, `CUDA_VISIBLE_DEVICES` wins when set. Otherwise, with the
/// `cuda` feature, the CUDA driver is asked; without it (or without a
/// driver), the NVIDIA kernel driver's `/proc/driver/nvidia/gpus` is counted.
pub fn detect() -> usize {
    if let Ok(visible) = std::env::var("CUDA_VISIBLE_DEVICES") {
        return visible
            .split(',')
            .filter(|id| !id.trim().is_empty() && id.trim() != "-1")
            .count();
    }
    #[cfg(feature = "cuda")]
    if let Some(count) = cuda_device_count() {
        return count;
    }
    std::fs::read_dir("/proc/driver/nvidia/gpus")
        .map(|entries| entries.count())
        .unwrap_or(0)
}

#[cfg(feature = "cuda")]
fn cuda_device_count() -> Option<usize> {
    // cudarc panics when it cannot load libcuda, so make sure it can first.
    // SAFETY: loading libcuda runs no initialisers with preconditions of ours.
    unsafe { libloading::Library::new("libcuda.so.1") }.ok()?;
    cudarc::driver::result::init().ok()?;
    cudarc::driver::result::device::get_count()
        .ok()
        .map(|n| n as usize)
}
