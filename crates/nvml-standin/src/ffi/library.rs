//! Where this library was loaded from, as the dynamic loader tells it.

use std::{
    ffi::{CStr, OsStr, c_void},
    os::unix::ffi::OsStrExt as _,
    path::PathBuf,
};

/// The path the loader opened this library by (a symlink not followed), if the loader knows it.
pub(super) fn own_path() -> Option<PathBuf> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    let address = (own_path as fn() -> Option<PathBuf>) as *const c_void;
    // SAFETY: `dladdr` only compares `address` with the loaded objects' ranges (it reads nothing
    // there) and writes `info`, a live local.
    let found = unsafe { libc::dladdr(address, &raw mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: on success `dli_fname` is the loader's NUL-terminated name of the object holding
    // `address`: this library, which stays loaded while its code runs.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(OsStr::from_bytes(name.to_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loader_names_the_object_holding_this_code() {
        // In a unit test that object is the test executable, not a library.
        let path = own_path().expect("dladdr knows the test executable");
        assert!(!path.as_os_str().is_empty());
    }
}
