//! `make bench` and the fault suite's instruments: the controller and its peer (`kubectl drain`
//! from the pinned release) measured on the same sandbox in one run.
//!
//! - [`bench_env`]: one audited control plane with the CRDs and an identity per peer.
//! - [`actor`]: the controller as a child process (RSS and CPU from `/proc`), and identities.
//! - [`audit`]: requests per peer by verb and resource, from the API server's audit log.
//! - [`budget_sampler`]: the PDB violation sampler both peers and every fault are judged by.
//! - [`drain_links`]: a drain's time split, link by link, into its budgets' part and the drainer's.
//! - [`fence`]: the shipped fence policy on the bench's controller (`--with-fence`), and its probe.
//! - [`approval`]: the shipped approval policy on every remediation's create and update
//!   (`--with-approval`), and its probe.
//! - [`cordon_watch`]: when each node was first held by the controller, and how many at once.
//! - [`cordon_floor`]: the fault path's writes sent by the bench itself, the floor beside the
//!   scale fleets' detection to cordon.
//! - [`node_churn`]: node status written at a steady pace, as a fleet's kubelets and agents do.
//! - [`proxy`]: a loopback TCP proxy that adds latency and cuts connections.
//! - [`latency`], [`drain`], [`footprint`], [`scale`] (bare-node fleets of 10,000 and more;
//!   [`scale_churn`], the same under the fleet's own traffic),
//!   [`quarantine`] (the leak with quarantine on and off), [`karpenter_peer`] (Karpenter's own
//!   node repair against the policy, `--only karpenter-peer`), [`gang`] (the GPU-seconds a recycle
//!   costs a training gang, per `drain.gangs` and notice): the scenarios; [`report`]: percentiles
//!   and the table.

pub mod actor;
pub mod approval;
pub mod audit;
pub mod bench_env;
pub mod budget_sampler;
pub mod cordon_floor;
pub mod cordon_watch;
pub mod drain;
pub mod drain_links;
pub mod fence;
pub mod footprint;
pub mod gang;
pub mod karpenter_peer;
pub mod latency;
pub mod node_churn;
pub mod percentile;
pub mod proxy;
pub mod quarantine;
pub mod report;
pub mod scale;
pub mod scale_churn;
pub mod setup;
