//! The election loop: reads and writes the `coordination.k8s.io/v1` Lease, asks
//! [`decide`](super::decision::decide) what to do next, and keeps the [`FenceKeeper`] in step.
//!
//! Every write is a `replace` (PUT) carrying the resourceVersion it was based on, so two replicas
//! racing for the Lease cannot both win: the second gets 409 Conflict and reads again. The client
//! must not retry by itself (see [`lease_client`]): a renewal silently retried for minutes would
//! outlive the renew deadline while the loop believes a request is merely in flight. Each request
//! also carries a local timeout that ends by the renew deadline.
//!
//! A new leader does not act at once. Its predecessor's lease is already waited out: [`decide`]
//! takes a Lease over from another holder only once it went unrenewed for its whole duration. It
//! renews its Lease meanwhile, but the fence stays closed until two things are done: the wait for
//! the API server's caches ([`ElectionTimings::cache_lag_allowance`], counted from the acquiring
//! write), then a probe of the API server's fence ([`super::fence_probe`]): two
//! dry-run writes, one with a stale claim that the fence policy must refuse and one with ours that
//! it must admit. A leader that cannot prove the fence releases the Lease, says why on `/readyz`
//! and campaigns again later ([`FenceRequirement::Required`], the default); with
//! [`FenceRequirement::Optional`] (a development cluster without the policy) it leads anyway.
//!
//! Entry point for `main`:
//!
//! ```no_run
//! # async fn run(config: kube::Config) -> anyhow::Result<()> {
//! use gpu_remediator::{
//!     election::{ElectionConfig, Elector, lease_client},
//!     leader::Fence,
//! };
//! let (fence, keeper) = Fence::keeper(Some("gpu-remediator"));
//! let elector = Elector::new(lease_client(config)?, ElectionConfig::new("gpu-remediator", "pod-abc"), keeper);
//! let election = tokio::spawn(elector.run(async { let _ = tokio::signal::ctrl_c().await; }));
//! // ... start watches now (followers keep caches warm); reconcilers call `fence.check()` before
//! // every mutating call, and may wait on `fence.acquired()` ...
//! election.await??; // Err = leadership lost: exit non-zero.
//! # Ok(()) }
//! ```

use std::{future::Future, sync::Arc, time::Duration};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{Client, api::PostParams};
use tokio::time::{Instant, sleep_until, timeout};
use tracing::{debug, info, warn};

use super::{
    decision::{
        Decision, ElectionTimings, LeaseRecord, Observed, Role, StepDownReason, ValidateTimingsError, decide,
    },
    fence_probe::{self, Verdict},
};
use crate::{leader::FenceKeeper, write::fence_probe::FenceProbes};

/// A client for the Lease (and for evictions) with kube's default retry of 429/503/504 turned
/// off, so each call returns within its own timeout and the caller decides what a refusal means.
pub fn lease_client(mut config: kube::Config) -> Result<Client, kube::Error> {
    config.default_retry = false;
    Client::try_from(config)
}

/// Where the Lease lives, who this replica is, and the timings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectionConfig {
    /// Namespace of the Lease (the controller's own namespace).
    pub namespace: String,
    /// Name of the Lease.
    pub lease_name: String,
    /// This replica's identity, unique among live replicas (the pod name). A replica that finds
    /// its own identity on the Lease takes it at once: that claim was left by an earlier process
    /// of the same pod, which is dead (a container restarts only after its process exited).
    pub identity: String,
    /// Lease duration, renew deadline and retry period.
    pub timings: ElectionTimings,
    /// Whether this replica leads only once the API server's fence is proven enforced.
    pub fence: FenceRequirement,
}

/// Whether a new leader must prove that the API server enforces the fence before it acts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FenceRequirement {
    /// It must: a leader that cannot prove it releases the Lease and is not ready.
    #[default]
    Required,
    /// It probes and reports (log, `/metrics`), but leads anyway: for a development cluster
    /// without the fence policy (`--allow-unfenced`).
    Optional,
}

impl ElectionConfig {
    /// The Lease `gpu-remediator` in `namespace`, default timings.
    #[must_use]
    pub fn new(namespace: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            lease_name: "gpu-remediator".to_owned(),
            identity: identity.to_owned(),
            timings: ElectionTimings::default(),
            fence: FenceRequirement::default(),
        }
    }
}

