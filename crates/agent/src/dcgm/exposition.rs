//! A bounded reader of the Prometheus text exposition format, as far as the agent needs it: the
//! samples (`name{label="value",...} value [timestamp]`). Comments (`# HELP`, `# TYPE`) and blank
//! lines are passed over; a line over [`MAX_LINE_BYTES`] or in no known shape is skipped and
//! counted, never a panic; at most [`MAX_SAMPLES`] samples are kept.

/// Lines longer than this are skipped.
pub const MAX_LINE_BYTES: usize = 8192;
/// Samples past this many are dropped (counted as skipped).
pub const MAX_SAMPLES: usize = 100_000;

/// One sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The metric name.
    pub name: String,
    /// Its labels, in the order given.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

impl Sample {
    /// The value of label `name`.
    #[must_use]
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(label, _)| label == name)
            .map(|(_, value)| value.as_str())
    }
}

/// The samples of `text`, and how many lines were skipped.
#[must_use]
pub fn parse(text: &str) -> (Vec<Sample>, usize) {
    let mut samples = Vec::new();
    let mut skipped = 0;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.len() > MAX_LINE_BYTES || samples.len() >= MAX_SAMPLES {
            skipped += 1;
            continue;
        }
        match sample(line) {
            Some(sample) => samples.push(sample),
            None => skipped += 1,
        }
    }
    (samples, skipped)
}

fn sample(line: &str) -> Option<Sample> {
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    {
        return None;
    }
    let (labels, rest) = if line[name_end..].starts_with('{') {
        labels(&line[name_end + 1..])?
    } else {
        (Vec::new(), &line[name_end..])
    };
    let mut fields = rest.split_whitespace();
    let value = match fields.next()? {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        number => number.parse().ok()?,
    };
    // An optional timestamp, then nothing.
    if let Some(timestamp) = fields.next() {
        timestamp.parse::<i64>().ok()?;
    }
    if fields.next().is_some() {
        return None;
    }
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// `name="value",...}` and what follows the closing brace.
fn labels(mut rest: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let (name, after) = rest.split_once('=')?;
        let name = name.trim();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return None;
        }
        let quoted = after.trim_start().strip_prefix('"')?;
        let mut chars = quoted.char_indices();
        let mut value = String::new();
        let end = loop {
            let (at, c) = chars.next()?;
            match c {
                '"' => break at,
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    escaped => value.push(escaped),
                },
                c => value.push(c),
            }
        };
        labels.push((name.to_owned(), value));
        rest = quoted[end + 1..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dcgm_exporter_lines_give_their_samples() {
        let text = "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.\n\
                    # TYPE DCGM_FI_DEV_XID_ERRORS gauge\n\
                    DCGM_FI_DEV_XID_ERRORS{gpu=\"0\",UUID=\"GPU-a\",pci_bus_id=\"00000000:3B:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"n1\"} 79\n\
                    \n\
                    DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\"GPU-a\"} 35 1764403200000\n\
                    up 1\n";
        let (samples, skipped) = parse(text);
        assert_eq!(skipped, 0);
        assert_eq!(samples.len(), 3);
        assert_eq!(samples[0].name, "DCGM_FI_DEV_XID_ERRORS");
        assert_eq!(samples[0].label("UUID"), Some("GPU-a"));
        assert_eq!(samples[0].label("modelName"), Some("NVIDIA H100 80GB HBM3"));
        assert!((samples[0].value - 79.0).abs() < f64::EPSILON);
        assert!((samples[1].value - 35.0).abs() < f64::EPSILON);
        assert_eq!(samples[2].labels, vec![]);
    }

    #[test]
    fn escaped_label_values_are_read() {
        let (samples, _) = parse("m{a=\"x\\\"y\\\\z\\n\", b=\"\"} 1\n");
        assert_eq!(samples[0].label("a"), Some("x\"y\\z\n"));
        assert_eq!(samples[0].label("b"), Some(""));
    }

    #[test]
    fn junk_and_over_long_lines_are_skipped_and_counted() {
        let long = format!("m{{a=\"{}\"}} 1", "x".repeat(MAX_LINE_BYTES));
        let text = format!(
            "garbage line here\nm{{a=\"unterminated}} 1\nm{{a=1}} 1\nm 1 2 3\nm notanumber\n{long}\nok 2\nm{{=\"x\"}} 1\n"
        );
        let (samples, skipped) = parse(&text);
        assert_eq!(samples.len(), 1);
        assert_eq!(samples[0].name, "ok");
        assert_eq!(skipped, 7);
    }
}
