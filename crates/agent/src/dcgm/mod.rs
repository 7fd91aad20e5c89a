//! DCGM as an optional second opinion: the agent scrapes a DCGM exporter's Prometheus metrics on
//! its node (`--dcgm-metrics-url`, off by default) and feeds what it reports into the same
//! assessment as NVML:
//!
//! - `DCGM_FI_DEV_XID_ERRORS` (per GPU, the `UUID` label; its value is the *last* XID the GPU
//!   raised): a new XID when the value changes to a non-zero one. The first scrape only sets the
//!   baseline (the value may be an XID handled long ago; the kernel log covers XIDs raised while
//!   the agent was down), and the same XID raised twice in a row shows no change: DCGM's gauge
//!   cannot tell. Through the catalog, and deduplicated with the other paths (`xid_dedup`).
//! - `DCGM_FI_DEV_ECC_DBE_VOL_TOTAL` > 0: `DoubleBitEcc`; `DCGM_FI_DEV_ROW_REMAP_FAILURE` > 0:
//!   `RowRemapFailure`; `DCGM_FI_DEV_ROW_REMAP_PENDING` > 0: `RowRemapPending` (as NVML's readings).
//!
//! An exporter that does not answer within the timeout, answers other than 200, or sends more than
//! [`MAX_RESPONSE_BYTES`] is a detector fault (`GpuHealthy=Unknown`, reason
//! [`REASON_DCGM_UNAVAILABLE`]), never a GPU fault.

pub mod exposition;

use std::{collections::BTreeMap, time::Duration};

use gpu_remediation_api::constants::gpu_reasons;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use self::exposition::Sample;

/// Detector-fault reason: the DCGM exporter did not answer.
pub const REASON_DCGM_UNAVAILABLE: &str = "DcgmUnavailable";

/// The largest metrics response read.
pub const MAX_RESPONSE_BYTES: u64 = 8 << 20;

/// Why a scrape failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("DCGM exporter {url} unavailable: {message}")]
pub struct DcgmError {
    /// The URL scraped.
    pub url: String,
    /// What went wrong.
    pub message: String,
}

/// What one scrape reports, per GPU UUID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DcgmReport {
    /// New XIDs: (UUID, PCI bus id where labelled, XID).
    pub xids: Vec<(String, Option<String>, u64)>,
    /// Fatal health fields: (UUID, reason, what DCGM says).
    pub faults: Vec<(String, &'static str, String)>,
}

/// A DCGM exporter's metrics endpoint.
pub struct DcgmSource {
    url: String,
    /// `host:port`.
    authority: String,
    path: String,
    timeout: Duration,
    /// The last `DCGM_FI_DEV_XID_ERRORS` of each GPU; `None` before the first scrape.
    last_xids: Option<BTreeMap<String, u64>>,
}

impl DcgmSource {
    /// Scrapes `url` (`http://host:port/path`), each scrape within `timeout`.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("{url}: only http:// URLs (the exporter on this node)"))?;
        let (authority, path) = rest
            .split_once('/')
            .map_or((rest, "/metrics".to_owned()), |(a, p)| (a, format!("/{p}")));
        if authority.is_empty() || !authority.contains(':') {
            return Err(format!("{url}: needs host:port"));
        }
        Ok(Self {
            url: url.to_owned(),
            authority: authority.to_owned(),
            path,
            timeout,
            last_xids: None,
        })
    }

    fn error(&self, message: impl std::fmt::Display) -> DcgmError {
        DcgmError {
            url: self.url.clone(),
            message: message.to_string(),
        }
    }

    /// One scrape: the response body.
    pub async fn scrape(&self) -> Result<String, DcgmError> {
        match tokio::time::timeout(self.timeout, self.get()).await {
            Ok(result) => result,
            Err(_) => Err(self.error(format!("no answer within {:?}", self.timeout))),
        }
    }

    async fn get(&self) -> Result<String, DcgmError> {
        let mut stream = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(|err| self.error(err))?;
        // HTTP/1.0: the body ends with the connection, never chunked.
        let request = format!(
            "GET {} HTTP/1.0\r\nHost: {}\r\nAccept: text/plain\r\n\r\n",
            self.path, self.authority
        );
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|err| self.error(err))?;
        let mut response = Vec::new();
        (&mut stream)
            .take(MAX_RESPONSE_BYTES + 1)
            .read_to_end(&mut response)
            .await
            .map_err(|err| self.error(err))?;
        if response.len() as u64 > MAX_RESPONSE_BYTES {
            return Err(self.error(format!("response over {MAX_RESPONSE_BYTES} bytes")));
        }
        let text = String::from_utf8_lossy(&response);
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| self.error("malformed HTTP response"))?;
        let status = head.split(' ').nth(1).unwrap_or_default();
        if status != "200" {
            return Err(self.error(format!("HTTP status {status}")));
        }
        Ok(body.to_owned())
    }

    /// What a scrape's body reports (new XIDs against the previous scrape, and fatal fields).
    pub fn report(&mut self, body: &str) -> DcgmReport {
        let (samples, skipped) = exposition::parse(body);
        if skipped > 0 {
            tracing::warn!(url = %self.url, skipped, "DCGM metrics lines skipped");
        }
        let mut report = DcgmReport::default();
        let mut xids = BTreeMap::new();
        for sample in &samples {
            let Some(uuid) = sample.label("UUID") else {
                continue;
            };
            let count = if sample.value.is_finite() && sample.value > 0.0 {
                #[allow(
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss,
                    reason = "finite and positive, checked above; DCGM's values are integers"
                )]
                let count = sample.value as u64;
                count
            } else {
                0
            };
            match sample.name.as_str() {
                "DCGM_FI_DEV_XID_ERRORS" => {
                    xids.insert(uuid.to_owned(), count);
                    let previous = self
                        .last_xids
                        .as_ref()
                        .map(|last| last.get(uuid).copied().unwrap_or(0));
                    if count > 0 && previous.is_some_and(|previous| previous != count) {
                        report.xids.push((uuid.to_owned(), pci(sample), count));
                    }
                }
                "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" if count > 0 => report.faults.push((
                    uuid.to_owned(),
                    gpu_reasons::DOUBLE_BIT_ECC,
                    format!("{count} volatile double-bit ECC errors (DCGM)"),
                )),
                "DCGM_FI_DEV_ROW_REMAP_FAILURE" if count > 0 => report.faults.push((
                    uuid.to_owned(),
                    gpu_reasons::ROW_REMAP_FAILURE,
                    "row remapping failed (DCGM)".to_owned(),
                )),
                "DCGM_FI_DEV_ROW_REMAP_PENDING" if count > 0 => report.faults.push((
                    uuid.to_owned(),
                    gpu_reasons::ROW_REMAP_PENDING,
                    "row remapping pending, the GPU needs a reset (DCGM)".to_owned(),
                )),
                _ => {}
            }
        }
        self.last_xids = Some(xids);
        report
    }
}

