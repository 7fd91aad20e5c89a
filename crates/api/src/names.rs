//! Kubernetes name syntax, checked in Rust: qualified names (label keys, condition types), label
//! values and DNS subdomains; and NVML's GPU UUIDs, as a node reports them.

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

/// A GPU or MIG device UUID as NVML writes it (`GPU-` or `MIG-`, then letters, digits and dashes;
/// the legacy MIG form `MIG-GPU-<uuid>/<gi>/<ci>` too), at most 96 characters: no quote, space,
/// `$` or any other character a shell or a template would read. A node reports its
/// GPUs' UUIDs, and a step's template may put one into a command line: nothing else gets there.
#[must_use]
pub fn is_gpu_uuid(s: &str) -> bool {
    let rest = s.strip_prefix("GPU-").or_else(|| s.strip_prefix("MIG-"));
    rest.is_some_and(|rest| {
        s.len() <= 96
            && !rest.is_empty()
            && rest
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '/'))
    })
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
    fn gpu_uuids_are_nvmls_forms_and_nothing_a_shell_would_read() {
        for uuid in [
            "GPU-5a1c3f0e-8d2b-4c4e-9f11-2a7d3b6e0c01",
            "MIG-8a3b4c5d-1111-2222-3333-444455556666",
            "MIG-GPU-5a1c3f0e-8d2b-4c4e-9f11-2a7d3b6e0c01/1/0",
        ] {
            assert!(is_gpu_uuid(uuid), "{uuid}");
        }
        for bad in [
            "",
            "GPU-",
            "5a1c3f0e-8d2b-4c4e-9f11-2a7d3b6e0c01",
            "GPU-1\"; rm -rf /; \"",
            "GPU-$(reboot)",
            "GPU-1 2",
            "GPU-1`id`",
            &format!("GPU-{}", "a".repeat(93)),
        ] {
            assert!(!is_gpu_uuid(bad), "{bad:?}");
        }
        assert!(is_gpu_uuid(&format!("GPU-{}", "a".repeat(92))), "96 characters");
    }

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
