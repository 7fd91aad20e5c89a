//! Where the stand-in finds its scenario: the file `GPU_STANDIN_SCENARIO` names; when that is unset
//! (or empty), `scenario.json` in the directory of the path the library was loaded by (a symlink
//! not followed: a scenario beside a `libnvidia-ml.so.1` link is found). A pod that a Helm chart
//! starts sets no such variable, so its node's scenario sits beside the library instead. The path
//! is chosen once, at the first call; the file itself may come, go and change afterwards.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
};

/// The environment variable naming the scenario file.
pub const SCENARIO_ENV: &str = "GPU_STANDIN_SCENARIO";

/// The scenario's file name beside the library, read when [`SCENARIO_ENV`] is unset.
pub const SCENARIO_FILE: &str = "scenario.json";

/// The scenario's path from [`SCENARIO_ENV`]'s value (`named`), else beside `library`, the path the
/// library was loaded by; `None` when neither is known.
#[must_use]
pub fn scenario_path(named: Option<OsString>, library: Option<&Path>) -> Option<PathBuf> {
    named
        .filter(|named| !named.is_empty())
        .map(PathBuf::from)
        .or_else(|| Some(library?.parent()?.join(SCENARIO_FILE)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_comes_first() {
        let path = scenario_path(
            Some("/tmp/named.json".into()),
            Some(Path::new("/run/driver/libnvidia-ml.so.1")),
        );
        assert_eq!(path.as_deref(), Some(Path::new("/tmp/named.json")));
    }

    #[test]
    fn unset_or_empty_the_file_beside_the_library_is_read() {
        let library = Path::new("/run/gpu-driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1");
        let beside = Path::new("/run/gpu-driver/usr/lib/x86_64-linux-gnu/scenario.json");
        assert_eq!(scenario_path(None, Some(library)).as_deref(), Some(beside));
        assert_eq!(
            scenario_path(Some(OsString::new()), Some(library)).as_deref(),
            Some(beside)
        );
    }

    #[test]
    fn neither_known_is_no_scenario() {
        assert_eq!(scenario_path(None, None), None);
        assert_eq!(
            scenario_path(None, Some(Path::new("/"))),
            None,
            "a path without a directory"
        );
    }
}