fn pci(sample: &Sample) -> Option<String> {
    sample.label("pci_bus_id").map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xid_body(value: u64) -> String {
        format!(
            "# TYPE DCGM_FI_DEV_XID_ERRORS gauge\nDCGM_FI_DEV_XID_ERRORS{{gpu=\"0\",UUID=\"GPU-a\",pci_bus_id=\"00000000:3B:00.0\"}} {value}\nDCGM_FI_DEV_XID_ERRORS{{gpu=\"1\",UUID=\"GPU-b\"}} 0\n"
        )
    }

    fn source() -> DcgmSource {
        DcgmSource::new("http://127.0.0.1:9400/metrics", Duration::from_secs(1)).unwrap()
    }

    #[test]
    fn an_xid_counts_when_the_last_xid_changes_after_the_first_scrape() {
        let mut source = source();
        assert_eq!(
            source.report(&xid_body(13)).xids,
            vec![],
            "the first scrape is the baseline"
        );
        assert_eq!(source.report(&xid_body(13)).xids, vec![]);
        assert_eq!(
            source.report(&xid_body(79)).xids,
            vec![("GPU-a".to_owned(), Some("00000000:3B:00.0".to_owned()), 79)]
        );
        assert_eq!(source.report(&xid_body(0)).xids, vec![]);
    }

    #[test]
    fn fatal_health_fields_are_reported_per_gpu() {
        let mut source = source();
        let report = source.report(
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{UUID=\"GPU-a\"} 2\nDCGM_FI_DEV_ROW_REMAP_PENDING{UUID=\"GPU-b\"} 1\nDCGM_FI_DEV_ROW_REMAP_FAILURE{UUID=\"GPU-b\"} 0\n",
        );
        let reasons: Vec<(&str, &str)> = report
            .faults
            .iter()
            .map(|(uuid, reason, _)| (uuid.as_str(), *reason))
            .collect();
        assert_eq!(
            reasons,
            vec![("GPU-a", "DoubleBitEcc"), ("GPU-b", "RowRemapPending")]
        );
    }

    #[test]
    fn only_plain_http_urls_with_a_port_are_taken() {
        assert!(DcgmSource::new("https://x:9400/metrics", Duration::from_secs(1)).is_err());
        assert!(DcgmSource::new("http://x/metrics", Duration::from_secs(1)).is_err());
        let source = DcgmSource::new("http://x:9400", Duration::from_secs(1)).unwrap();
        assert_eq!(
            (source.authority.as_str(), source.path.as_str()),
            ("x:9400", "/metrics")
        );
    }

    #[tokio::test]
    async fn an_exporter_that_does_not_answer_is_an_error_not_an_empty_report() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        drop(listener);
        let source = DcgmSource::new(&format!("http://{address}/metrics"), Duration::from_secs(1)).unwrap();
        let err = source.scrape().await.unwrap_err();
        assert!(err.to_string().contains("unavailable"), "{err}");
    }
}
