//! The fleet page's answers: the roster as this node reads it, with what
//! only this node knows (its unproven seats, what it cannot place).

use app::api::FleetView;
use app::console::ConsoleError;

use crate::config::CoordinationType;
use crate::web::nodes::{LocalFacts, Roster, fleet_view};

use super::NodeConsole;

pub(super) async fn view(c: &NodeConsole) -> Result<FleetView, ConsoleError> {
    let i = &c.info;
    let coordination = match i.coordination {
        CoordinationType::Local => "local",
        CoordinationType::EmbeddedKv => "embedded-kv",
    };
    let company = c.engine.company();
    let now = chrono::Utc::now().timestamp();
    let read = Roster::read(&**c.engine.store(), now).await;
    if let Err(e) = &read {
        tracing::warn!(error = %e, "the roster cannot be read");
    }
    let answer = c.roster.answer(read).map_err(|e| {
        ConsoleError::Unavailable(format!(
            "The fleet's roster cannot be read right now ({e}); node states are unknown."
        ))
    })?;
    let mut view = fleet_view(
        &i.node_id,
        &company.name,
        coordination,
        &answer,
        &local_facts(c, now),
    );
    // A queue that cannot be counted is the queue's own alarm, not this one.
    match c.engine.queue().dead_letter_count().await {
        Ok(0) => {}
        Ok(count) => view
            .alarms
            .push(app::api::FleetAlarm::DeadLetters { count }),
        Err(e) => tracing::warn!(error = %e, "the dead letters cannot be counted"),
    }
    Ok(view)
}

/// What this node knows of the fleet besides the roster.
pub(super) fn local_facts(c: &NodeConsole, now: i64) -> LocalFacts {
    LocalFacts {
        node_id: c.info.node_id.clone(),
        protocol: c.info.protocol,
        unproven_here: c
            .engine
            .host()
            .status()
            .into_iter()
            .filter_map(|s| s.unproven_for.map(|d| (s.handle, s.epoch, d)))
            .collect(),
        unplaceable: c.engine.unplaceable(),
        claims_blocked_by: c.engine.claims_blocked_by(),
        notes: c.notes.snapshot(),
        now,
    }
}
