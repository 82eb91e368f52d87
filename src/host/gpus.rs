//! Counting this machine's GPUs, and naming them.

/// The number of GPUs this node offers when `--num-gpus` is not given.
///
/// As in Ray, `CUDA_VISIBLE_DEVICES` wins when set. Otherwise the CUDA
/// driver is asked (`libcuda.so.1`, loaded at run time, so every build
/// counts GPUs); without a driver, the NVIDIA kernel driver's
/// `/proc/driver/nvidia/gpus` is counted.
pub fn detect() -> usize {
    if let Ok(visible) = std::env::var("CUDA_VISIBLE_DEVICES") {
        return visible
            .split(',')
            .filter(|id| !id.trim().is_empty() && id.trim() != "-1")
            .count();
    }
    if let Some(count) = cuda_device_count() {
        return count;
    }
    std::fs::read_dir("/proc/driver/nvidia/gpus")
        .map(|entries| entries.count())
        .unwrap_or(0)
}

/// The CUDA driver's count of devices; `None` without a driver or when it
/// fails to start.
fn cuda_device_count() -> Option<usize> {
    // The driver API's signatures (cuda.h): `CUresult cuInit(unsigned int)`,
    // `CUresult cuDeviceGetCount(int *)`; `CUDA_SUCCESS` is 0.
    type Init = unsafe extern "C" fn(flags: u32) -> i32;
    type DeviceGetCount = unsafe extern "C" fn(count: *mut i32) -> i32;
    // SAFETY: loading libcuda runs no initialisers with preconditions of ours.
    let driver = unsafe { libloading::Library::new("libcuda.so.1") }.ok()?;
    let mut count = 0;
    // SAFETY: both symbols have the types above; `count` outlives the call.
    let counted = unsafe {
        let init = driver.get::<Init>(b"cuInit\0").ok()?;
        let device_get_count = driver.get::<DeviceGetCount>(b"cuDeviceGetCount\0").ok()?;
        init(0) == 0 && device_get_count(&mut count) == 0
    };
    // An initialised driver stays loaded (as cudarc keeps it): unloading
    // it under a live CUDA context is not supported.
    std::mem::forget(driver);
    if counted {
        usize::try_from(count).ok()
    } else {
        None
    }
}

/// The device ids of this node's `count` GPUs, as its workers' CUDA sees
/// them: the entries of the node's own `CUDA_VISIBLE_DEVICES` when set
/// (indices or UUIDs), else `0`, `1`, …; when `count` is more than that
/// (`--num-gpus` above what is visible), the rest are numbered after.
pub fn device_ids(count: usize) -> Vec<String> {
    device_ids_from(std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(), count)
}

fn device_ids_from(visible: Option<&str>, count: usize) -> Vec<String> {
    let mut ids: Vec<String> = visible
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|id| !id.is_empty() && *id != "-1")
        .take(count)
        .map(String::from)
        .collect();
    let mut next = 0;
    while ids.len() < count {
        let id = next.to_string();
        if !ids.contains(&id) {
            ids.push(id);
        }
        next += 1;
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::device_ids_from;

    #[test]
    fn visible_devices_keep_their_ids_and_extra_gpus_are_numbered_after() {
        assert_eq!(device_ids_from(Some("5,6"), 2), ["5", "6"]);
        assert_eq!(device_ids_from(Some("5, 6,7"), 2), ["5", "6"]);
        assert_eq!(device_ids_from(Some("GPU-8f3c"), 1), ["GPU-8f3c"]);
        assert_eq!(device_ids_from(None, 3), ["0", "1", "2"]);
        assert_eq!(device_ids_from(Some("1"), 3), ["1", "0", "2"]);
        assert_eq!(device_ids_from(Some(""), 0), Vec::<String>::new());
    }
}
