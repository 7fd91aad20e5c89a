//! Leader election against the real API server: replicas are in-process electors with their own
//! fences, each on its own client, racing for one `coordination.k8s.io/v1` Lease. A watcher polls
//! every fence every 2ms and fails the test if two are ever current at once.
//!
//! Process-level failover (kill -9 of a controller mid-drain) is in `leader_failover.rs`.

mod common;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use gpu_remediator::{
    election::{
        ElectionConfig, ElectionEnd, ElectionTimings, Elector, FenceRequirement, RunElectionError,
        decision::StepDownReason, lease_client,
    },
    leader::Fence,
};
use k8s_openapi::api::{
    authentication::v1::TokenRequest,
    coordination::v1::Lease,
    core::v1::ServiceAccount,
    rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject},
};
use kube::{
    Api, Client,
    api::{DeleteParams, ObjectMeta, PostParams},
};
use tokio::{sync::oneshot, task::JoinHandle, time::Instant};

/// Short timings so a takeover takes seconds: 4s lease, 3s renew deadline, 500ms retry, 200ms
/// for the caches after an acquisition.
fn timings() -> ElectionTimings {
    ElectionTimings {
        lease_duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_millis(500),
        cache_lag_allowance: Duration::from_millis(200),
    }
}

/// One in-process replica.
struct Replica {
    fence: Fence,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<ElectionEnd, RunElectionError>>,
}

