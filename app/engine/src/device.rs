//! Choosing the compute device. CPU is always there; CUDA and Metal need the matching cargo
//! feature and hardware, and an unavailable device falls back to the CPU with a note.

pub use candle_core::Device;
use serde::{Deserialize, Serialize};

/// The device a user asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    /// The CPU (default).
    #[default]
    Cpu,
    /// The first CUDA GPU.
    Cuda,
    /// The Metal GPU (macOS).
    Metal,
}

impl DeviceChoice {
    /// Parses `cpu`, `cuda`, `metal`.
    pub fn parse(s: &str) -> Option<DeviceChoice> {
        match s.to_ascii_lowercase().as_str() {
            "cpu" => Some(DeviceChoice::Cpu),
            "cuda" | "gpu" => Some(DeviceChoice::Cuda),
            "metal" => Some(DeviceChoice::Metal),
            _ => None,
        }
    }
}

/// Opens the device; returns the device and, when it fell back to the CPU, why.
pub fn open_device(choice: DeviceChoice) -> (Device, Option<String>) {
    match choice {
        DeviceChoice::Cpu => (Device::Cpu, None),
        DeviceChoice::Cuda => {
            if !cfg!(feature = "cuda") {
                return (
                    Device::Cpu,
                    Some("this build has no CUDA support (build with `--features cuda`); running on the CPU".into()),
                );
            }
            match Device::new_cuda(0) {
                Ok(d) => (d, None),
                Err(e) => (
                    Device::Cpu,
                    Some(format!(
                        "no usable CUDA device ({}); running on the CPU",
                        first_line(&e)
                    )),
                ),
            }
        }
        DeviceChoice::Metal => {
            if !cfg!(feature = "metal") {
                return (
                    Device::Cpu,
                    Some("this build has no Metal support (build with `--features metal`); running on the CPU".into()),
                );
            }
            match Device::new_metal(0) {
                Ok(d) => (d, None),
                Err(e) => (
                    Device::Cpu,
                    Some(format!(
                        "no usable Metal device ({}); running on the CPU",
                        first_line(&e)
                    )),
                ),
            }
        }
    }
}

/// The first line of an error: candle appends a backtrace when `RUST_BACKTRACE` is set, which
/// a one-line note should not carry.
fn first_line(e: &candle_core::Error) -> String {
    e.to_string().lines().next().unwrap_or_default().trim_end().to_owned()
}

/// A short name of a device for reports.
pub fn device_name(d: &Device) -> &'static str {
    match d {
        Device::Cpu => "cpu",
        Device::Cuda(_) => "cuda",
        Device::Metal(_) => "metal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fallback_note_is_one_line_even_with_a_backtrace() {
        let e = candle_core::Error::Msg("no driver".into()).bt();
        let shown = e.to_string();
        assert_eq!(first_line(&e), "no driver", "{shown:?}");
    }
}
