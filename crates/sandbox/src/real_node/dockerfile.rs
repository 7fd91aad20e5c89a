//! The images a real node runs, as our Dockerfiles describe them (`docs/plans/real-node.md` S4):
//! the Dockerfile is read (the instructions ours use: `ARG`, `FROM ... AS`, `ENV`, `COPY`, `USER`,
//! `EXPOSE`, `ENTRYPOINT`, `CMD`) for one architecture, and what a registry base would give is
//! named by [`Base`]. An instruction this reader does not know is an error, so a Dockerfile that
//! grows one cannot drift from the images built here unnoticed. Pure.

use std::collections::HashMap;

/// What a Dockerfile builds, for one architecture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSpec {
    /// The base image (after stages and arguments are resolved).
    pub base: String,
    /// `ENV`, in order (`KEY=value`), the base stage's first.
    pub env: Vec<String>,
    /// `COPY` source (relative to the build context) and destination.
    pub copies: Vec<(String, String)>,
    /// `USER`.
    pub user: Option<String>,
    /// `EXPOSE` (`8080/tcp`).
    pub exposed: Vec<String>,
    /// `ENTRYPOINT` (exec form).
    pub entrypoint: Vec<String>,
    /// `CMD` (exec form).
    pub cmd: Vec<String>,
}

/// What the distroless bases our Dockerfiles name hold that a binary needs at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Base {
    /// `distroless/static`: users and groups (`nonroot` is 65532), no libc.
    Static,
    /// `distroless/cc`: that, and glibc (here: the files the binary's `ldd` names, the host's
    /// Debian 12 glibc 2.36, the same release distroless/cc-debian12 ships).
    Cc,
}

/// A Dockerfile this reader cannot follow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DockerfileError {
    /// An instruction it does not know.
    #[error("line {line}: instruction {instruction} is not one the sandbox's image builder follows")]
    Unknown {
        /// The line number (1-based).
        line: usize,
        /// The instruction.
        instruction: String,
    },
    /// An instruction whose arguments it cannot read.
    #[error("line {line}: {why}")]
    Malformed {
        /// The line number (1-based).
        line: usize,
        /// What is wrong.
        why: String,
    },
    /// A base image it has no content for.
    #[error("base image {0} is not one the sandbox knows the content of")]
    UnknownBase(String),
}

impl ImageSpec {
    /// The distroless base this image starts from.
    ///
    /// # Errors
    /// When the base is not a distroless static or cc image.
    pub fn base_kind(&self) -> Result<Base, DockerfileError> {
        if self.base.starts_with("gcr.io/distroless/static-") {
            Ok(Base::Static)
        } else if self.base.starts_with("gcr.io/distroless/cc-") {
            Ok(Base::Cc)
        } else {
            Err(DockerfileError::UnknownBase(self.base.clone()))
        }
    }
}

/// Reads `dockerfile` for architecture `arch` (the value `TARGETARCH` takes).
///
/// # Errors
/// See [`DockerfileError`].
pub fn parse(dockerfile: &str, arch: &str) -> Result<ImageSpec, DockerfileError> {
    let mut args: HashMap<String, String> = HashMap::new();
    // Named stages, each with its registry base resolved; the stage being read, with its name.
    let mut stages: HashMap<String, ImageSpec> = HashMap::new();
    let mut current: Option<(Option<String>, ImageSpec)> = None;
    for (index, raw) in dockerfile.lines().enumerate() {
        let line = index + 1;
        let text = raw.trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        let (instruction, rest) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
        let rest = substitute(rest.trim(), &args);
        let malformed = |why: &str| DockerfileError::Malformed {
            line,
            why: why.to_owned(),
        };
        match instruction.to_ascii_uppercase().as_str() {
            "ARG" => {
                let (name, default) = rest.split_once('=').unwrap_or((rest.as_str(), ""));
                let value = if name == "TARGETARCH" { arch } else { default };
                args.insert(name.to_owned(), value.to_owned());
            }
            "FROM" => {
                let words: Vec<&str> = rest.split_whitespace().collect();
                let (from, name) = match words.as_slice() {
                    [from] => (*from, None),
                    [from, as_, name] if as_.eq_ignore_ascii_case("as") => (*from, Some((*name).to_owned())),
                    _ => return Err(malformed("FROM takes an image and an optional AS name")),
                };
                if let Some((Some(done), stage)) = current.take() {
                    stages.insert(done, stage);
                }
                let stage = stages.get(from).cloned().unwrap_or_else(|| empty(from));
                current = Some((name, stage));
            }
            other => {
                let (_, stage) = current
                    .as_mut()
                    .ok_or_else(|| malformed("an instruction before FROM"))?;
                apply(stage, other, &rest, line)?;
            }
        }
    }
    current
        .map(|(_, stage)| stage)
        .ok_or_else(|| DockerfileError::Malformed {
            line: 0,
            why: "no FROM".into(),
        })
}

