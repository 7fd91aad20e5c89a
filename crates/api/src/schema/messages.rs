//! The sentences of the schema's rules, shared with `crate::validate` so both say the same thing.

/// A duration that does not parse.
pub const DURATION_FORMAT: &str =
    "must be a duration such as 90s, 5m or 1h30m: numbers each followed by a unit (ns, us, ms, s, m or h)";
/// A zero duration where zero means nothing.
pub const DURATION_POSITIVE: &str = "must be longer than zero";
/// An int-or-percent count below 1.
pub const COUNT_AT_LEAST_ONE: &str = "a count must be at least 1 (to stop remediating, set paused: true)";
/// An int-or-percent share outside 1%..100%.
pub const PERCENT_RANGE: &str = "a share must be a whole percentage from 1% to 100%, such as 10%";
/// `rate.limit` of 0.
pub const RATE_LIMIT: &str = "rate.limit must be at least 1: a limit of 0 would never remediate (to stop remediating, set paused: true)";
/// An int-or-percent count above `bounds::COUNT_MAX`.
pub const COUNT_AT_MOST: &str = "a count must be at most 100000 (use a share such as 10% for a larger fleet)";
/// `rate.limit` above `bounds::RATE_LIMIT_MAX`.
pub const RATE_LIMIT_MAX: &str = "rate.limit must be at most 10000 remediations per window";
/// `maxAttemptsPerNode.count` above `bounds::ATTEMPTS_MAX`.
pub const ATTEMPTS_COUNT_MAX: &str = "maxAttemptsPerNode.count must be at most 100";
/// A grace period above `bounds::GRACE_PERIOD_MAX_SECONDS`.
pub const GRACE_PERIOD_MAX: &str = "gracePeriodSeconds must be at most 86400 (a day)";
/// `maxAttemptsPerNode.count` of 0.
pub const ATTEMPTS_COUNT: &str = "maxAttemptsPerNode.count must be at least 1: it is how many remediations of one node may start before a person must step in";
/// `repeatOffender.failures` of 0.
pub const OFFENDER_FAILURES: &str = "repeatOffender.failures must be at least 1: how many earlier failures of one GPU or host within the window make it a repeat offender";
/// `repeatOffender.failures` above `bounds::ATTEMPTS_MAX`.
pub const OFFENDER_FAILURES_MAX: &str = "repeatOffender.failures must be at most 100";
/// `validation.newNodes.max` of 0.
pub const NEW_NODES_MAX: &str = "validation.newNodes.max must be at least 1: how many new nodes are validated at once (leave newNodes unset to validate none)";
/// `validation.newNodes.max` above `bounds::NEW_NODES_MAX`.
pub const NEW_NODES_MAX_ABOVE: &str = "validation.newNodes.max must be at most 1000";
/// A negative grace period.
pub const GRACE_PERIOD: &str =
    "gracePeriodSeconds must be zero or more (leave it unset to use each pod's own grace period)";
/// A zero grace period without the explicit opt-in.
pub const ZERO_GRACE_PERIOD: &str = "gracePeriodSeconds 0 deletes pods at once (a StatefulSet pod may run twice): \
     set allowZeroGracePeriod: true to mean it";
/// Template strategy without a template.
pub const TEMPLATE_REQUIRED: &str = "replacement.template is required when replacement.strategy is Template: it is the object created for each remediation";
/// A template with another strategy.
pub const TEMPLATE_FORBIDDEN: &str = "replacement.template is only used by strategy Template: set replacement.strategy: Template or remove the template";
/// A template without apiVersion or kind. The server's embedded-resource check refuses those
/// before CEL runs (`spec.replacement.template.kind: Required value`); `crate::validate` says it
/// in these words.
pub const TEMPLATE_KIND: &str = "replacement.template must name the object's apiVersion and kind";
/// Reboot without a template to carry it out.
pub const REBOOT_NEEDS_TEMPLATE: &str = "action Reboot is carried out by creating replacement.template (such as a SelfNodeRemediation): set replacement.strategy: Template";
/// No triggers.
pub const TRIGGERS_REQUIRED: &str = "at least one trigger is required: the node condition that marks a GPU node as broken, such as conditionType: GpuHealthy with status: \"False\"";
/// A malformed condition type.
pub const CONDITION_TYPE: &str = "conditionType must be a node condition type such as GpuHealthy: letters, digits, '-', '_' or '.', optionally after a DNS prefix and '/'";
/// An empty reason in a trigger's filter.
pub const REASON_EMPTY: &str =
    "reasons must not contain an empty string; leave reasons out to match every reason";
/// `In`/`NotIn` without values.
pub const SELECTOR_VALUES_REQUIRED: &str = "operators In and NotIn need at least one value";
/// `Exists`/`DoesNotExist` with values.
pub const SELECTOR_VALUES_FORBIDDEN: &str = "operators Exists and DoesNotExist take no values";
/// A malformed label key.
pub const LABEL_KEY: &str = "must be a label key such as nvidia.com/gpu.product: an optional DNS prefix and '/', then up to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit";
/// A malformed label value.
pub const LABEL_VALUE: &str = "must be a label value: empty, or up to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit";
/// A failure domain without any limit.
pub const DOMAIN_LIMIT_REQUIRED: &str =
    "a failure domain needs at least one limit: maxUnhealthy, maxUnhealthyCount or maxInFlight";
/// A failure domain count of 0.
pub const DOMAIN_COUNT_AT_LEAST_ONE: &str =
    "a failure domain count must be at least 1 (to stop remediating, set paused: true)";
/// A failure domain count above `bounds::COUNT_MAX`.
pub const DOMAIN_COUNT_AT_MOST: &str = "a failure domain count must be at most 100000";
/// Two failure domains with one topology key.
pub const DOMAIN_KEYS_DISTINCT: &str = "each failure domain needs its own topologyKey";
/// `history.ttl` not longer than `rate.per`.
pub const TTL_VS_RATE: &str = "history.ttl must be longer than safety.rate.per, or finished remediations would be deleted while the rate limit still counts them";
/// `history.ttl` not longer than `maxAttemptsPerNode.per`.
pub const TTL_VS_ATTEMPTS: &str = "history.ttl must be longer than safety.maxAttemptsPerNode.per, or finished remediations would be deleted while the attempts limit still counts them";
/// A policy name too long to be a label value.
pub const POLICY_NAME: &str = "a policy name must be at most 63 characters: it is the gpuremediation.dev/policy label value of its remediations";
/// A quarantine hysteresis outside 1s..1h.
pub const QUARANTINE_HYSTERESIS: &str = "quarantine.hysteresis must be from 1s to 1h: how long a cleared signal stays clear before the quarantine taint is lifted";
/// A `drain.unreachableAfter` outside 0s..1h.
pub const DRAIN_UNREACHABLE_AFTER: &str = "drain.unreachableAfter must be from 0s to 1h: how long past its deletionTimestamp a pod on an unreachable node is waited for";
/// A `drain.notice` outside 0s..1h.
pub const DRAIN_NOTICE: &str = "drain.notice must be from 0s to 1h: how long a pod given the checkpoint notice may take before it is evicted";
/// A change to a remediation's spec.
pub const REMEDIATION_SPEC_IMMUTABLE: &str =
    "a remediation's spec is its audit record and cannot change; delete the remediation instead";
