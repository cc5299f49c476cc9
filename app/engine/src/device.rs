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
                    Some(format!("no usable CUDA device ({e}); running on the CPU")),
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
                    Some(format!("no usable Metal device ({e}); running on the CPU")),
                ),
            }
        }
    }
}

/// A short name of a device for reports.
pub fn device_name(d: &Device) -> &'static str {
    match d {
        Device::Cpu => "cpu",
        Device::Cuda(_) => "cuda",
        Device::Metal(_) => "metal",
    }
}
