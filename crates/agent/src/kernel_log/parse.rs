//! Parses kernel-log records and the NVIDIA driver's XID lines in them. Pure and bounded: a record
//! longer than [`MAX_RECORD_BYTES`] or in no known shape is refused with a [`Skipped`] cause (the
//! reader counts them), never a panic.
//!
//! Record shapes (one per line):
//! - `/dev/kmsg`: `<priority>,<sequence>,<microseconds since boot>,<flags>[,...];<text>`; a line
//!   starting with a space is a continuation (`KEY=value` metadata) and carries no text of its own.
//! - `dmesg`: `[<seconds>.<microseconds>] <text>` (a plain file a test or a person wrote).
//!
//! XID text, as the driver prints it (`kernel_rc.c`):
//! `NVRM: Xid (PCI:<domain>:<bus>:<device>[ GPU-I:<gi>][ GPU-CI:<ci>]): <xid>, [pid=<pid>, name=<name>, ]<detail>`.

use std::fmt;

/// Records longer than this are skipped: the kernel's own limit is about 1 KiB of text.
pub const MAX_RECORD_BYTES: usize = 4096;

/// One kernel-log record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    /// The kernel's sequence number (`/dev/kmsg` only).
    pub sequence: Option<u64>,
    /// Microseconds since boot.
    pub micros_since_boot: u64,
    /// The message.
    pub text: &'a str,
}

/// Why a line was skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skipped {
    /// Longer than [`MAX_RECORD_BYTES`].
    TooLong,
    /// A record or an XID line in no known shape.
    Malformed,
}

/// A PCI address down to the device (the driver's XID line names no function).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciDevice {
    /// PCI domain.
    pub domain: u32,
    /// Bus.
    pub bus: u8,
    /// Device.
    pub device: u8,
}

impl PciDevice {
    /// Parses `domain:bus:device[.function]` in hexadecimal, as the driver (`0000:3b:00`) and NVML
    /// (`00000000:3B:00.0`) both write it.
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.split(':');
        let (domain, bus, device) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || domain.len() > 8 || bus.len() > 2 {
            return None;
        }
        let device = device
            .split_once('.')
            .map_or(device, |(device, _function)| device);
        if device.len() > 2 {
            return None;
        }
        Some(Self {
            domain: u32::from_str_radix(domain, 16).ok()?,
            bus: u8::from_str_radix(bus, 16).ok()?,
            device: u8::from_str_radix(device, 16).ok()?,
        })
    }
}

impl fmt::Display for PciDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}:{:02x}:{:02x}", self.domain, self.bus, self.device)
    }
}

/// One XID line's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelXid {
    /// The GPU's PCI address.
    pub pci: PciDevice,
    /// The MIG GPU instance the driver attributed it to (`GPU-I:`), on a partitioned GPU.
    pub gpu_instance: Option<u32>,
    /// The MIG compute instance (`GPU-CI:`).
    pub compute_instance: Option<u32>,
    /// The XID code.
    pub xid: u64,
    /// The process, as the driver names it (`pid=`), when it does.
    pub pid: Option<String>,
    /// The process name (`name=`).
    pub process: Option<String>,
    /// The rest of the line.
    pub detail: String,
}

/// Parses one line of a kernel log. `Ok(None)`: a continuation line, carrying nothing.
pub fn parse_record(line: &str) -> Result<Option<Record<'_>>, Skipped> {
    if line.len() > MAX_RECORD_BYTES {
        return Err(Skipped::TooLong);
    }
    if line.starts_with(' ') {
        return Ok(None);
    }
    if let Some(rest) = line.strip_prefix('[') {
        let (time, text) = rest.split_once(']').ok_or(Skipped::Malformed)?;
        let (seconds, micros) = time.trim().split_once('.').ok_or(Skipped::Malformed)?;
        let seconds: u64 = seconds.parse().map_err(|_| Skipped::Malformed)?;
        if micros.len() != 6 {
            return Err(Skipped::Malformed);
        }
        let micros: u64 = micros.parse().map_err(|_| Skipped::Malformed)?;
        return Ok(Some(Record {
            sequence: None,
            micros_since_boot: seconds
                .checked_mul(1_000_000)
                .and_then(|us| us.checked_add(micros))
                .ok_or(Skipped::Malformed)?,
            text: text.strip_prefix(' ').unwrap_or(text),
        }));
    }
    let (prefix, text) = line.split_once(';').ok_or(Skipped::Malformed)?;
    let mut fields = prefix.split(',');
    let _priority: u32 = number(fields.next())?;
    let sequence: u64 = number(fields.next())?;
    let micros_since_boot: u64 = number(fields.next())?;
    Ok(Some(Record {
        sequence: Some(sequence),
        micros_since_boot,
        text,
    }))
}