impl Replica {
    fn start(client: Client, namespace: &str, identity: &str) -> Self {
        let (fence, keeper) = Fence::keeper(Some(namespace));
        let config = ElectionConfig {
            timings: timings(),
            // No fence policy here: these tests are about the election; `fence_hardening` proves
            // that a leader refuses to act without the fence.
            fence: FenceRequirement::Optional,
            ..ElectionConfig::new(namespace, identity)
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(Elector::new(client, config, keeper).run(async {
            let _ = stopped.await;
        }));
        Self {
            fence,
            stop: Some(stop),
            task,
        }
    }

    /// Asks the replica to shut down (as on SIGTERM) and returns how its election ended.
    async fn shut_down(mut self) -> Result<ElectionEnd, RunElectionError> {
        let _ = self.stop.take().expect("not stopped yet").send(());
        self.task.await.expect("election task")
    }

    /// Kills the replica without letting it release anything, as kill -9 does.
    fn kill(self) {
        self.task.abort();
    }
}

async fn admin_lease_client() -> Client {
    lease_client(common::cluster().await.config()).expect("lease client")
}

/// Fails the test (through the returned flag) if two of `fences` are ever current together.
fn watch_for_overlap(fences: Vec<Fence>) -> (Arc<AtomicBool>, JoinHandle<()>) {
    let overlapped = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&overlapped);
    let task = tokio::spawn(async move {
        loop {
            if fences.iter().filter(|fence| fence.is_current()).count() > 1 {
                flag.store(true, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    (overlapped, task)
}

async fn until_current(fence: &Fence, within: Duration) -> Instant {
    tokio::time::timeout(within, fence.acquired())
        .await
        .expect("the claim to become current");
    Instant::now()
}

async fn holder(client: &Client, namespace: &str) -> Option<String> {
    let lease = Api::<Lease>::namespaced(client.clone(), namespace)
        .get("gpu-remediator")
        .await
        .expect("lease");
    lease
        .spec
        .and_then(|spec| spec.holder_identity)
        .filter(|holder| !holder.is_empty())
}

#[tokio::test]
async fn of_two_replicas_exactly_one_leads_and_the_lease_names_it() {
    let namespace = common::namespace().await;
    let a = Replica::start(admin_lease_client().await, &namespace, "replica-a");
    let b = Replica::start(admin_lease_client().await, &namespace, "replica-b");
    let (overlapped, watcher) = watch_for_overlap(vec![a.fence.clone(), b.fence.clone()]);

    let first = tokio::select! {
        () = a.fence.acquired() => "replica-a",
        () = b.fence.acquired() => "replica-b",
    };
    // Several renewals later, still exactly one.
    tokio::time::sleep(Duration::from_secs(3)).await;

    assert_eq!(a.fence.is_current(), first == "replica-a");
    assert_eq!(b.fence.is_current(), first == "replica-b");
    assert_eq!(
        holder(&common::cluster().await.client(), &namespace)
            .await
            .as_deref(),
        Some(first)
    );
    watcher.abort();
    assert!(
        !overlapped.load(Ordering::SeqCst),
        "two replicas were current at once"
    );
    a.kill();
    b.kill();
}

#[tokio::test]
async fn a_killed_leader_is_replaced_after_the_lease_duration_and_never_overlaps() {
    let namespace = common::namespace().await;
    let a = Replica::start(admin_lease_client().await, &namespace, "replica-a");
    until_current(&a.fence, Duration::from_secs(10)).await;
    let b = Replica::start(admin_lease_client().await, &namespace, "replica-b");
    let (overlapped, watcher) = watch_for_overlap(vec![a.fence.clone(), b.fence.clone()]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!b.fence.is_current(), "a follower waits while the leader renews");

    let a_fence = a.fence.clone();
    let killed_at = Instant::now();
    a.kill();
    let took_over_at = until_current(&b.fence, Duration::from_secs(15)).await;

    let takeover = took_over_at - killed_at;
    // The follower waits out the lease duration from the last renewal it saw, which came at most
    // one retry period before the kill.
    let lease = timings().lease_duration;
    assert!(
        takeover + timings().retry_period >= lease,
        "took over after {takeover:?}, before the lease ran out"
    );
    assert!(
        takeover <= lease + Duration::from_secs(2),
        "took over only after {takeover:?}"
    );
    assert!(
        !a_fence.is_current(),
        "the killed leader's claim expired by itself"
    );
    watcher.abort();
    assert!(
        !overlapped.load(Ordering::SeqCst),
        "two replicas were current at once"
    );
    assert_eq!(
        holder(&common::cluster().await.client(), &namespace)
            .await
            .as_deref(),
        Some("replica-b")
    );
    eprintln!("takeover after kill: {takeover:?} (lease duration {lease:?})");
    b.kill();
}

#[tokio::test]
async fn a_leader_shutting_down_releases_the_lease_so_the_follower_takes_over_at_once() {
    let namespace = common::namespace().await;
    let a = Replica::start(admin_lease_client().await, &namespace, "replica-a");
    until_current(&a.fence, Duration::from_secs(10)).await;
    let b = Replica::start(admin_lease_client().await, &namespace, "replica-b");
    let (overlapped, watcher) = watch_for_overlap(vec![a.fence.clone(), b.fence.clone()]);
    tokio::time::sleep(Duration::from_secs(1)).await;

    let a_fence = a.fence.clone();
    let released_at = Instant::now();
    assert_eq!(
        a.shut_down().await.expect("clean shutdown"),
        ElectionEnd::Released
    );
    assert!(!a_fence.is_current(), "a replica stops acting before it releases");
    let took_over_at = until_current(&b.fence, Duration::from_secs(10)).await;

    let takeover = took_over_at - released_at;
    assert!(
        takeover < Duration::from_secs(2),
        "took over after {takeover:?}: the release was not seen"
    );
    watcher.abort();
    assert!(
        !overlapped.load(Ordering::SeqCst),
        "two replicas were current at once"
    );
    eprintln!("takeover after release: {takeover:?}");
    assert_eq!(
        b.shut_down().await.expect("clean shutdown"),
        ElectionEnd::Released
    );
}

#[tokio::test]
async fn a_follower_shutting_down_has_nothing_to_release() {
    let namespace = common::namespace().await;
    let a = Replica::start(admin_lease_client().await, &namespace, "replica-a");
    until_current(&a.fence, Duration::from_secs(10)).await;
    let b = Replica::start(admin_lease_client().await, &namespace, "replica-b");
    tokio::time::sleep(Duration::from_secs(1)).await;

    assert_eq!(
        b.shut_down().await.expect("clean shutdown"),
        ElectionEnd::Followed
    );
    assert!(a.fence.is_current());
    a.kill();
}

/// A service account allowed to use Leases in `namespace`, and a token for it.
async fn lease_user(admin: &Client, namespace: &str, name: &str) -> String {
    let meta = |name: &str| ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        ..ObjectMeta::default()
    };
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    accounts
        .create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: meta(name),
                ..ServiceAccount::default()
            },
        )
        .await
        .expect("service account");
    let role = Role {
        metadata: meta(name),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["coordination.k8s.io".to_owned()]),
            resources: Some(vec!["leases".to_owned()]),
            verbs: ["get", "create", "update"].map(str::to_owned).to_vec(),
            ..PolicyRule::default()
        }]),
    };
    Api::<Role>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &role)
        .await
        .expect("role");
    let binding = RoleBinding {
        metadata: meta(name),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_owned(),
            kind: "Role".to_owned(),
            name: name.to_owned(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name: name.to_owned(),
            namespace: Some(namespace.to_owned()),
            ..Subject::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &binding)
        .await
        .expect("binding");
    accounts
        .create_token_request(name, &PostParams::default(), &TokenRequest::default())
        .await
        .expect("token")
        .status
        .expect("token status")
        .token
}

