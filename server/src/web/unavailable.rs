//! The sentence a person reads when something the node depends on failed
//! (the details go to the node's log, never to the page).

use app::console::ConsoleError;

/// `Unavailable`, saying the node could not do `what`; `e` is logged.
pub fn unavailable(what: &str, e: impl std::fmt::Display) -> ConsoleError {
    tracing::error!(error = %e, "{what}");
    ConsoleError::Unavailable(format!(
        "The node could not {what}. Try again; the node's log has the details."
    ))
}
