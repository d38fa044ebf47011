//! Log output: pretty or JSON lines, to stderr and/or a file, filtered by
//! `RUST_LOG` (default `info`, with the libraries' routine chatter left
//! out). Colour only when stderr is a terminal: redirected output and
//! files carry plain text.
//!
//! Secrets never reach a log line: the config is only ever logged redacted,
//! and passwords and tokens are never passed to a tracing macro.

use std::fs::OpenOptions;
use std::sync::Arc;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::{LogFormat, LoggingSection};

#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    #[error("cannot open logging.file {file}: {source}")]
    File {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("a logger is already installed")]
    AlreadySet,
}

/// The filter when `RUST_LOG` is not set: the node's lines at `info`; the
/// libraries' at `warn`, and the session library's (whose routine
/// warnings — "called delete with no session id" on an ordinary
/// sign-out — say nothing to a person) at `error`.
pub const DEFAULT_FILTER: &str =
    "info,sqlx=warn,tower_sessions=warn,tower_sessions_core=error,rmcp=warn";

/// Install the process-wide logger.
pub fn init(cfg: &LoggingSection) -> Result<(), LoggingError> {
    let filter =
        || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let json = cfg.format == LogFormat::Json;
    let stderr_layer = cfg.stderr.then(|| {
        let l = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
        if json {
            l.json().with_filter(filter()).boxed()
        } else {
            l.with_filter(filter()).boxed()
        }
    });
    let file_layer = match &cfg.file {
        Some(path) => {
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|source| LoggingError::File {
                    file: path.display().to_string(),
                    source,
                })?;
            let w = Arc::new(f);
            let l = tracing_subscriber::fmt::layer()
                .with_writer(w)
                .with_ansi(false);
            Some(if json {
                l.json().with_filter(filter()).boxed()
            } else {
                l.with_filter(filter()).boxed()
            })
        }
        None => None,
    };
    tracing_subscriber::registry()
        .with(stderr_layer)
        .with(file_layer)
        .try_init()
        .map_err(|_| LoggingError::AlreadySet)
}
