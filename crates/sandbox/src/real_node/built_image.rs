//! An image as one of our Dockerfiles describes it, built from its build context's files with no
//! container engine (`docs/plans/real-node.md` S4): the Dockerfile read for one architecture
//! ([`dockerfile::parse`]), its `COPY`s taken from the context, and in place of the distroless
//! base what a binary needs of it: the users and groups (`nonroot` is 65532), and for the `cc`
//! base the glibc files the binary's `ldd` names (the host's Debian 12 glibc 2.36, the release
//! `distroless/cc-debian12` ships: the equivalence this sandbox rests on). The result is an
//! [`image::Image`], written as a layout tar by [`image::layout_tar`].

use std::path::{Path, PathBuf};

use super::{
    dockerfile::{self, DockerfileError},
    image::{File, Image},
};

/// distroless's `/etc/passwd`: root, nobody, nonroot.
const PASSWD: &str = "root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
";

/// distroless's `/etc/group`.
const GROUP: &str = "root:x:0:
nobody:x:65534:
nonroot:x:65532:
";

/// distroless's `PATH`.
const PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Why an image could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildImageError {
    /// The Dockerfile could not be followed.
    #[error(transparent)]
    Dockerfile(#[from] DockerfileError),
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The failure.
        source: std::io::Error,
    },
    /// `ldd` could not name a binary's libraries.
    #[error("ldd {binary}: {why}")]
    Libraries {
        /// The binary.
        binary: String,
        /// What went wrong.
        why: String,
    },
}

/// The image `dockerfile` describes for `arch`, named `reference`, its `COPY` sources read from
/// `context`.
///
/// # Errors
/// See [`BuildImageError`].
pub fn from_dockerfile(
    dockerfile: &str,
    arch: &str,
    context: &Path,
    reference: &str,
) -> Result<Image, BuildImageError> {
    let spec = dockerfile::parse(dockerfile, arch)?;
    // Either base is followed the same way (see the module's header); an unknown one is refused.
    spec.base_kind()?;
    let copies: Vec<(PathBuf, &str)> = spec
        .copies
        .iter()
        .map(|(source, destination)| (context.join(source), destination.as_str()))
        .collect();
    Ok(Image {
        reference: reference.to_owned(),
        files: base_and(&copies, &[])?,
        entrypoint: spec.entrypoint,
        cmd: spec.cmd,
        env: std::iter::once(PATH.to_owned()).chain(spec.env).collect(),
        exposed: spec.exposed,
        user: spec.user.unwrap_or_else(|| "0:0".to_owned()),
    })
}

/// An image of one binary whose Dockerfile is not ours (NVIDIA's device plugin): the binary at
/// `destination`, its entrypoint, on the same stand-in base (users, groups, the libraries its
/// `ldd` names), run as root with `env` beside `PATH`, as its own image runs it. `loads` names the
/// libraries it opens at run time from outside the image (the driver's NVML, mounted from the
/// host): the libraries *they* link are added too, as the image's full base would hold them
/// (NVIDIA's is a UBI image; the NVML stand-in, a Rust library, links `libgcc_s`).
///
/// # Errors
/// See [`BuildImageError`].
pub fn of_binary(
    binary: &Path,
    destination: &str,
    reference: &str,
    env: &[String],
    loads: &[&Path],
) -> Result<Image, BuildImageError> {
    Ok(Image {
        reference: reference.to_owned(),
        files: base_and(&[(binary.to_owned(), destination)], loads)?,
        entrypoint: vec![destination.to_owned()],
        cmd: Vec::new(),
        env: std::iter::once(PATH.to_owned())
            .chain(env.iter().cloned())
            .collect(),
        exposed: Vec::new(),
        user: "0:0".to_owned(),
    })
}

