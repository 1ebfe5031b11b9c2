//! Configuration: the environment contract of design.md ("Shim contract") parsed into a
//! validated [`Config`]. Pure: reads through a getter so tests need no real environment.
//!
//! Variables (HAMi-core names):
//! - `CUDA_DEVICE_MEMORY_LIMIT` (all devices) and `CUDA_DEVICE_MEMORY_LIMIT_<i>` (device `i`,
//!   wins over the global one): a size like `10240m`, `10g`, `1048576k` or plain bytes.
//! - `CUDA_DEVICE_SM_LIMIT` / `CUDA_DEVICE_SM_LIMIT_<i>`: percent of SMs, `1..=100`
//!   (`0` and `100` mean "no limit", as in HAMi-core).
//! - `CUDA_DEVICE_MEMORY_SHARED_CACHE`: path of the per-container accounting file.
//! - `TESSERA_CORE_POLICY`: `default` | `force` | `disable`.
//! - `TESSERA_LOG`: `off` | `error` | `warn` | `info` | `debug`.

use std::path::PathBuf;

/// Most devices the shim tracks; a process seeing more refuses to start (fail closed).
pub const MAX_DEVICES: usize = 16;

/// Errors from parsing the environment. Each names the variable and the bad value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("{var}={value:?}: not a size (expected e.g. 10240m, 10g, 1048576k or bytes)")]
    BadSize { var: String, value: String },
    #[error("{var}={value:?}: size must be greater than zero")]
    ZeroSize { var: String, value: String },
    #[error("{var}={value:?}: not a percentage (expected an integer 0..=100)")]
    BadPercent { var: String, value: String },
    #[error("{var}: device index {index} is beyond the {max} devices the shim tracks")]
    BadIndex {
        var: String,
        index: String,
        max: usize,
    },
    #[error("TESSERA_CORE_POLICY={0:?}: expected default, force or disable")]
    BadPolicy(String),
    #[error("TESSERA_LOG={0:?}: expected off, error, warn, info or debug")]
    BadLogLevel(String),
    #[error("CUDA_DEVICE_MEMORY_SHARED_CACHE is set but empty")]
    EmptyCachePath,
}

pub type Result<T> = std::result::Result<T, Error>;

/// When the SM limit applies (design.md: `TESSERA_CORE_POLICY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CorePolicy {
    /// Limit always applies, whether or not other pods share the GPU.
    #[default]
    Default,
    /// Same as `Default`; accepted for HAMi compatibility (`GPU_CORE_UTILIZATION_POLICY=force`).
    Force,
    /// Never throttle, even with a limit set.
    Disable,
}

/// Log verbosity for the shim's stderr messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum LogLevel {
    Off,
    Error,
    #[default]
    Warn,
    Info,
    Debug,
}

/// Limits for one visible device (CUDA ordinal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceLimits {
    /// Memory limit in bytes; `None` = unlimited.
    pub memory: Option<u64>,
    /// SM limit in percent (1..=99); `None` = unlimited.
    pub sm_percent: Option<u8>,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Config {
    pub devices: [DeviceLimits; MAX_DEVICES],
    pub shared_cache: Option<PathBuf>,
    pub core_policy: CorePolicy,
    pub log_level: LogLevel,
}

