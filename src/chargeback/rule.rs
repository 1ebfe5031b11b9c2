//! The charging rule: what fraction of one GPU a device is charged as while a container
//! holds it. Pure, and the only place the rule is written (docs/chargeback.md, "The rule").
//!
//! | mode | device | charged share of its GPU |
//! |---|---|---|
//! | `whole` | a whole GPU | 1 |
//! | `mig` | a MIG device of `c` compute slices on a GPU of `C` | `c / C` (1g.10gb on an A100: 1/7) |
//! | `timeslice` | one of `r` time-sliced replicas | `1 / r` |
//! | `vgpu` | a slice of `m` MiB and `s` % of the SMs on a GPU of `M` MiB | `max(m / M, s / 100)` |
//!
//! A vGPU slice pays for the larger of its two claims because either one keeps the rest
//! of the GPU from being sold: 40 GiB of an 80 GiB GPU at 10 % of the SMs costs half a
//! GPU, and so does 8 GiB at 50 %. A MIG device pays for its compute slices, not its
//! memory slices, because compute slices are what a MIG layout runs out of first.
//! Every share is in (0, 1]; a device that would be charged nothing or more than its GPU
//! is a [`RuleError`], never a silent 0 or a share above 1.
//!
//! Used GPU-seconds are the allocated ones times the device's busy fraction: the GPU's
//! utilization (whole, time-sliced), the slice's SM use (vGPU), the GPU instance's GPM
//! activity (MIG, Hopper and later). A MIG device the driver cannot measure (before
//! Hopper) is charged allocated GPU-seconds and no used ones: its used counter is left
//! absent, so reports say `n/a` for it (`crate::metrics::usage`).

use std::fmt;

/// How a GPU is shared (the `mode` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    Whole,
    Mig,
    Timeslice,
    Vgpu,
}

impl Mode {
    pub const ALL: [Mode; 4] = [Mode::Whole, Mode::Mig, Mode::Timeslice, Mode::Vgpu];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Whole => "whole",
            Mode::Mig => "mig",
            Mode::Timeslice => "timeslice",
            Mode::Vgpu => "vgpu",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a container holds on one GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Slice {
    Whole,
    /// A MIG device: its compute slices and the GPU's (7 on A100/H100).
    Mig {
        compute_slices: u32,
        gpu_compute_slices: u32,
    },
    /// One of `replicas` time-sliced replicas of a GPU.
    Timeslice {
        replicas: u32,
    },
    /// A vGPU slice: its memory and SM limits against the GPU's memory.
    Vgpu {
        memory_mib: u64,
        gpu_memory_mib: u64,
        cores_percent: u32,
    },
}

/// A device the rule cannot charge.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RuleError {
    #[error("a MIG device of {compute_slices} compute slices on a GPU of {gpu_compute_slices}: need 1 ≤ slices ≤ the GPU's")]
    Mig {
        compute_slices: u32,
        gpu_compute_slices: u32,
    },
    #[error("a time-sliced GPU needs at least 1 replica")]
    NoReplicas,
    #[error("a vGPU slice of {memory_mib} MiB and {cores_percent} % SMs on a GPU of {gpu_memory_mib} MiB: need memory ≤ the GPU's, SMs ≤ 100 %, and one of them above 0")]
    Vgpu {
        memory_mib: u64,
        gpu_memory_mib: u64,
        cores_percent: u32,
    },
}

impl Slice {
    pub fn mode(&self) -> Mode {
        match self {
            Slice::Whole => Mode::Whole,
            Slice::Mig { .. } => Mode::Mig,
            Slice::Timeslice { .. } => Mode::Timeslice,
            Slice::Vgpu { .. } => Mode::Vgpu,
        }
    }

    /// The share of one GPU this device is charged as, in (0, 1].
    pub fn share(&self) -> Result<f64, RuleError> {
        match *self {
            Slice::Whole => Ok(1.0),
            Slice::Mig {
                compute_slices,
                gpu_compute_slices,
            } => {
                if compute_slices == 0 || compute_slices > gpu_compute_slices {
                    return Err(RuleError::Mig {
                        compute_slices,
                        gpu_compute_slices,
                    });
                }
                Ok(f64::from(compute_slices) / f64::from(gpu_compute_slices))
            }
            Slice::Timeslice { replicas } => match replicas {
                0 => Err(RuleError::NoReplicas),
                r => Ok(1.0 / f64::from(r)),
            },
            Slice::Vgpu {
                memory_mib,
                gpu_memory_mib,
                cores_percent,
            } => {
                let bad = memory_mib > gpu_memory_mib
                    || gpu_memory_mib == 0
                    || cores_percent > 100
                    || (memory_mib == 0 && cores_percent == 0);
                if bad {
                    return Err(RuleError::Vgpu {
                        memory_mib,
                        gpu_memory_mib,
                        cores_percent,
                    });
                }
                let memory = memory_mib as f64 / gpu_memory_mib as f64;
                let cores = f64::from(cores_percent) / 100.0;
                Ok(memory.max(cores))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mode_is_charged_its_documented_share() {
        let mig = |c, g| Slice::Mig {
            compute_slices: c,
            gpu_compute_slices: g,
        };
        let vgpu = |m, g, s| Slice::Vgpu {
            memory_mib: m,
            gpu_memory_mib: g,
            cores_percent: s,
        };
        let cases = [
            (Slice::Whole, 1.0),
            (mig(1, 7), 1.0 / 7.0),
            (mig(3, 7), 3.0 / 7.0),
            (mig(7, 7), 1.0),
            (Slice::Timeslice { replicas: 1 }, 1.0),
            (Slice::Timeslice { replicas: 4 }, 0.25),
            // memory dominates, SMs dominate, equal, SMs only, memory only
            (vgpu(40_960, 81_920, 10), 0.5),
            (vgpu(8_192, 81_920, 50), 0.5),
            (vgpu(20_480, 81_920, 25), 0.25),
            (vgpu(0, 81_920, 30), 0.3),
            (vgpu(81_920, 81_920, 0), 1.0),
        ];
        for (slice, want) in cases {
            let got = slice.share().unwrap();
            assert!((got - want).abs() < 1e-12, "{slice:?}: {got} ≠ {want}");
            assert!(got > 0.0 && got <= 1.0);
        }
        assert_eq!(mig(1, 7).mode(), Mode::Mig);
        assert_eq!(vgpu(1, 2, 3).mode().as_str(), "vgpu");
    }

    #[test]
    fn a_device_charged_nothing_or_more_than_its_gpu_is_refused() {
        let refused = [
            Slice::Mig {
                compute_slices: 0,
                gpu_compute_slices: 7,
            },
            Slice::Mig {
                compute_slices: 8,
                gpu_compute_slices: 7,
            },
            Slice::Timeslice { replicas: 0 },
            Slice::Vgpu {
                memory_mib: 0,
                gpu_memory_mib: 81_920,
                cores_percent: 0,
            },
            Slice::Vgpu {
                memory_mib: 90_000,
                gpu_memory_mib: 81_920,
                cores_percent: 10,
            },
            Slice::Vgpu {
                memory_mib: 1,
                gpu_memory_mib: 81_920,
                cores_percent: 101,
            },
            Slice::Vgpu {
                memory_mib: 1,
                gpu_memory_mib: 0,
                cores_percent: 10,
            },
        ];
        for slice in refused {
            assert!(slice.share().is_err(), "{slice:?}");
        }
    }
}