fn empty(base: &str) -> ImageSpec {
    ImageSpec {
        base: base.to_owned(),
        env: Vec::new(),
        copies: Vec::new(),
        user: None,
        exposed: Vec::new(),
        entrypoint: Vec::new(),
        cmd: Vec::new(),
    }
}

fn apply(stage: &mut ImageSpec, instruction: &str, rest: &str, line: usize) -> Result<(), DockerfileError> {
    let malformed = |why: &str| DockerfileError::Malformed {
        line,
        why: why.to_owned(),
    };
    match instruction {
        "ENV" => {
            let (key, value) = rest
                .split_once('=')
                .ok_or_else(|| malformed("ENV takes KEY=value"))?;
            stage.env.retain(|kept| !kept.starts_with(&format!("{key}=")));
            stage.env.push(format!("{key}={value}"));
        }
        "COPY" => {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let [source, destination] = words.as_slice() else {
                return Err(malformed("COPY takes one source and a destination"));
            };
            stage
                .copies
                .push(((*source).to_owned(), (*destination).to_owned()));
        }
        "USER" => stage.user = Some(rest.to_owned()),
        "EXPOSE" => stage.exposed.extend(rest.split_whitespace().map(|port| {
            if port.contains('/') {
                port.to_owned()
            } else {
                format!("{port}/tcp")
            }
        })),
        "ENTRYPOINT" | "CMD" => {
            let words: Vec<String> = serde_json::from_str(rest)
                .map_err(|_| malformed("ENTRYPOINT and CMD take the exec (JSON) form"))?;
            if instruction == "CMD" {
                stage.cmd = words;
            } else {
                stage.entrypoint = words;
            }
        }
        unknown => {
            return Err(DockerfileError::Unknown {
                line,
                instruction: unknown.to_owned(),
            });
        }
    }
    Ok(())
}

/// `${NAME}` and `$NAME` replaced by the arguments' values, the longest names first (so `$ARCH`
/// cannot take the start of `$ARCHIVE`).
fn substitute(text: &str, args: &HashMap<String, String>) -> String {
    let mut names: Vec<(&String, &String)> = args.iter().collect();
    names.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(b.0)));
    let mut out = text.to_owned();
    for (name, value) in names {
        out = out
            .replace(&format!("${{{name}}}"), value)
            .replace(&format!("${name}"), value);
    }
    out
}

/// The files `ldd` names for a dynamically linked binary (the loader and each library it
/// resolved), from `ldd`'s output; `None` when a library was not found.
#[must_use]
pub fn libraries_from_ldd(output: &str) -> Option<Vec<String>> {
    let mut files = Vec::new();
    for line in output.lines().map(str::trim) {
        if line.starts_with("linux-vdso") || line.contains("statically linked") || line.is_empty() {
            continue;
        }
        if line.contains("=> not found") {
            return None;
        }
        let path = match line.split_once("=>") {
            Some((_, resolved)) => resolved.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(path) = path.filter(|p| p.starts_with('/')) {
            files.push(path.to_owned());
        }
    }
    Some(files)
}

#[cfg(test)]
#[path = "dockerfile_tests.rs"]
mod tests;