fn number<T: std::str::FromStr>(field: Option<&str>) -> Result<T, Skipped> {
    field
        .ok_or(Skipped::Malformed)?
        .parse()
        .map_err(|_| Skipped::Malformed)
}

/// The XID a record's text reports. `Ok(None)`: not an XID line; `Err`: one that does not parse.
pub fn parse_xid(text: &str) -> Result<Option<KernelXid>, Skipped> {
    let Some(start) = text.find("NVRM: Xid (") else {
        return Ok(None);
    };
    let rest = &text[start + "NVRM: Xid (".len()..];
    let (inside, rest) = rest.split_once("): ").ok_or(Skipped::Malformed)?;
    let mut words = inside.split(' ');
    let pci = words
        .next()
        .and_then(|word| word.strip_prefix("PCI:"))
        .and_then(PciDevice::parse)
        .ok_or(Skipped::Malformed)?;
    let (mut gpu_instance, mut compute_instance) = (None, None);
    for word in words {
        if let Some(id) = word.strip_prefix("GPU-I:") {
            gpu_instance = Some(id.parse().map_err(|_| Skipped::Malformed)?);
        } else if let Some(id) = word.strip_prefix("GPU-CI:") {
            compute_instance = Some(id.parse().map_err(|_| Skipped::Malformed)?);
        } else {
            return Err(Skipped::Malformed);
        }
    }
    let (code, mut rest) = rest.split_once(',').unwrap_or((rest, ""));
    let xid: u64 = code.trim().parse().map_err(|_| Skipped::Malformed)?;
    rest = rest.trim_start();
    let mut field = |key: &str| -> Option<String> {
        let after = rest.strip_prefix(key)?;
        let (value, tail) = after.split_once(',').unwrap_or((after, ""));
        rest = tail.trim_start();
        Some(value.trim().trim_matches('\'').to_owned())
    };
    let pid = field("pid=");
    let process = field("name=");
    Ok(Some(KernelXid {
        pci,
        gpu_instance,
        compute_instance,
        xid,
        pid,
        process,
        detail: rest.trim().to_owned(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xid(text: &str) -> KernelXid {
        parse_xid(text).unwrap().unwrap()
    }

    #[test]
    fn a_kmsg_record_gives_its_sequence_time_and_text() {
        let record = parse_record(
            "3,1234,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
        )
        .unwrap()
        .unwrap();
        assert_eq!(record.sequence, Some(1234));
        assert_eq!(record.micros_since_boot, 5_000_000);
        assert!(record.text.starts_with("NVRM: Xid"));
        assert_eq!(
            parse_record("4,99,17,c,caller=T1;text").unwrap().unwrap().text,
            "text"
        );
        assert_eq!(parse_record(" SUBSYSTEM=pci"), Ok(None), "continuation");
    }

    #[test]
    fn a_dmesg_line_gives_its_time() {
        let record = parse_record(
            "[12345.678901] NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.",
        )
        .unwrap()
        .unwrap();
        assert_eq!(record.sequence, None);
        assert_eq!(record.micros_since_boot, 12_345_678_901);
        assert!(record.text.starts_with("NVRM"));
        assert_eq!(
            parse_record("[    4.123456] NVRM: loading")
                .unwrap()
                .unwrap()
                .micros_since_boot,
            4_123_456
        );
    }

    #[test]
    fn junk_and_over_long_lines_are_skipped_with_a_cause() {
        assert_eq!(parse_record("no timestamp at all"), Err(Skipped::Malformed));
        assert_eq!(parse_record("x,1,2,-;text"), Err(Skipped::Malformed));
        assert_eq!(parse_record("6,1;text"), Err(Skipped::Malformed));
        assert_eq!(parse_record("[12.34] short fraction"), Err(Skipped::Malformed));
        assert_eq!(
            parse_record("[99999999999999999999.000000] huge"),
            Err(Skipped::Malformed)
        );
        assert_eq!(parse_record("[12.000001"), Err(Skipped::Malformed));
        let long = format!(
            "3,1,2,-;NVRM: Xid (PCI:0000:3b:00): 79, {}",
            "x".repeat(MAX_RECORD_BYTES)
        );
        assert_eq!(parse_record(&long), Err(Skipped::TooLong));
    }

    #[test]
    fn an_xid_line_gives_the_drivers_fields() {
        assert_eq!(
            xid("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."),
            KernelXid {
                pci: PciDevice {
                    domain: 0,
                    bus: 0x3b,
                    device: 0
                },
                gpu_instance: None,
                compute_instance: None,
                xid: 79,
                pid: Some("1234".to_owned()),
                process: None,
                detail: "GPU has fallen off the bus.".to_owned(),
            }
        );
        let named = xid(
            "NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
        );
        assert_eq!(named.xid, 109);
        assert_eq!(named.process.as_deref(), Some("pt_main_thread"));
        assert_eq!(
            named.detail,
            "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005"
        );
        let unknown = xid(
            "NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception",
        );
        assert_eq!(unknown.pid.as_deref(), Some("<unknown>"));
        let old =
            xid("NVRM: Xid (PCI:0000:01:00): 48, An uncorrectable double bit error (DBE) has been detected");
        assert_eq!((old.xid, old.pid, old.process), (48, None, None));
        assert_eq!(xid("NVRM: Xid (PCI:0000:01:00): 62").xid, 62, "no detail");
    }

    #[test]
    fn a_mig_xid_names_its_gpu_and_compute_instance() {
        let mig = xid(
            "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
        );
        assert_eq!(
            (mig.gpu_instance, mig.compute_instance, mig.xid),
            (Some(5), None, 94)
        );
        let both =
            xid("NVRM: Xid (PCI:0000:3b:00 GPU-I:04 GPU-CI:02): 43, pid=3123, name=python3, Ch 00000010");
        assert_eq!((both.gpu_instance, both.compute_instance), (Some(4), Some(2)));
        assert_eq!(both.pci.to_string(), "0000:3b:00");
    }

    #[test]
    fn other_lines_are_not_xids_and_broken_xid_lines_are_refused() {
        assert_eq!(
            parse_xid("NVRM: GPU at PCI:0000:18:00.0 has fallen off the bus."),
            Ok(None)
        );
        assert_eq!(parse_xid("usb 1-1: new device"), Ok(None));
        for broken in [
            "NVRM: Xid (PCI:0000:3b:00) 79, no colon",
            "NVRM: Xid (PCI:zz:3b:00): 79, bad domain",
            "NVRM: Xid (0000:3b:00): 79, no PCI tag",
            "NVRM: Xid (PCI:0000:3b:00 GPU-I:x): 79, bad instance",
            "NVRM: Xid (PCI:0000:3b:00 junk): 79, unknown word",
            "NVRM: Xid (PCI:0000:3b:00): seventy-nine, not a number",
            "NVRM: Xid (PCI:0000:3b",
        ] {
            assert_eq!(parse_xid(broken), Err(Skipped::Malformed), "{broken}");
        }
    }

    #[test]
    fn the_driver_and_nvml_spell_one_pci_device_alike() {
        assert_eq!(
            PciDevice::parse("0000:3b:00"),
            PciDevice::parse("00000000:3B:00.0")
        );
        assert_eq!(PciDevice::parse("0000:3b"), None);
        assert_eq!(PciDevice::parse("0000:3b:00:1"), None);
        assert_eq!(PciDevice::parse("000000000:3b:00"), None);
    }
}
