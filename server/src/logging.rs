//! Log output: pretty or JSON lines, to stderr and/or a file, filtered by
//! `RUST_LOG` (default `info`, with the libraries' routine chatter left
//! out). Colour only when stderr is a terminal: redirected output and
//! files carry plain text.
//!
//! Lines are written by a thread of their own, never by the runtime's
//! workers: a write that blocks (a pipe nobody drains, a disk that throttles
//! writers) then holds the log thread, not every loop of the node — a node
//! whose workers all sat in `write(2)` for seconds would miss its
//! heartbeats and leave its seats. Nothing is dropped: when the thread is
//! behind by [`LOG_BUFFER_LINES`] lines, the next line waits for room.
//!
//! Secrets never reach a log line: the config is only ever logged redacted,
//! and passwords and tokens are never passed to a tracing macro.

use std::fs::OpenOptions;

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

/// How many lines may wait for the log thread before a line waits for it.
pub const LOG_BUFFER_LINES: usize = 128_000;

/// Keeps the log threads running; dropping it writes out every line still
/// waiting. Hold it until the process ends.
#[must_use = "dropping the guard stops the log threads"]
pub struct LogGuard {
    _guards: Vec<tracing_appender::non_blocking::WorkerGuard>,
}

/// `writer` behind a log thread of its own (thread named `name`).
fn on_own_thread<W: std::io::Write + Send + 'static>(
    writer: W,
    name: &str,
    guards: &mut Vec<tracing_appender::non_blocking::WorkerGuard>,
) -> tracing_appender::non_blocking::NonBlocking {
    let (w, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .buffered_lines_limit(LOG_BUFFER_LINES)
        .thread_name(name)
        .finish(writer);
    guards.push(guard);
    w
}

/// Install the process-wide logger.
pub fn init(cfg: &LoggingSection) -> Result<LogGuard, LoggingError> {
    let filter =
        || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let json = cfg.format == LogFormat::Json;
    let mut guards = Vec::new();
    let stderr_layer = cfg.stderr.then(|| {
        let w = on_own_thread(std::io::stderr(), "crewlet-log-stderr", &mut guards);
        let l = tracing_subscriber::fmt::layer()
            .with_writer(w)
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
            let w = on_own_thread(f, "crewlet-log-file", &mut guards);
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
        .map_err(|_| LoggingError::AlreadySet)?;
    Ok(LogGuard { _guards: guards })
}

/// What `f` logs at debug level, as plain text (tests that assert a log
/// line's fields).
#[cfg(test)]
pub(crate) fn logged(f: impl FnOnce()) -> String {
    #[derive(Clone, Default)]
    struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let out = buf.clone();
    let sub = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || out.clone())
        .finish();
    // tracing keeps each callsite's interest process-wide, decided by the
    // first thread to reach it; while one dispatcher is registered it asks
    // that thread's own default, and a sibling test's thread has none — the
    // callsite is then off everywhere and this capture comes back empty
    // (the delivery-trace test, beside the loop tests that trace too). A
    // second registered dispatcher, inert, makes every registration ask
    // all live dispatchers, this one included; the rebuild mends a
    // callsite reached before the capture began.
    let anchor = tracing::Dispatch::new(tracing_subscriber::registry());
    let capture = tracing::Dispatch::new(sub);
    tracing::callsite::rebuild_interest_cache();
    tracing::dispatcher::with_default(&capture, f);
    drop(anchor);
    String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
}