/// The stand-in base's files, each binary (read from its source, put at its destination) with the
/// libraries it links, and the libraries each of `loads` links; sorted by path, each path once.
fn base_and(binaries: &[(PathBuf, &str)], loads: &[&Path]) -> Result<Vec<File>, BuildImageError> {
    let mut files = vec![
        file("etc/passwd", PASSWD.as_bytes().to_vec(), 0o644),
        file("etc/group", GROUP.as_bytes().to_vec(), 0o644),
    ];
    for (source, destination) in binaries {
        files.push(file(destination, read(source)?, 0o755));
    }
    let linking = binaries
        .iter()
        .map(|(source, _)| source.as_path())
        .chain(loads.iter().copied());
    for linker in linking {
        for library in libraries(linker)? {
            let content = read(Path::new(&library))?;
            files.push(file(&library, content, 0o755));
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files.dedup_by(|a, b| a.path == b.path);
    Ok(files)
}

fn file(path: &str, content: Vec<u8>, mode: u32) -> File {
    File {
        path: path.trim_start_matches('/').to_owned(),
        content,
        mode,
    }
}

fn read(path: &Path) -> Result<Vec<u8>, BuildImageError> {
    std::fs::read(path).map_err(|source| BuildImageError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// The files `ldd` names for `binary`.
fn libraries(binary: &Path) -> Result<Vec<String>, BuildImageError> {
    let failed = |why: String| BuildImageError::Libraries {
        binary: binary.display().to_string(),
        why,
    };
    let output = std::process::Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|error| failed(error.to_string()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    // `ldd` of a static binary says so (glibc's: "not a dynamic executable") and exits 1: nothing
    // to add.
    let is_static = text.contains("statically linked")
        || String::from_utf8_lossy(&output.stderr).contains("not a dynamic executable");
    if is_static {
        return Ok(Vec::new());
    }
    if !output.status.success() {
        return Err(failed(String::from_utf8_lossy(&output.stderr).into_owned()));
    }
    dockerfile::libraries_from_ldd(&text).ok_or_else(|| failed(format!("a library was not found: {text}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_image_carries_its_binary_glibc_and_users_as_its_dockerfile_says() {
        // Any dynamically linked binary stands in for the agent's: the test's own.
        let context = std::env::temp_dir().join(format!("built-image-{}", std::process::id()));
        std::fs::create_dir_all(context.join("amd64")).unwrap();
        let binary = std::env::current_exe().unwrap();
        std::fs::copy(&binary, context.join("amd64/gpu-health-agent")).unwrap();
        let image = from_dockerfile(
            include_str!("../../../agent/Dockerfile"),
            "amd64",
            &context,
            "docker.io/library/gpu-health-agent:sandbox",
        )
        .unwrap();
        std::fs::remove_dir_all(&context).unwrap();

        let paths: Vec<&str> = image.files.iter().map(|f| f.path.as_str()).collect();
        assert!(paths.contains(&"usr/local/bin/gpu-health-agent"), "{paths:?}");
        assert!(paths.contains(&"etc/passwd"), "{paths:?}");
        assert!(
            paths.iter().any(|p| p.ends_with("/libc.so.6")),
            "glibc: {paths:?}"
        );
        assert!(
            paths.iter().any(|p| p.contains("ld-linux")),
            "the loader: {paths:?}"
        );
        assert_eq!(image.user, "65532:65532");
        assert_eq!(image.entrypoint, ["/usr/local/bin/gpu-health-agent"]);
        assert!(
            image
                .env
                .contains(&"NVML_LIBRARY=/host/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1".to_owned())
        );
    }

    #[test]
    fn an_image_of_one_binary_runs_it_as_root_with_its_libraries_and_the_environment_given() {
        let binary = std::env::current_exe().unwrap();
        let image = of_binary(
            &binary,
            "/usr/bin/nvidia-device-plugin",
            "nvcr.io/nvidia/k8s-device-plugin:sandbox",
            &["LD_LIBRARY_PATH=/driver-root/usr/lib".to_owned()],
            &[],
        )
        .unwrap();
        let paths: Vec<&str> = image.files.iter().map(|f| f.path.as_str()).collect();
        assert!(paths.contains(&"usr/bin/nvidia-device-plugin"), "{paths:?}");
        assert!(
            paths.iter().any(|p| p.ends_with("/libc.so.6")),
            "glibc: {paths:?}"
        );
        assert_eq!(image.entrypoint, ["/usr/bin/nvidia-device-plugin"]);
        assert_eq!(image.user, "0:0");
        assert_eq!(image.env[0], PATH);
        assert_eq!(image.env[1], "LD_LIBRARY_PATH=/driver-root/usr/lib");
        let mut sorted = paths.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(paths, sorted, "sorted, each path once");
    }
}