/// Why the election loop stopped with this replica unable to continue.
#[derive(Debug, thiserror::Error)]
pub enum RunElectionError {
    /// The timings would let two replicas act at once.
    #[error("unsafe leader election timings: {0}")]
    InvalidTimings(#[from] ValidateTimingsError),
    /// This replica led and can no longer prove it still does: it stopped acting; exit non-zero.
    #[error("lost the leader Lease: {0}")]
    LostLease(StepDownReason),
}

impl std::fmt::Display for StepDownReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::RenewDeadlinePassed => "no renewal succeeded before the renew deadline",
            Self::LeaseTakenOver => "another replica holds the Lease",
        })
    }
}

/// How the loop ended after a shutdown request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElectionEnd {
    /// This replica held the Lease and released it, so a follower can take over at once.
    Released,
    /// This replica held the Lease but releasing it failed; followers take over after the lease
    /// duration.
    ReleaseFailed,
    /// This replica was a follower.
    Followed,
}

/// Runs leader election for one replica. See the module docs for how `main` uses it.
#[derive(Debug)]
pub struct Elector {
    leases: crate::write::lease::Leases,
    probes: FenceProbes,
    config: ElectionConfig,
    keeper: FenceKeeper,
}

/// The Lease as last read or written, what the decision sees of it, and whether this replica,
/// when it holds the Lease, acts yet.
struct Known {
    lease: Option<Lease>,
    observed: Observed,
    acting: Acting,
}

/// Whether a leader acts (its fence is open).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Acting {
    /// Not leading.
    No,
    /// Leading under `claim`, not acting yet: the next fence probe is due at `probe_at`;
    /// `unproven` probes in a row have not proven the fence so far.
    SettlingIn {
        claim: Arc<str>,
        probe_at: Instant,
        unproven: u32,
    },
    /// Leading and acting: every renewal extends the fence.
    Yes,
}

/// What a leader does after a fence probe.
enum AfterProbe {
    /// Keep leading (acting or still settling in).
    Lead,
    /// Give the Lease up and campaign again after `pause`.
    Refuse { pause: Duration },
}

impl Elector {
    /// An elector writing through `client` (build it with [`lease_client`]); `keeper` comes from
    /// [`Fence::keeper`](crate::leader::Fence::keeper) given the Lease's namespace, `config.namespace`.
    #[must_use]
    pub fn new(client: Client, config: ElectionConfig, keeper: FenceKeeper) -> Self {
        Self {
            leases: crate::write::lease::Leases::new(client.clone(), &config.namespace),
            probes: FenceProbes::new(client, &config.namespace),
            config,
            keeper,
        }
    }

