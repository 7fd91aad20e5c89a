//! The same node rebooted twice in one run through a template named after the node, as Self Node
//! Remediation requires (`{{nodeName}}`): the first attempt's object outlives its remediation, so
//! the second attempt deletes it (it is ours: its controlling owner is the finished first record),
//! waits for it to go, and creates its own. Both recoveries are released.

mod common;
mod scenario;

use scenario::reboots::{reboot_twice, replacement_of};

#[tokio::test]
async fn a_node_rebooted_twice_through_an_object_named_after_it_is_released_both_times() {
    let (first, second) = reboot_twice("{{nodeName}}").await;
    let (first, second) = (replacement_of(&first), replacement_of(&second));
    assert_eq!(first.name, second.name, "both objects are named after the node");
    assert_ne!(first.uid, second.uid, "a new object, not the first one adopted");
}
