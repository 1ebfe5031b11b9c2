//! The controller's configuration file (`tessera controller --config FILE`): Kueue's
//! manager `Configuration`, parsed by the engine's own reader
//! ([`crate::quota::kueue_config`]), shared with `tessera plan`.

pub use crate::quota::kueue_config::{ConfigError, KueueConfig as ControllerConfig};
