//! The typed error every server function returns.
//!
//! Pages show these as sentences; nothing stringified from the node's
//! internals reaches a person.

use serde::{Deserialize, Serialize};
use server_fn::codec::JsonEncoding;
use server_fn::error::{FromServerFnError, ServerFnErrorErr};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum AppError {
    #[error("You are not signed in (or your session ended). Sign in again.")]
    NotSignedIn,
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    Invalid(String),
    /// The thing asked about does not exist; the sentence names it.
    #[error("{0}")]
    NotFound(String),
    /// The thing changed since it was read; the sentence says to reload.
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Unavailable(String),
    /// The request never reached the node, or its answer could not be
    /// read. The field keeps the transport's own words for debugging; the
    /// sentence a person reads does not carry them.
    #[error(
        "The node could not be reached, or its answer could not be read. Check that it is running, then reload the page and try again."
    )]
    Transport(String),
}

impl FromServerFnError for AppError {
    type Encoder = JsonEncoding;

    fn from_server_fn_error(value: ServerFnErrorErr) -> Self {
        match value {
            ServerFnErrorErr::Args(m) | ServerFnErrorErr::MissingArg(m) => {
                AppError::Invalid(format!("The request was incomplete: {m}"))
            }
            other => AppError::Transport(other.to_string()),
        }
    }
}

#[cfg(feature = "ssr")]
impl From<crate::console::ConsoleError> for AppError {
    fn from(e: crate::console::ConsoleError) -> Self {
        use crate::console::ConsoleError;
        match e {
            ConsoleError::Invalid(m) => AppError::Invalid(m),
            ConsoleError::Forbidden(m) => AppError::Forbidden(m),
            ConsoleError::NotFound(m) => AppError::NotFound(m),
            ConsoleError::Conflict(m) => AppError::Conflict(m),
            ConsoleError::Unavailable(m) => AppError::Unavailable(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transport_failure_reads_as_a_sentence_without_the_transports_internals() {
        for e in [
            ServerFnErrorErr::Request(
                "TypeError: NetworkError when attempting to fetch resource.".into(),
            ),
            ServerFnErrorErr::Deserialization("expected value at line 1 column 1".into()),
            ServerFnErrorErr::ServerError("hyper::Error(IncompleteMessage)".into()),
        ] {
            let shown = AppError::from_server_fn_error(e.clone()).to_string();
            assert!(
                shown.starts_with("The node could not be reached"),
                "{shown}"
            );
            for internal in ["TypeError", "expected value", "hyper"] {
                assert!(
                    !shown.contains(internal),
                    "{e:?} shows {internal:?}: {shown}"
                );
            }
        }
        // An incomplete request still says what was missing.
        let shown = AppError::from_server_fn_error(ServerFnErrorErr::MissingArg("handle".into()))
            .to_string();
        assert_eq!(shown, "The request was incomplete: handle");
    }
}