    /// Campaigns, leads and renews until `shutdown` resolves (then releases the Lease if held and
    /// returns `Ok`) or until leadership is lost (then the fence is already revoked and it
    /// returns `Err`: the process must exit non-zero, because state built while leading cannot be
    /// trusted by a replica that no longer leads).
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<ElectionEnd, RunElectionError> {
        self.config.timings.validate()?;
        let mut shutdown = std::pin::pin!(shutdown);
        let mut known = Known {
            lease: None,
            observed: Observed::Absent,
            acting: Acting::No,
        };
        let mut role = Role::Follower;
        let mut read_first = true;
        loop {
            if read_first {
                self.read(&mut known, role).await;
            }
            if let (
                Role::Leader { renewed_at },
                Acting::SettlingIn {
                    claim,
                    probe_at,
                    unproven,
                },
            ) = (role, &known.acting)
                && Instant::now() >= *probe_at
            {
                let probed = self.probe(claim.clone(), *unproven, renewed_at, &mut known.acting);
                let after = tokio::select! {
                    after = probed => after,
                    () = &mut shutdown => return Ok(self.shut_down(role).await),
                };
                if let AfterProbe::Refuse { pause } = after {
                    self.release().await;
                    role = Role::Follower;
                    known.acting = Acting::No;
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        () = &mut shutdown => return Ok(self.shut_down(role).await),
                    }
                    read_first = true;
                    continue;
                }
            }
            let decision = decide(
                &known.observed,
                &self.config.identity,
                role,
                Instant::now(),
                &self.config.timings,
            );
            debug!(?decision, ?role, "leader election step");
            read_first = match decision {
                Decision::Wait { until } => {
                    let until = match known.acting {
                        Acting::SettlingIn { probe_at, .. } => until.min(probe_at),
                        Acting::No | Acting::Yes => until,
                    };
                    tokio::select! {
                        () = sleep_until(until) => {}
                        () = &mut shutdown => return Ok(self.shut_down(role).await),
                    }
                    // A leader renews from what it wrote last; a follower must look again.
                    role == Role::Follower
                }
                Decision::StepDown { reason } => {
                    self.keeper.revoke();
                    warn!(identity = %self.config.identity, %reason, "stepping down: lost the leader Lease");
                    return Err(RunElectionError::LostLease(reason));
                }
                Decision::Create | Decision::Acquire | Decision::Renew => {
                    let write = self.write(decision, &mut known, &mut role);
                    tokio::select! {
                        read_again = write => read_again,
                        () = &mut shutdown => return Ok(self.shut_down(role).await),
                    }
                }
            };
        }
    }

    /// Reads the Lease into `known`; on failure keeps the previous observation (a follower then
    /// simply waits longer; a leader's deadline keeps running).
    async fn read(&self, known: &mut Known, role: Role) {
        let limit = self.request_timeout(role);
        match timeout(limit, self.leases.get_opt(&self.config.lease_name)).await {
            Ok(Ok(lease)) => {
                if lease.is_some() {
                    self.keeper.read_succeeded();
                }
                let record = lease.as_ref().map(record_of);
                known.observed =
                    std::mem::replace(&mut known.observed, Observed::Absent).update(record, Instant::now());
                known.lease = lease;
            }
            Ok(Err(error)) => {
                if let Some(why) = self.cannot_take_part(&error) {
                    self.keeper.cannot_take_part(why, false);
                }
                warn!(%error, "reading the leader Lease failed");
            }
            Err(_) => warn!(?limit, "reading the leader Lease timed out"),
        }
    }

    /// Creates, acquires or renews. Returns whether the Lease must be read before the next
    /// decision (after a conflict or an error).
    async fn write(&self, decision: Decision, known: &mut Known, role: &mut Role) -> bool {
        let sent_at = Instant::now();
        let now = MicroTime(Timestamp::now());
        let timings = &self.config.timings;
        let duration_seconds = i32::try_from(timings.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let params = PostParams::default();
        let limit = self.request_timeout(*role);
        let result = match decision {
            Decision::Create => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.config.lease_name.clone()),
                        namespace: Some(self.config.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.config.identity.clone()),
                        lease_duration_seconds: Some(duration_seconds),
                        acquire_time: Some(now.clone()),
                        renew_time: Some(now),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                timeout(limit, self.leases.create_lease(&params, &lease)).await
            }
            Decision::Acquire | Decision::Renew => {
                let Some(mut lease) = known.lease.clone() else {
                    // Observed present but never read in full: read before writing.
                    return true;
                };
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                let previous_holder = spec.holder_identity.clone().filter(|holder| !holder.is_empty());
                if decision == Decision::Acquire {
                    if previous_holder.as_deref() != Some(self.config.identity.as_str()) {
                        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                    }
                    spec.holder_identity = Some(self.config.identity.clone());
                    spec.acquire_time = Some(now.clone());
                }
                spec.lease_duration_seconds = Some(duration_seconds);
                spec.renew_time = Some(now);
                // `lease` still carries the resourceVersion it was read or written with: the
                // replace is refused with 409 if anyone wrote in between.
                timeout(
                    limit,
                    self.leases
                        .replace_lease(&self.config.lease_name, &params, &lease),
                )
                .await
            }
            Decision::Wait { .. } | Decision::StepDown { .. } => unreachable!("only writes reach write()"),
        };
        match result {
            Ok(Ok(written)) => {
                self.keeper.write_succeeded();
                let transitions = written
                    .spec
                    .as_ref()
                    .and_then(|s| s.lease_transitions)
                    .unwrap_or(0);
                let claim = self.keeper.claimed_as(&self.config.identity, transitions);
                if *role == Role::Follower {
                    // `decide` took the Lease from another holder only once its lease ran out:
                    // what is left to wait for is the caches.
                    let probe_at = sent_at + timings.cache_lag_allowance;
                    info!(
                        identity = %self.config.identity,
                        lease = %self.config.lease_name,
                        first_write_in = ?probe_at.saturating_duration_since(Instant::now()),
                        "acquired the leader Lease; acting once earlier claims and caches have settled and the fence is proven"
                    );
                    known.acting = Acting::SettlingIn {
                        claim,
                        probe_at,
                        unproven: 0,
                    };
                }
                *role = Role::Leader { renewed_at: sent_at };
                if known.acting == Acting::Yes {
                    self.keeper.hold_until(sent_at + timings.renew_deadline);
                }
                known.observed = Observed::Present {
                    record: record_of(&written),
                    since: Instant::now(),
                };
                known.lease = Some(written);
                false
            }
            Ok(Err(kube::Error::Api(status))) if status.is_conflict() || status.is_already_exists() => {
                debug!(?decision, "the leader Lease changed under us; reading it again");
                true
            }
            Ok(Err(error)) => {
                if let Some(why) = self.cannot_take_part(&error) {
                    self.keeper.cannot_take_part(why, true);
                }
                warn!(?decision, %error, "writing the leader Lease failed");
                self.pause_after_failure(*role).await;
                true
            }
            Err(_) => {
                warn!(?decision, ?limit, "writing the leader Lease timed out");
                true
            }
        }
    }

    /// Why `error` means this replica cannot take part in the election at all (as opposed to a
    /// passing failure): the Lease's namespace does not exist (404 on create), or it may not read or
    /// write the Lease (403).
    fn cannot_take_part(&self, error: &kube::Error) -> Option<String> {
        let kube::Error::Api(status) = error else {
            return None;
        };
        let lease = format!("{}/{}", self.config.namespace, self.config.lease_name);
        match status.code {
            403 => Some(format!(
                "no permission on the leader Lease {lease}: {}",
                status.message
            )),
            404 => Some(format!(
                "the leader Lease {lease} cannot be created: {} (is --lease-namespace right?)",
                status.message
            )),
            _ => None,
        }
    }

    /// A short pause after a failed write, so a broken API server is not hammered; a leader keeps
    /// it well inside its renew deadline.
    async fn pause_after_failure(&self, role: Role) {
        let pause = match role {
            Role::Follower => self.config.timings.retry_period,
            Role::Leader { .. } => self.config.timings.retry_period / 4,
        };
        tokio::time::sleep(pause).await;
    }

    /// How long one request may take: a leader's must end by its renew deadline (then the loop
    /// steps down); a follower's by the next retry.
    fn request_timeout(&self, role: Role) -> Duration {
        let timings = &self.config.timings;
        match role {
            Role::Follower => timings.retry_period.max(Duration::from_secs(1)),
            Role::Leader { renewed_at } => (renewed_at + timings.renew_deadline)
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
        }
    }

    /// Probes the API server's fence for a leader that is settling in under `own` after `unproven`
    /// probes that did not prove it (see the module docs), and opens this replica's fence when it
    /// is proven (or, with [`FenceRequirement::Optional`], when it is not); decides what to do
    /// when it is not.
    async fn probe(
        &self,
        own: Arc<str>,
        unproven: u32,
        renewed_at: Instant,
        acting: &mut Acting,
    ) -> AfterProbe {
        let timings = &self.config.timings;
        let stale = format!("{own}-stale");
        let limit = self.request_timeout(Role::Leader { renewed_at });
        let answers = timeout(limit, async {
            tokio::join!(
                self.probes.dry_run_create(&stale),
                self.probes.dry_run_create(&own),
            )
        })
        .await;
        let verdict = match &answers {
            Ok((stale, own)) => fence_probe::verdict(stale, own),
            Err(_) => Verdict::Unproven(format!("the probe writes timed out after {limit:?}")),
        };
        match (verdict, self.config.fence) {
            (Verdict::Enforced, _) => {
                info!(claim = %own, "the API server's fence refused a stale claim and admitted ours: acting");
                self.keeper.fence_proven();
            }
            (Verdict::Unproven(why), FenceRequirement::Optional) => {
                warn!(%why, "the API server's fence is not proven enforced; leading anyway (--allow-unfenced)");
                self.keeper.fence_not_proven(why, false);
            }
            (Verdict::Unproven(why), FenceRequirement::Required) if unproven + 1 < fence_probe::PATIENCE => {
                debug!(%why, unproven = unproven + 1, "the fence is not proven yet; probing again");
                *acting = Acting::SettlingIn {
                    claim: own,
                    probe_at: Instant::now() + timings.retry_period / 4,
                    unproven: unproven + 1,
                };
                return AfterProbe::Lead;
            }
            (Verdict::Unproven(why), FenceRequirement::Required) => {
                tracing::error!(
                    %why,
                    "refusing to lead: the API server's fence is not proven enforced; releasing the Lease \
                     (install manifests/controller/fence-policy.yaml, or run with --allow-unfenced on a \
                     development cluster)"
                );
                self.keeper.fence_not_proven(why, true);
                return AfterProbe::Refuse {
                    pause: timings.lease_duration,
                };
            }
        }
        // Open the fence.
        *acting = Acting::Yes;
        self.keeper.hold_until(renewed_at + timings.renew_deadline);
        AfterProbe::Lead
    }

    /// Stops acting, then (if leading) releases the Lease so a follower need not wait out the
    /// lease duration.
    async fn shut_down(&self, role: Role) -> ElectionEnd {
        self.keeper.revoke();
        let Role::Leader { .. } = role else {
            info!("shutting down as a follower");
            return ElectionEnd::Followed;
        };
        self.release().await
    }

    /// Releases the Lease this replica holds (its fence already closed), so a follower need not
    /// wait out the lease duration.
    async fn release(&self) -> ElectionEnd {
        // Read the Lease afresh: shutdown may have cancelled a renewal the server had already
        // applied, and releasing with the resourceVersion from before it would get a 409.
        let deadline = self.config.timings.renew_deadline;
        let mut lease = match timeout(deadline, self.leases.get_opt(&self.config.lease_name)).await {
            Ok(Ok(Some(lease))) => lease,
            Ok(Ok(None)) => return ElectionEnd::ReleaseFailed,
            Ok(Err(error)) => {
                warn!(%error, "reading the leader Lease to release it failed; followers take over after the lease duration");
                return ElectionEnd::ReleaseFailed;
            }
            Err(_) => {
                warn!(
                    "reading the leader Lease to release it timed out; followers take over after the lease duration"
                );
                return ElectionEnd::ReleaseFailed;
            }
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return ElectionEnd::ReleaseFailed;
        }
        // As client-go does: no holder, a one-second duration, so followers take over at once.
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        let params = PostParams::default();
        let release = self
            .leases
            .replace_lease(&self.config.lease_name, &params, &lease);
        // The renew deadline, not the retry period: a loaded API server may take longer than one retry
        // to answer, and a release that lands spares followers the whole lease duration.
        match timeout(deadline, release).await {
            Ok(Ok(_)) => {
                info!(identity = %self.config.identity, "released the leader Lease");
                ElectionEnd::Released
            }
            Ok(Err(error)) => {
                warn!(%error, "releasing the leader Lease failed; followers take over after the lease duration");
                ElectionEnd::ReleaseFailed
            }
            Err(_) => {
                warn!("releasing the leader Lease timed out; followers take over after the lease duration");
                ElectionEnd::ReleaseFailed
            }
        }
    }
}

/// What the decision reads of a Lease.
fn record_of(lease: &Lease) -> LeaseRecord {
    let spec = lease.spec.as_ref();
    LeaseRecord {
        holder: spec.and_then(|spec| spec.holder_identity.clone()),
        lease_duration: spec
            .and_then(|spec| spec.lease_duration_seconds)
            .and_then(|seconds| u64::try_from(seconds).ok())
            .map(Duration::from_secs),
        resource_version: lease.metadata.resource_version.clone().unwrap_or_default(),
    }
}
