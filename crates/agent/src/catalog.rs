//! The XID catalog: XID code → severity and NVIDIA's recommended action, loaded from YAML
//! (`config/xid-catalog.yaml`, compiled in as the default) and overridable per cluster by a second
//! file whose entries replace the defaults one XID at a time.

use std::{collections::BTreeMap, path::Path};

use serde::Deserialize;

pub mod nvlink;

/// The catalog shipped with the agent.
pub const DEFAULT_CATALOG_YAML: &str = include_str!("../../../config/xid-catalog.yaml");

/// What an XID means for the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The GPU is unusable until reset, reboot or replacement: `GpuHealthy=False`, latched.
    Fatal,
    /// Worth telling a person about when it repeats: a Warning Event.
    Warning,
    /// Logged only.
    Ignore,
}

/// One catalog entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct XidEntry {
    /// What the XID means, for messages.
    #[serde(default)]
    pub description: String,
    /// How the agent treats it.
    pub severity: Severity,
    /// NVIDIA's recommended immediate action.
    pub action: String,
}

/// The catalog file's shape.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogFile {
    #[serde(default)]
    unknown: Option<XidEntry>,
    #[serde(default)]
    xids: Vec<CatalogFileEntry>,
    /// NVLink and fabric thresholds ([`nvlink`]).
    #[serde(default)]
    nvlink: Option<nvlink::LinkPolicyFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogFileEntry {
    xid: u64,
    #[serde(default)]
    description: String,
    severity: Severity,
    action: String,
}

/// Why a catalog could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadCatalogError {
    /// The file could not be read.
    #[error("reading XID catalog {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The IO error.
        source: std::io::Error,
    },
    /// The YAML did not have the catalog's shape.
    #[error("parsing XID catalog {origin}: {source}")]
    Parse {
        /// Where the YAML came from.
        origin: String,
        /// The parse error.
        source: serde_yaml::Error,
    },
    /// The same XID appears twice in one file: which one was meant is ambiguous.
    #[error("XID catalog {origin} lists XID {xid} more than once")]
    Duplicate {
        /// Where the YAML came from.
        origin: String,
        /// The repeated XID.
        xid: u64,
    },
    /// The `nvlink:` section holds a value the agent cannot use.
    #[error("XID catalog {origin}: {message}")]
    Nvlink {
        /// Where the YAML came from.
        origin: String,
        /// What is wrong.
        message: String,
    },
}

/// XID code → entry, plus the entry for codes the catalog does not list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidCatalog {
    entries: BTreeMap<u64, XidEntry>,
    unknown: XidEntry,
    /// NVLink and fabric thresholds and actions.
    pub(crate) nvlink: nvlink::LinkPolicy,
}

impl XidCatalog {
    /// The catalog shipped with the agent.
    pub fn shipped() -> Result<Self, LoadCatalogError> {
        Self::from_yaml(DEFAULT_CATALOG_YAML, "config/xid-catalog.yaml (built in)")
    }

    /// Parses a whole catalog. Codes not listed, and no `unknown` entry, fall back to a warning.
    pub fn from_yaml(yaml: &str, origin: &str) -> Result<Self, LoadCatalogError> {
        let mut catalog = Self {
            entries: BTreeMap::new(),
            unknown: XidEntry {
                description: String::new(),
                severity: Severity::Warning,
                action: "CONTACT_SUPPORT".to_owned(),
            },
            nvlink: nvlink::LinkPolicy::default(),
        };
        catalog.merge_yaml(yaml, origin)?;
        Ok(catalog)
    }

    /// Applies an override: each XID it lists replaces this catalog's entry, and its `unknown`
    /// (if any) replaces this catalog's.
    pub fn merge_yaml(&mut self, yaml: &str, origin: &str) -> Result<(), LoadCatalogError> {
        let file: CatalogFile = serde_yaml::from_str(yaml).map_err(|source| LoadCatalogError::Parse {
            origin: origin.to_owned(),
            source,
        })?;
        let mut seen = std::collections::BTreeSet::new();
        for entry in file.xids {
            if !seen.insert(entry.xid) {
                return Err(LoadCatalogError::Duplicate {
                    origin: origin.to_owned(),
                    xid: entry.xid,
                });
            }
            self.entries.insert(
                entry.xid,
                XidEntry {
                    description: entry.description,
                    severity: entry.severity,
                    action: entry.action,
                },
            );
        }
        if let Some(unknown) = file.unknown {
            self.unknown = unknown;
        }
        if let Some(nvlink) = file.nvlink {
            self.nvlink
                .merge(nvlink)
                .map_err(|message| LoadCatalogError::Nvlink {
                    origin: origin.to_owned(),
                    message,
                })?;
        }
        Ok(())
    }