impl Config {
    /// Parse from the process environment.
    pub fn from_env() -> Result<Config> {
        Config::parse(|k| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned()))
    }

    /// Parse from a getter (`None` = unset). Indexed variables are discovered by probing
    /// indices `0..MAX_DEVICES` plus a scan for out-of-range ones through `all_vars`.
    pub fn parse(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let mut cfg = Config {
            log_level: match get("TESSERA_LOG") {
                Some(v) => parse_log_level(&v)?,
                None => LogLevel::default(),
            },
            ..Config::default()
        };
        let global_mem = opt_size(&get, "CUDA_DEVICE_MEMORY_LIMIT")?;
        let global_sm = opt_percent(&get, "CUDA_DEVICE_SM_LIMIT")?;
        for (i, dev) in cfg.devices.iter_mut().enumerate() {
            dev.memory = opt_size(&get, &format!("CUDA_DEVICE_MEMORY_LIMIT_{i}"))?.or(global_mem);
            dev.sm_percent = opt_percent(&get, &format!("CUDA_DEVICE_SM_LIMIT_{i}"))?.or(global_sm);
        }
        cfg.shared_cache = match get("CUDA_DEVICE_MEMORY_SHARED_CACHE") {
            Some(p) if p.trim().is_empty() => return Err(Error::EmptyCachePath),
            Some(p) => Some(PathBuf::from(p)),
            None => None,
        };
        cfg.core_policy = match get("TESSERA_CORE_POLICY") {
            Some(v) => parse_policy(&v)?,
            None => CorePolicy::default(),
        };
        Ok(cfg)
    }

    /// Reject indexed variables naming devices the shim cannot track (`_16` and above),
    /// so a typo never silently leaves a device unlimited.
    pub fn check_indices<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<()> {
        for name in names {
            for prefix in ["CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_DEVICE_SM_LIMIT_"] {
                if let Some(idx) = name.strip_prefix(prefix) {
                    let ok = idx.parse::<usize>().is_ok_and(|i| i < MAX_DEVICES);
                    if !ok {
                        return Err(Error::BadIndex {
                            var: name.to_string(),
                            index: idx.to_string(),
                            max: MAX_DEVICES,
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// True when any device has a memory limit.
    pub fn any_memory_limit(&self) -> bool {
        self.devices.iter().any(|d| d.memory.is_some())
    }

    /// SM limit for `dev` after applying the core policy.
    pub fn effective_sm_limit(&self, dev: usize) -> Option<u8> {
        if self.core_policy == CorePolicy::Disable {
            return None;
        }
        self.devices.get(dev).and_then(|d| d.sm_percent)
    }
}

fn opt_size(get: &impl Fn(&str) -> Option<String>, var: &str) -> Result<Option<u64>> {
    get(var).map(|v| parse_size(var, &v)).transpose()
}

fn opt_percent(get: &impl Fn(&str) -> Option<String>, var: &str) -> Result<Option<u8>> {
    match get(var) {
        None => Ok(None),
        Some(v) => {
            let p: u8 = v.trim().parse().map_err(|_| Error::BadPercent {
                var: var.to_string(),
                value: v.clone(),
            })?;
            match p {
                0 | 100 => Ok(None),
                1..=99 => Ok(Some(p)),
                _ => Err(Error::BadPercent {
                    var: var.to_string(),
                    value: v,
                }),
            }
        }
    }
}

/// Parse a HAMi-core size: digits with an optional binary unit `k`, `m`, `g`, `t`
/// (case-insensitive, an optional trailing `i`/`b`/`ib` is accepted); no unit means bytes.
pub fn parse_size(var: &str, value: &str) -> Result<u64> {
    let bad = || Error::BadSize {
        var: var.to_string(),
        value: value.to_string(),
    };
    let v = value.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (digits, unit) = v.split_at(split);
    if digits.is_empty() {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let unit = unit.to_ascii_lowercase();
    let shift = match unit.as_str() {
        "" | "b" => 0,
        "k" | "ki" | "kb" | "kib" => 10,
        "m" | "mi" | "mb" | "mib" => 20,
        "g" | "gi" | "gb" | "gib" => 30,
        "t" | "ti" | "tb" | "tib" => 40,
        _ => return Err(bad()),
    };
    let bytes = n.checked_mul(1u64 << shift).ok_or_else(bad)?;
    if bytes == 0 {
        return Err(Error::ZeroSize {
            var: var.to_string(),
            value: value.to_string(),
        });
    }
    Ok(bytes)
}

fn parse_policy(v: &str) -> Result<CorePolicy> {
    match v.trim().to_ascii_lowercase().as_str() {
        "" | "default" => Ok(CorePolicy::Default),
        "force" => Ok(CorePolicy::Force),
        "disable" => Ok(CorePolicy::Disable),
        _ => Err(Error::BadPolicy(v.to_string())),
    }
}

fn parse_log_level(v: &str) -> Result<LogLevel> {
    match v.trim().to_ascii_lowercase().as_str() {
        "off" | "none" | "0" => Ok(LogLevel::Off),
        "error" | "1" => Ok(LogLevel::Error),
        "" | "warn" | "warning" | "2" => Ok(LogLevel::Warn),
        "info" | "3" => Ok(LogLevel::Info),
        "debug" | "trace" | "4" => Ok(LogLevel::Debug),
        _ => Err(Error::BadLogLevel(v.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> Result<Config> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::parse(|k| map.get(k).cloned())
    }

    #[test]
    fn sizes() {
        let cases: &[(&str, Option<u64>)] = &[
            ("10240m", Some(10240 << 20)),
            ("10g", Some(10 << 30)),
            ("10G", Some(10 << 30)),
            ("1048576k", Some(1 << 30)),
            ("1073741824", Some(1 << 30)),
            ("2Gi", Some(2 << 30)),
            ("512MiB", Some(512 << 20)),
            (" 1t ", Some(1 << 40)),
            ("", None),
            ("g", None),
            ("10x", None),
            ("-5m", None),
            ("1.5g", None),
            ("99999999999999999999g", None),
            ("0", None),
        ];
        for (input, want) in cases {
            assert_eq!(parse_size("V", input).ok(), *want, "input {input:?}");
        }
    }

    #[test]
    fn per_device_wins_over_global() {
        let cfg = parse(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "2g"),
            ("CUDA_DEVICE_SM_LIMIT_0", "30"),
        ])
        .unwrap();
        assert_eq!(cfg.devices[0].memory, Some(1 << 30));
        assert_eq!(cfg.devices[1].memory, Some(2 << 30));
        assert_eq!(cfg.devices[2].memory, Some(1 << 30));
        assert_eq!(cfg.devices[0].sm_percent, Some(30));
        assert_eq!(cfg.devices[1].sm_percent, None);
        assert!(cfg.any_memory_limit());
    }

    #[test]
    fn malformed_values_fail_naming_the_variable() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "CUDA_DEVICE_MEMORY_LIMIT_0",
                "ten",
                "CUDA_DEVICE_MEMORY_LIMIT_0",
            ),
            ("CUDA_DEVICE_MEMORY_LIMIT", "0m", "CUDA_DEVICE_MEMORY_LIMIT"),
            ("CUDA_DEVICE_SM_LIMIT_3", "150", "CUDA_DEVICE_SM_LIMIT_3"),
            ("CUDA_DEVICE_SM_LIMIT", "half", "CUDA_DEVICE_SM_LIMIT"),
            ("TESSERA_CORE_POLICY", "sometimes", "TESSERA_CORE_POLICY"),
            ("TESSERA_LOG", "loud", "TESSERA_LOG"),
            (
                "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                " ",
                "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            ),
        ];
        for (var, value, named) in cases {
            let err = parse(&[(var, value)]).unwrap_err();
            assert!(err.to_string().contains(named), "{var}={value}: {err}");
        }
    }

    #[test]
    fn sm_zero_and_hundred_mean_unlimited_and_policy_disable_lifts() {
        let cfg = parse(&[
            ("CUDA_DEVICE_SM_LIMIT_0", "100"),
            ("CUDA_DEVICE_SM_LIMIT_1", "0"),
        ])
        .unwrap();
        assert_eq!(cfg.effective_sm_limit(0), None);
        assert_eq!(cfg.effective_sm_limit(1), None);
        let cfg = parse(&[
            ("CUDA_DEVICE_SM_LIMIT", "40"),
            ("TESSERA_CORE_POLICY", "disable"),
        ])
        .unwrap();
        assert_eq!(cfg.effective_sm_limit(0), None);
        let cfg = parse(&[
            ("CUDA_DEVICE_SM_LIMIT", "40"),
            ("TESSERA_CORE_POLICY", "force"),
        ])
        .unwrap();
        assert_eq!(cfg.effective_sm_limit(5), Some(40));
    }

    #[test]
    fn out_of_range_indices_are_rejected() {
        assert!(Config::check_indices(["CUDA_DEVICE_MEMORY_LIMIT_15", "PATH"]).is_ok());
        assert!(Config::check_indices(["CUDA_DEVICE_MEMORY_LIMIT_16"]).is_err());
        assert!(Config::check_indices(["CUDA_DEVICE_SM_LIMIT_x"]).is_err());
    }

    #[test]
    fn defaults() {
        let cfg = parse(&[]).unwrap();
        assert!(!cfg.any_memory_limit());
        assert_eq!(cfg.log_level, LogLevel::Warn);
        assert_eq!(cfg.core_policy, CorePolicy::Default);
        assert_eq!(cfg.shared_cache, None);
    }
}
