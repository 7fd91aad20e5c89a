//! JSON logs on stdout, and the span every remediation's work runs in, so each log line carries
//! the remediation, node and policy it concerns.

use tracing::Span;
use tracing_subscriber::EnvFilter;

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum InitLogsError {
    /// `RUST_LOG` is not a valid filter.
    #[error("invalid RUST_LOG filter: {0}")]
    Filter(#[from] tracing_subscriber::filter::ParseError),
    /// A global subscriber was already installed.
    #[error("a global tracing subscriber is already installed: {0}")]
    AlreadyInstalled(#[from] tracing_subscriber::util::TryInitError),
}

/// The default filter. kube's client logs every 5xx answer at ERROR from its trace layer; the
/// controller meets some on purpose (an eviction of a pod under two budgets answers 500, every
/// few seconds while it is blocked) and records each one itself, as a blocker or an error of its
/// own with context, so the client's line is only noise.
pub const DEFAULT_FILTER: &str = "info,kube_client::client::builder=off";

/// Installs a JSON subscriber on stdout: one object per line, with the current span and the span
/// list, filtered by `RUST_LOG` (default [`DEFAULT_FILTER`]).
pub fn init_json_logs() -> Result<(), InitLogsError> {
    use tracing_subscriber::{layer::SubscriberExt as _, util::SubscriberInitExt as _};
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.is_empty() => EnvFilter::try_new(directives)?,
        _ => EnvFilter::new(DEFAULT_FILTER),
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(json_layer(std::io::stdout))
        .try_init()?;
    Ok(())
}

/// The JSON log layer writing to `writer`: one object per line, the event's fields flattened, with
/// the current span and the list of spans it is in (what `remediation=<name>` filters on).
pub fn json_layer<S, W>(writer: W) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
    W: for<'writer> tracing_subscriber::fmt::MakeWriter<'writer> + 'static,
{
    tracing_subscriber::fmt::layer()
        .json()
        .with_current_span(true)
        .with_span_list(true)
        .flatten_event(true)
        .with_writer(writer)
}

/// The span a remediation's work runs in: every advance of a remediation is instrumented with it
/// (`controller::Advances::start`), so each log line of its cordon, drain and replacement carries
/// `remediation`, `node`, `policy` and `phase` (the phase it was in when the advance began; the
/// advance records each new phase as it settles, see [`record_phase`]).
#[must_use]
pub fn remediation_span(remediation: &str, node: &str, policy: &str, phase: &str) -> Span {
    tracing::info_span!("remediation", remediation, node, policy, phase)
}

/// Records `phase` on the current remediation span (a no-op outside one).
pub fn record_phase(phase: &str) {
    Span::current().record("phase", phase);
}
