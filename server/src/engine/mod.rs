//! The turn engine: what reaches a seat's inbox ([`envelope`]), what runs a
//! turn ([`agent`]) and the completion ledger that keeps a finished trigger
//! from running twice ([`ledger`]).

pub mod agent;
pub mod approvals;
pub mod budget;
pub mod children;
pub mod command;
pub mod echo;
pub mod envelope;
pub mod ledger;
pub mod mcp;
pub mod model;
pub mod model_http;
pub mod outbox;
pub mod partition;
pub mod pause;
pub mod routing;
pub mod runs;
pub mod runtime;
pub mod tools;
pub mod turn;

/// The process-wide TLS crypto provider the engine's HTTP clients (a `url`
/// tool server, a model endpoint) need: ring, as async-nats's, installed
/// once (an earlier install, ours or another's, stands).
pub(crate) fn ensure_tls_provider() {
    static TLS: std::sync::Once = std::sync::Once::new();
    TLS.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
