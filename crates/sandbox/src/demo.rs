//! `make demo`: one GPU node recycled live on a local control plane, by the real controller
//! binary running under the real manifests' service account and RBAC.
//!
//! - [`install`]: applies `manifests/` and speaks as one of its service accounts.

pub mod install;
