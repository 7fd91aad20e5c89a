//! One copy of each short text the node cache holds on many nodes: the types, statuses, reasons and
//! messages of conditions, the kernel, kubelet, OS image and runtime of `nodeInfo`. A fleet's
//! kubelets and agents write the same few dozen of them on every node; kept once, they cost the
//! cache bytes a text, not bytes a node.
//!
//! A node may write any text it likes (a message that changes at every resync, a forged reason),
//! so the table is bounded by what the cache holds: a text no node holds any more is swept out
//! once the table has doubled since its last sweep, and a long text is never shared.

use std::{collections::HashSet, sync::Arc};

/// Texts longer than this are kept as their own copy: the texts a fleet repeats are short, and a
/// long one shared would only make the table's sweep slower.
const LONGEST_SHARED: usize = 256;

/// The table's size at which it is first swept.
const FIRST_SWEEP: usize = 1024;

/// The table of shared texts. Owned by the node store's writer: one table for the whole cache.
#[derive(Debug)]
pub struct SharedText {
    texts: HashSet<Arc<str>>,
    /// The table's size at which the texts no node holds are swept out.
    sweep_at: usize,
}

impl Default for SharedText {
    fn default() -> Self {
        Self {
            texts: HashSet::new(),
            sweep_at: FIRST_SWEEP,
        }
    }
}

impl SharedText {
    /// `text`, shared with every other holder of the same text.
    pub fn share(&mut self, text: &str) -> Arc<str> {
        if text.len() > LONGEST_SHARED {
            return Arc::from(text);
        }
        if let Some(kept) = self.texts.get(text) {
            return kept.clone();
        }
        if self.texts.len() >= self.sweep_at {
            self.sweep();
        }
        let kept: Arc<str> = Arc::from(text);
        self.texts.insert(kept.clone());
        kept
    }

    /// Drops the texts only the table holds; the next sweep comes when the table has doubled.
    fn sweep(&mut self) {
        self.texts.retain(|text| Arc::strong_count(text) > 1);
        self.sweep_at = FIRST_SWEEP.max(2 * self.texts.len());
    }

    /// How many texts the table holds.
    #[must_use]
    pub fn len(&self) -> usize {
        self.texts.len()
    }

    /// Whether the table holds none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.texts.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_text_is_kept_once() {
        let mut table = SharedText::default();
        let a = table.share("KubeletReady");
        let b = table.share("KubeletReady");
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(table.len(), 1);
        assert_eq!(
            &*table.share("KubeletHasSufficientPID"),
            "KubeletHasSufficientPID"
        );
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn a_long_text_is_not_shared() {
        let mut table = SharedText::default();
        let long = "x".repeat(LONGEST_SHARED + 1);
        let a = table.share(&long);
        let b = table.share(&long);
        assert_eq!(a, b);
        assert!(!Arc::ptr_eq(&a, &b));
        assert!(table.is_empty());
    }

    /// A node writing a new message at every resync: the table stays within twice what the nodes
    /// hold (and the first sweep's size), however many texts went through it.
    #[test]
    fn texts_nobody_holds_are_swept_so_the_table_stays_bounded() {
        let mut table = SharedText::default();
        let held: Vec<Arc<str>> = (0..100).map(|i| table.share(&format!("held {i}"))).collect();
        for i in 0..100_000 {
            let _dropped = table.share(&format!("resync {i}"));
            assert!(
                table.len() <= FIRST_SWEEP.max(2 * held.len()) + 1,
                "at {i}: {}",
                table.len()
            );
        }
        for (i, text) in held.iter().enumerate() {
            assert!(
                Arc::ptr_eq(text, &table.share(&format!("held {i}"))),
                "held texts stay shared"
            );
        }
    }
}
