//! A test-only hook that stages a deposed leader deterministically: with the environment variable
//! `GPU_REMEDIATOR_TEST_FREEZE_BEFORE` set to a write's name (`eviction`, `status`, or
//! `delete <resource>` such as `delete nodes`), the process stops itself with SIGSTOP the first
//! time it is about to send such a write, after the fence's local check passed and the claim was
//! put on the request. Whoever resumes it (SIGCONT) sends that write late, as a leader frozen by a
//! GC pause or a stopped VM would: the API server's fence policy must refuse it
//! (`e2e/tests/leader_deposed.rs`). Unset (always, outside that test), it does nothing.

use std::sync::{
    LazyLock,
    atomic::{AtomicBool, Ordering},
};

/// The environment variable naming the write to freeze before.
pub const FREEZE_BEFORE_ENV: &str = "GPU_REMEDIATOR_TEST_FREEZE_BEFORE";

static FREEZE_BEFORE: LazyLock<Option<String>> = LazyLock::new(|| std::env::var(FREEZE_BEFORE_ENV).ok());
static FROZEN_ONCE: AtomicBool = AtomicBool::new(false);

/// Called right before a write named `write` is sent; stops the process the first time `write`
/// is the one the test hook names.
pub fn before_write(write: &str) {
    if FREEZE_BEFORE.as_deref() != Some(write) || FROZEN_ONCE.swap(true, Ordering::SeqCst) {
        return;
    }
    tracing::warn!(
        write,
        "test hook {FREEZE_BEFORE_ENV}: stopping this process before the write"
    );
    // No `unsafe` (the crate forbids it), so no raise(3): kill(1) stops us while we wait for it,
    // and the wait returns once we are continued.
    let stopped = std::process::Command::new("kill")
        .args(["-STOP", &std::process::id().to_string()])
        .status();
    tracing::warn!(write, ?stopped, "test hook: continued; sending the write");
}