    /// Reads an override file and merges it.
    pub fn merge_file(&mut self, path: &Path) -> Result<(), LoadCatalogError> {
        let yaml = std::fs::read_to_string(path).map_err(|source| LoadCatalogError::Read {
            path: path.display().to_string(),
            source,
        })?;
        self.merge_yaml(&yaml, &path.display().to_string())
    }

    /// The entry for an XID; codes the catalog does not list get the `unknown` entry.
    #[must_use]
    pub fn classify(&self, xid: u64) -> &XidEntry {
        self.entries.get(&xid).unwrap_or(&self.unknown)
    }

    /// Whether the catalog lists this XID explicitly.
    #[must_use]
    pub fn lists(&self, xid: u64) -> bool {
        self.entries.contains_key(&xid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The XIDs the issue requires NVIDIA's recommended action for.
    const REQUIRED: [u64; 26] = [
        13, 31, 43, 45, 46, 48, 54, 62, 63, 64, 74, 79, 92, 94, 95, 109, 110, 119, 120, 136, 140, 143, 154,
        155, 156, 158,
    ];

    #[test]
    fn the_shipped_catalog_lists_every_required_xid_with_an_action() {
        let catalog = XidCatalog::shipped().unwrap();
        for xid in REQUIRED {
            assert!(catalog.lists(xid), "XID {xid} missing");
            assert!(
                !catalog.classify(xid).action.is_empty(),
                "XID {xid} has no action"
            );
            assert!(
                !catalog.classify(xid).description.is_empty(),
                "XID {xid} has no description"
            );
        }
    }

    #[test]
    fn a_gpu_fallen_off_the_bus_is_fatal_and_asks_for_a_reboot() {
        let catalog = XidCatalog::shipped().unwrap();
        assert_eq!(catalog.classify(79).severity, Severity::Fatal);
        assert_eq!(catalog.classify(79).action, "RESTART_BM");
        assert_eq!(catalog.classify(48).severity, Severity::Fatal);
    }

    #[test]
    fn application_faults_are_warnings_not_node_failures() {
        let catalog = XidCatalog::shipped().unwrap();
        for xid in [13, 31, 43, 94] {
            assert_eq!(catalog.classify(xid).severity, Severity::Warning, "XID {xid}");
            assert_eq!(catalog.classify(xid).action, "RESTART_APP", "XID {xid}");
        }
    }

    #[test]
    fn an_unlisted_xid_falls_back_to_the_unknown_entry() {
        let catalog = XidCatalog::shipped().unwrap();
        assert!(!catalog.lists(9999));
        assert_eq!(catalog.classify(9999).severity, Severity::Warning);
    }

    #[test]
    fn a_cluster_override_replaces_one_xid_and_keeps_the_rest() {
        let mut catalog = XidCatalog::shipped().unwrap();
        catalog
            .merge_yaml(
                "xids:\n  - xid: 13\n    severity: fatal\n    action: RESET_GPU\n  - xid: 5000\n    severity: ignore\n    action: IGNORE\n",
                "override",
            )
            .unwrap();
        assert_eq!(catalog.classify(13).severity, Severity::Fatal);
        assert_eq!(catalog.classify(13).action, "RESET_GPU");
        assert_eq!(catalog.classify(5000).severity, Severity::Ignore);
        assert_eq!(
            catalog.classify(79).severity,
            Severity::Fatal,
            "untouched entries stay"
        );
    }

    #[test]
    fn an_override_can_change_how_unknown_xids_are_treated() {
        let mut catalog = XidCatalog::shipped().unwrap();
        catalog
            .merge_yaml("unknown:\n  severity: ignore\n  action: IGNORE\n", "override")
            .unwrap();
        assert_eq!(catalog.classify(9999).severity, Severity::Ignore);
    }

    #[test]
    fn a_catalog_listing_an_xid_twice_is_refused() {
        let yaml = "xids:\n  - {xid: 79, severity: fatal, action: RESTART_BM}\n  - {xid: 79, severity: ignore, action: IGNORE}\n";
        let err = XidCatalog::from_yaml(yaml, "twice").unwrap_err();
        assert!(
            matches!(err, LoadCatalogError::Duplicate { xid: 79, .. }),
            "{err}"
        );
    }

    #[test]
    fn a_misspelt_severity_is_refused_rather_than_guessed() {
        let yaml = "xids:\n  - {xid: 79, severity: critical, action: RESTART_BM}\n";
        assert!(matches!(
            XidCatalog::from_yaml(yaml, "bad"),
            Err(LoadCatalogError::Parse { .. })
        ));
    }
}
