//! The acting layer: where a concern's pure decision meets the cluster. Each module reads what its
//! decision needs (through [`crate::read::Reader`] and the caches), calls the decision, and hands
//! every write to [`crate::write::Writer`]; none decides anything the pure modules could.
//!
//! | module | acts on the decision of |
//! |---|---|
//! | [`admit`] | [`crate::fleet::plan`]: records created and readmitted, policy status |
//! | [`quarantine`], [`quarantine_device`] | [`crate::quarantine::plan`]: node taints, `DeviceTaintRule`s |
//! | [`out_of_service`] | [`crate::out_of_service`]: the out-of-service taint of dead nodes shut down |
//! | [`node_labels`] | [`crate::observe::labels`]: whether a pass may decide, the relist asked for, its Events |
//! | [`hardware`] | the hardware ledger ([`crate::hardware`]): records, join steps |
//! | [`join_validation`] | [`crate::hardware::join_validation`]: new nodes' validation Jobs, their startup taint |
//! | [`replace`] | [`crate::replace`]'s builders: the Machine, NodeClaim or template written, then looked at |
//! | [`undecodable`] | [`crate::observe::undecodable`]: Events and policy conditions on what does not decode |
//! | [`remediation`] | [`crate::lifecycle::decide`]: one remediation's cordon, drain, ladder, replacement |

pub mod admit;
pub mod hardware;
pub mod join_validation;
pub mod node_labels;
pub mod out_of_service;
pub mod quarantine;
pub mod quarantine_device;
pub mod remediation;
pub mod replace;
pub mod undecodable;
