//! Logging setup shared by the binaries (`tessera`, `tessera-node`): the format flag, the
//! subscriber, and how a fatal error is told.

use std::process::ExitCode;

/// Log lines as plain text or as one JSON object per line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Logs go to stderr; `RUST_LOG` (or `TESSERA_LOG`) sets the filter. Text has ANSI
/// colour only when stderr is a terminal and `NO_COLOR` is unset (`kubectl logs` shows
/// escape codes verbatim); JSON is one object per line.
pub fn init(default_level: &str, format: LogFormat) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let (filter, refused) =
        match std::env::var("RUST_LOG").or_else(|_| std::env::var("TESSERA_LOG")) {
            Ok(v) => match EnvFilter::try_new(v) {
                Ok(f) => (f, None),
                Err(e) => (EnvFilter::new(default_level), Some(e.to_string())),
            },
            Err(_) => (EnvFilter::new(default_level), None),
        };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => {
            let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            builder.with_ansi(colour).init()
        }
    }
    if let Some(reason) = refused {
        tracing::warn!(%reason, level = default_level, "RUST_LOG/TESSERA_LOG not understood; logging at the default level");
    }
}

/// The exit code for a command's result; an error is told as its whole cause chain on one
/// line, no backtrace (these are user errors): plain on stderr, or a JSON log line.
pub fn exit_code(result: anyhow::Result<()>, format: LogFormat) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            match format {
                LogFormat::Text => eprintln!("error: {e:#}"),
                LogFormat::Json => tracing::error!(error = %format!("{e:#}"), "exiting"),
            }
            ExitCode::FAILURE
        }
    }
}
