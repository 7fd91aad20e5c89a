//! Kubernetes name syntax, checked in Rust: qualified names (label keys, condition types), label
//! values and DNS subdomains.

/// A Kubernetes qualified name (label keys, condition types): an optional DNS-subdomain prefix of at
/// most 253 characters and `/`, then a name of at most 63 characters.
#[must_use]
pub fn is_qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, s),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    name_ok && prefix.is_none_or(is_dns_subdomain)
}

/// A label value: empty, or at most 63 characters starting and ending with a letter or digit.
#[must_use]
pub fn is_label_value(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 63
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
}

/// A lowercase RFC 1123 subdomain of at most 253 characters.
#[must_use]
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && label.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_keys_follow_the_kubernetes_qualified_name_rules() {
        for good in [
            "gpu",
            "nvidia.com/gpu.product",
            "a/b",
            "k8s.io/A_b-c.d",
            &"x".repeat(63),
        ] {
            assert!(is_qualified_name(good), "{good}");
        }
        let long_prefix = format!("{}/gpu", vec!["a".repeat(63); 5].join("."));
        for bad in [
            "",
            "-gpu",
            "gpu-",
            "gpu product",
            "Nvidia.com/gpu",
            "/gpu",
            "a/",
            &"x".repeat(64),
            &long_prefix,
        ] {
            assert!(!is_qualified_name(bad), "{bad}");
        }
    }
}
