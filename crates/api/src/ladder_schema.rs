//! What the CRD schema refuses in a ladder (see `crate::ladder`): a step's timeout from 1s to
//! 24h, a template exactly on `ResetGpu` and `Reboot`, at most one of each rung in climbing order
//! with `HandOff` last, and a trigger's `startAt` naming a rung the ladder has.

use schemars::{Schema, SchemaGenerator, json_schema};
use serde_json::Value;

use crate::schema::{add_rules, duration_ok, object, property, rule};

/// Messages of the ladder's rules, shared with `crate::validate`.
pub mod messages {
    /// A step's timeout outside 1s..24h.
    pub const STEP_TIMEOUT: &str = "a ladder step's timeout must be from 1s to 24h: how long the step may take to prove itself before the next step is tried";
    /// A template missing on `ResetGpu`/`Reboot`.
    pub const STEP_TEMPLATE_REQUIRED: &str = "ladder steps ResetGpu and Reboot need a template: the object created to carry out the step (a reset Job, a SelfNodeRemediation, a GPU reset resource)";
    /// A template on `Replace`/`HandOff`.
    pub const STEP_TEMPLATE_FORBIDDEN: &str = "only ladder steps ResetGpu and Reboot take a template: Replace follows spec.replacement and HandOff hands the node to a person";
    /// Rungs out of order or repeated.
    pub const LADDER_ORDER: &str =
        "ladder steps climb in the order ResetGpu, Reboot, Replace, HandOff, each at most once";
    /// A `startAt` the ladder lacks.
    pub const START_AT: &str = "a trigger's startAt must name a step of spec.ladder";
}

/// The schema of a step's template: any object with `apiVersion` and `kind`.
pub(crate) fn embedded_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "x-kubernetes-embedded-resource": true,
    })
}

/// A ladder step: bounded timeout, a template exactly where one is used.
pub(crate) fn ladder_step(schema: &mut Schema) {
    add_rules(
        property(schema, "timeout"),
        [rule(
            format!(
                "!{} || (duration(self) >= duration('1s') && duration(self) <= duration('24h'))",
                duration_ok("self")
            ),
            messages::STEP_TIMEOUT,
        )],
    );
    add_rules(
        object(schema),
        [
            rule(
                "!(self.step == 'ResetGpu' || self.step == 'Reboot') || has(self.template)",
                messages::STEP_TEMPLATE_REQUIRED,
            )
            .field_path(".template")
            .reason(kube::core::Reason::FieldValueRequired),
            rule(
                "!has(self.template) || self.step == 'ResetGpu' || self.step == 'Reboot'",
                messages::STEP_TEMPLATE_FORBIDDEN,
            )
            .field_path(".template")
            .reason(kube::core::Reason::FieldValueForbidden),
        ],
    );
}

/// The rank of each rung in CEL, for the order rule.
const RANK: &str = "{'ResetGpu': 0, 'Reboot': 1, 'Replace': 2, 'HandOff': 3}";

/// `spec.ladder` (a list of at most four steps climbing in order) and the triggers' `startAt`.
pub(crate) fn policy_ladder(schema: &mut Schema) {
    let ladder = property(schema, "ladder");
    ladder.insert(
        "maxItems".into(),
        Value::from(u64::try_from(crate::bounds::LADDER_STEPS_MAX).unwrap_or(4)),
    );
    add_rules(
        ladder,
        [rule(
            (0..crate::bounds::LADDER_STEPS_MAX - 1)
                .map(|i| {
                    format!(
                        "(size(self) <= {} || {RANK}[self[{i}].step] < {RANK}[self[{}].step])",
                        i + 1,
                        i + 1
                    )
                })
                .collect::<Vec<_>>()
                .join(" && "),
            messages::LADDER_ORDER,
        )],
    );
    add_rules(
        object(schema),
        [rule(
            "!has(self.ladder) || size(self.ladder) == 0 || self.triggers.all(t, !has(t.startAt) || self.ladder.exists(s, s.step == t.startAt))",
            messages::START_AT,
        )
        .field_path(".triggers")],
    );
}
