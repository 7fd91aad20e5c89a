//! The suspect cause: among a policy's recent failures, the value of a node attribute (a driver
//! label, the kernel, the kubelet, the OS image, a zone, a rack) that a share at or above the
//! policy's threshold carry. Pure.
//!
//! Failures are counted from the records kept and the nodes unhealthy now, by when their trigger
//! began to hold, so the suspicion fades by itself as the window moves on (never latched).

use std::collections::BTreeMap;

use gpu_remediation_api::{Duration, correlated::SuspectStatus, selector::IntOrPercent};

/// One failure in the window: the node's attribute values (none for a node that is gone).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Failure {
    /// Attribute to value.
    pub attributes: BTreeMap<String, String>,
}

/// The value a share of at least `share` of `failures` (and at least `min_failures` of them)
/// carry; the most widely shared first, then the attribute listed first. `None` when none is.
#[must_use]
pub fn suspect(
    failures: &[Failure],
    attributes: &[String],
    share: &str,
    min_failures: u32,
    window: Duration,
) -> Option<SuspectStatus> {
    let total = u32::try_from(failures.len()).unwrap_or(u32::MAX);
    let threshold = IntOrPercent::Percent(share.to_owned());
    let mut best: Option<(u32, usize, String)> = None;
    for (index, attribute) in attributes.iter().enumerate() {
        let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
        for failure in failures {
            if let Some(value) = failure.attributes.get(attribute) {
                *counts.entry(value.as_str()).or_default() += 1;
            }
        }
        for (value, count) in counts {
            // At or above the share: count/total >= pct/100, i.e. not (count - 1 allowed).
            let reaches = threshold
                .resolve(total)
                .is_some_and(|needed| count >= needed.max(1));
            if count >= min_failures
                && reaches
                && best
                    .as_ref()
                    .is_none_or(|(c, i, _)| count > *c || (count == *c && index < *i))
            {
                best = Some((count, index, value.to_owned()));
            }
        }
    }
    best.map(|(failures, index, value)| {
        let attribute = attributes[index].clone();
        SuspectStatus {
            message: format!(
                "{failures} of {total} failures in the last {window} are on {attribute}={value}"
            ),
            attribute,
            value,
            failures,
            of: total,
            holding: false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DRIVER: &str = "nvidia.com/cuda.driver.major";

    fn failure(pairs: &[(&str, &str)]) -> Failure {
        Failure {
            attributes: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    fn attributes() -> Vec<String> {
        vec![DRIVER.to_owned(), "nodeInfo.kernelVersion".to_owned()]
    }

    #[test]
    fn seven_of_nine_on_one_driver_name_it_with_the_counts() {
        let mut failures: Vec<Failure> = (0..7).map(|_| failure(&[(DRIVER, "570")])).collect();
        failures.extend((0..2).map(|_| failure(&[(DRIVER, "550")])));
        let named = suspect(&failures, &attributes(), "60%", 3, Duration::from_hours(1)).unwrap();
        assert_eq!((named.attribute.as_str(), named.value.as_str()), (DRIVER, "570"));
        assert_eq!((named.failures, named.of), (7, 9));
        assert_eq!(
            named.message,
            "7 of 9 failures in the last 1h are on nvidia.com/cuda.driver.major=570"
        );
    }

    #[test]
    fn a_share_below_the_threshold_or_too_few_failures_name_nothing() {
        let split: Vec<Failure> = ["570", "570", "550", "550", "535"]
            .iter()
            .map(|v| failure(&[(DRIVER, v)]))
            .collect();
        assert_eq!(
            suspect(&split, &attributes(), "60%", 3, Duration::from_hours(1)),
            None
        );
        let two = vec![failure(&[(DRIVER, "570")]), failure(&[(DRIVER, "570")])];
        assert_eq!(
            suspect(&two, &attributes(), "60%", 3, Duration::from_hours(1)),
            None
        );
    }

    #[test]
    fn exactly_at_the_threshold_is_named() {
        let failures: Vec<Failure> = ["570", "570", "570", "550", "550"]
            .iter()
            .map(|v| failure(&[(DRIVER, v)]))
            .collect();
        let named = suspect(&failures, &attributes(), "60%", 3, Duration::from_hours(1));
        assert_eq!(named.map(|n| n.failures), Some(3));
    }

    #[test]
    fn the_most_shared_value_wins_and_a_tie_goes_to_the_attribute_listed_first() {
        let failures: Vec<Failure> = (0..4)
            .map(|i| {
                failure(&[
                    (DRIVER, "570"),
                    ("nodeInfo.kernelVersion", if i < 3 { "6.8" } else { "6.1" }),
                ])
            })
            .collect();
        let named = suspect(&failures, &attributes(), "50%", 2, Duration::from_hours(1)).unwrap();
        assert_eq!(named.attribute, DRIVER, "4 of 4 beats 3 of 4");
        let kernel_first = vec!["nodeInfo.kernelVersion".to_owned(), DRIVER.to_owned()];
        let all_same: Vec<Failure> = (0..3)
            .map(|_| failure(&[(DRIVER, "570"), ("nodeInfo.kernelVersion", "6.8")]))
            .collect();
        let named = suspect(&all_same, &kernel_first, "50%", 2, Duration::from_hours(1)).unwrap();
        assert_eq!(named.attribute, "nodeInfo.kernelVersion");
    }

    #[test]
    fn failures_of_nodes_that_are_gone_count_in_the_total_only() {
        let mut failures: Vec<Failure> = (0..3).map(|_| failure(&[(DRIVER, "570")])).collect();
        failures.extend((0..3).map(|_| Failure::default()));
        assert_eq!(
            suspect(&failures, &attributes(), "60%", 3, Duration::from_hours(1)),
            None
        );
        let named = suspect(&failures, &attributes(), "50%", 3, Duration::from_hours(1)).unwrap();
        assert_eq!((named.failures, named.of), (3, 6));
    }
}
