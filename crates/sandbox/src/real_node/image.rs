//! Images built here, with no registry and no container engine: an OCI image layout (one
//! uncompressed layer, its config and manifest, an index naming the image) as a tar that
//! `ctr images import` takes (`docs/plans/real-node.md` §4: blobs are ingested by digest, the
//! index's `io.containerd.image.name` names the image, a full reference is kept as it is).
//! Pure: the bytes are built in memory, deterministic (modification times 0, owner root).

use sha2::{Digest, Sha256};

/// One file of an image's single layer.
#[derive(Debug, Clone)]
pub struct File {
    /// Its path in the image, without a leading `/`.
    pub path: String,
    /// Its content.
    pub content: Vec<u8>,
    /// Its permission bits.
    pub mode: u32,
}

/// An image: its full reference, its files, and what runs.
#[derive(Debug, Clone)]
pub struct Image {
    /// A full reference (`registry/repository:tag`), as the CRI resolves a pod's image.
    pub reference: String,
    /// The layer's files.
    pub files: Vec<File>,
    /// The entrypoint.
    pub entrypoint: Vec<String>,
    /// Its default arguments.
    pub cmd: Vec<String>,
    /// Its environment (`KEY=value`).
    pub env: Vec<String>,
    /// Ports it exposes (`8080/tcp`).
    pub exposed: Vec<String>,
    /// `uid:gid` it runs as.
    pub user: String,
}

const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// The image as an OCI layout tar.
///
/// # Errors
/// When a file's path cannot be written in a tar header.
pub fn layout_tar(image: &Image) -> std::io::Result<Vec<u8>> {
    let layer = tar_of(
        image
            .files
            .iter()
            .map(|file| (file.path.as_str(), file.content.as_slice(), file.mode)),
    )?;
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": image.entrypoint,
            "Cmd": image.cmd,
            "Env": image.env,
            "ExposedPorts": image.exposed.iter().map(|port| (port.clone(), serde_json::json!({})))
                .collect::<serde_json::Map<_, _>>(),
            "User": image.user,
        },
        "rootfs": {"type": "layers", "diff_ids": [digest(&layer)]},
    }))?;
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": digest(&config),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": digest(&layer),
            "size": layer.len(),
        }],
    }))?;
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": MANIFEST,
            "digest": digest(&manifest),
            "size": manifest.len(),
            "annotations": {
                "io.containerd.image.name": image.reference,
                "org.opencontainers.image.ref.name": image.reference,
            },
        }],
    }))?;
    let blob = |bytes: &[u8]| format!("blobs/sha256/{}", &digest(bytes)["sha256:".len()..]);
    let (layer_path, config_path, manifest_path) = (blob(&layer), blob(&config), blob(&manifest));
    tar_of([
        (
            "oci-layout",
            br#"{"imageLayoutVersion":"1.0.0"}"#.as_slice(),
            0o644,
        ),
        ("index.json", index.as_slice(), 0o644),
        (layer_path.as_str(), layer.as_slice(), 0o644),
        (config_path.as_str(), config.as_slice(), 0o644),
        (manifest_path.as_str(), manifest.as_slice(), 0o644),
    ])
}

/// `sha256:<hex>` of `bytes`.
#[must_use]
pub fn digest(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    Sha256::digest(bytes)
        .iter()
        .fold(String::from("sha256:"), |mut hex, byte| {
            let _ = write!(hex, "{byte:02x}");
            hex
        })
}

fn tar_of<'a>(entries: impl IntoIterator<Item = (&'a str, &'a [u8], u32)>) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, content, mode) in entries {
        let mut header = tar::Header::new_ustar();
        header.set_size(content.len() as u64);
        header.set_mode(mode);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut header, path, content)?;
    }
    builder.into_inner()
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, io::Read as _};

    use super::*;

    fn entries(tar: &[u8]) -> HashMap<String, Vec<u8>> {
        let mut archive = tar::Archive::new(tar);
        archive
            .entries()
            .unwrap()
            .map(|entry| {
                let mut entry = entry.unwrap();
                let path = entry.path().unwrap().to_string_lossy().into_owned();
                let mut content = Vec::new();
                entry.read_to_end(&mut content).unwrap();
                (path, content)
            })
            .collect()
    }

    fn json(bytes: &[u8]) -> serde_json::Value {
        serde_json::from_slice(bytes).unwrap()
    }

    #[test]
    fn the_layout_names_the_image_and_every_blob_is_stored_under_its_digest() {
        let image = Image {
            reference: "registry.k8s.io/pause:3.10.1".into(),
            files: vec![File {
                path: "pause".into(),
                content: b"\x7fELF".to_vec(),
                mode: 0o755,
            }],
            entrypoint: vec!["/pause".into()],
            cmd: Vec::new(),
            env: Vec::new(),
            exposed: vec!["8080/tcp".into()],
            user: "65535:65535".into(),
        };
        let tar = layout_tar(&image).unwrap();
        let files = entries(&tar);
        assert_eq!(json(&files["oci-layout"])["imageLayoutVersion"], "1.0.0");
        for (path, content) in &files {
            if let Some(hex) = path.strip_prefix("blobs/sha256/") {
                assert_eq!(digest(content), format!("sha256:{hex}"), "{path}");
            }
        }
        let index = json(&files["index.json"]);
        let named = &index["manifests"][0];
        assert_eq!(
            named["annotations"]["io.containerd.image.name"],
            "registry.k8s.io/pause:3.10.1"
        );
        let blob =
            |digest: &serde_json::Value| &files[&format!("blobs/sha256/{}", &digest.as_str().unwrap()[7..])];
        let manifest = json(blob(&named["digest"]));
        let config = json(blob(&manifest["config"]["digest"]));
        assert_eq!(config["config"]["Entrypoint"][0], "/pause");
        assert_eq!(
            config["config"]["ExposedPorts"],
            serde_json::json!({"8080/tcp": {}})
        );
        // The config's diff_id is the digest of the (uncompressed) layer, which holds the file.
        let layer = blob(&manifest["layers"][0]["digest"]);
        assert_eq!(config["rootfs"]["diff_ids"][0], digest(layer));
        assert_eq!(entries(layer)["pause"], b"\x7fELF");
        // Deterministic: the same image, the same bytes.
        assert_eq!(layout_tar(&image).unwrap(), tar);
    }
}