#[tokio::test]
async fn a_leader_that_cannot_renew_stops_acting_at_its_deadline_and_exits_before_anyone_takes_over() {
    let namespace = common::namespace().await;
    let cluster = common::cluster().await;
    let admin = cluster.client();
    let token = lease_user(&admin, &namespace, "replica-a").await;
    let a_client = lease_client(cluster.config_with_token(&token)).expect("client");
    let a = Replica::start(a_client, &namespace, "replica-a");
    // Wait for the first renewal to go through with the service account's rights.
    until_current(&a.fence, Duration::from_secs(10)).await;
    let b = Replica::start(admin_lease_client().await, &namespace, "replica-b");
    let (overlapped, watcher) = watch_for_overlap(vec![a.fence.clone(), b.fence.clone()]);
    tokio::time::sleep(Duration::from_secs(1)).await;

    // The API server now refuses every renewal (403), as during a partition or an RBAC mistake.
    let revoked_at = Instant::now();
    Api::<RoleBinding>::namespaced(admin.clone(), &namespace)
        .delete("replica-a", &DeleteParams::default())
        .await
        .expect("revoking");
    let a_fence = a.fence.clone();
    let ended = tokio::time::timeout(Duration::from_secs(10), a.task)
        .await
        .expect("the leader to step down")
        .expect("task");
    let stepped_down_at = Instant::now();
    let took_over_at = until_current(&b.fence, Duration::from_secs(15)).await;

    assert!(
        matches!(
            ended,
            Err(RunElectionError::LostLease(StepDownReason::RenewDeadlinePassed))
        ),
        "{ended:?}"
    );
    assert!(!a_fence.is_current());
    let stepped_down = stepped_down_at - revoked_at;
    assert!(
        stepped_down <= timings().renew_deadline + Duration::from_millis(500),
        "stepped down after {stepped_down:?}"
    );
    assert!(
        took_over_at > stepped_down_at,
        "the follower took over before the leader stepped down"
    );
    watcher.abort();
    assert!(
        !overlapped.load(Ordering::SeqCst),
        "two replicas were current at once"
    );
    eprintln!(
        "step-down after revocation: {stepped_down:?}; gap before takeover: {:?}",
        took_over_at - stepped_down_at
    );
    b.kill();
}

#[tokio::test]
async fn a_leader_whose_lease_was_overwritten_steps_down_instead_of_overwriting_it_back() {
    let namespace = common::namespace().await;
    let a = Replica::start(admin_lease_client().await, &namespace, "replica-a");
    until_current(&a.fence, Duration::from_secs(10)).await;
    let a_fence = a.fence.clone();

    // Another writer claims the Lease (a split brain, or a person): the leader's next renewal
    // carries a stale resourceVersion, is refused with 409, and the leader reads the new holder.
    let leases: Api<Lease> = Api::namespaced(common::cluster().await.client(), &namespace);
    let mut lease = leases.get("gpu-remediator").await.expect("lease");
    lease.spec.as_mut().expect("spec").holder_identity = Some("intruder".to_owned());
    leases
        .replace("gpu-remediator", &PostParams::default(), &lease)
        .await
        .expect("overwriting the lease");
    let ended = tokio::time::timeout(Duration::from_secs(5), a.task)
        .await
        .expect("the leader to step down")
        .expect("task");

    assert!(
        matches!(
            ended,
            Err(RunElectionError::LostLease(StepDownReason::LeaseTakenOver))
        ),
        "{ended:?}"
    );
    assert!(!a_fence.is_current());
    assert_eq!(
        holder(&common::cluster().await.client(), &namespace)
            .await
            .as_deref(),
        Some("intruder")
    );
}
