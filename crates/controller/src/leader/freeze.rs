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
    // No `unsafe` (the crate forbids it), so no raise(3): kill(1) stops us while we wait for it.
    // A process-directed SIGSTOP stops the threads one by one, starting with the thread the
    // kernel picks to take it: named by our pid, that can be another thread, and this one could
    // return from the wait and send the write before its own stop (seen: the write sent 4 ms
    // after, the process stopped only after that). Named by this thread's id, the signal is
    // still the whole process's, but this thread takes it first: it stops before it returns
    // from the wait, and runs on only once continued.
    let stopped =
        this_thread_id().and_then(|tid| std::process::Command::new("kill").args(["-STOP", &tid]).status());
    match stopped {
        Ok(status) if status.success() => tracing::warn!(write, "test hook: continued; sending the write"),
        other => tracing::error!(
            write,
            ?other,
            "test hook: could not stop this process; sending the write"
        ),
    }
}

/// This thread's id: `/proc/thread-self` links to `<pid>/task/<tid>`.
fn this_thread_id() -> std::io::Result<String> {
    let link = std::fs::read_link("/proc/thread-self")?;
    link.file_name()
        .map(|tid| tid.to_string_lossy().into_owned())
        .ok_or_else(|| std::io::Error::other(format!("/proc/thread-self links to {}", link.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thread_id_names_the_calling_thread_not_the_process() {
        let pid = std::process::id().to_string();
        let (tid, a_thread_of_ours) = std::thread::spawn(|| {
            let tid = this_thread_id().expect("the thread id");
            let ours = std::path::Path::new(&format!("/proc/self/task/{tid}")).exists();
            (tid, ours)
        })
        .join()
        .expect("the thread");
        assert_ne!(tid, pid, "a spawned thread's id is not the process id");
        assert!(a_thread_of_ours, "{tid} is not a thread of this process");
    }
}
