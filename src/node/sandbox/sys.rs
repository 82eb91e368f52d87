//! The system calls of the sandbox's steps, safe to call: each takes
//! NUL-terminated strings (or nulls) that outlive the call, and changes
//! only the calling process. All are async-signal-safe (they run between
//! `fork` and `exec`).

use std::ffi::CStr;
use std::os::fd::{AsRawFd, OwnedFd};

fn ptr(text: Option<&CStr>) -> *const libc::c_char {
    text.map_or(std::ptr::null(), CStr::as_ptr)
}

pub(super) fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> i32 {
    // SAFETY: see the module.
    unsafe {
        libc::mount(
            ptr(source),
            target.as_ptr(),
            ptr(fstype),
            flags,
            ptr(data).cast(),
        )
    }
}

pub(super) fn unshare(flags: i32) -> i32 {
    // SAFETY: see the module (the caller is single-threaded, as a
    // forked child is).
    unsafe { libc::unshare(flags) }
}

pub(super) fn open(path: &CStr, flags: i32, mode: libc::mode_t) -> i32 {
    // SAFETY: see the module.
    unsafe { libc::open(path.as_ptr(), flags, mode) }
}

pub(super) fn write(fd: i32, bytes: &[u8]) -> isize {
    // SAFETY: `bytes` is valid for its length.
    unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) }
}

pub(super) fn close(fd: i32) {
    // SAFETY: the caller owns `fd` and does not use it again.
    unsafe { libc::close(fd) };
}

pub(super) fn mkdir(path: &CStr, mode: libc::mode_t) -> i32 {
    // SAFETY: see the module.
    unsafe { libc::mkdir(path.as_ptr(), mode) }
}

pub(super) fn chdir(path: &CStr) -> i32 {
    // SAFETY: see the module.
    unsafe { libc::chdir(path.as_ptr()) }
}

pub(super) fn prctl(option: i32, arg: libc::c_ulong, arg2: libc::c_ulong) -> i32 {
    // SAFETY: see the module; the options used take integers only.
    unsafe { libc::prctl(option, arg, arg2, 0, 0) }
}

pub(super) fn landlock_restrict_self(ruleset: &OwnedFd) -> i32 {
    // SAFETY: the ruleset descriptor is open; flags 0.
    unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0) as i32 }
}
