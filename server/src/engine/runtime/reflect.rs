//! What a finished turn leaves behind in the seat's memory — the
//! conversation ledger and counterparty profiles (each keyed, so a re-run
//! writes nothing twice) and a wake on the seat's own reflect subject —
//! and the reflection that wake runs: the agent's note, written to its
//! diary.

use crate::engine::agent::TurnInput;
use crate::engine::runtime::TurnEngine;
use crate::queue::{Delivery, Disposition, reflect_subject};

impl TurnEngine {
    /// A reflection wake: the agent's note on the turn it names goes to
    /// the seat's diary (a failed write comes again; a failed reflection
    /// is dropped).
    pub(super) async fn reflect(&self, handle: &str, d: Delivery) -> Disposition {
        let wake: serde_json::Value = match serde_json::from_slice(&d.payload) {
            Ok(v) => v,
            Err(e) => return Disposition::Poison(format!("not a reflection wake: {e}")),
        };
        let Some(rt) = self.runtime(handle) else {
            return Disposition::Nak;
        };
        let work_key = wake
            .get("work_key")
            .and_then(|v| v.as_str())
            .map(str::to_string);
        match rt.agent.reflect(&wake).await {
            Ok(Some(note)) => match self
                .tools
                .memory
                .diary_write(handle, &note, work_key.as_deref())
                .await
            {
                Ok(_) => Disposition::Ack,
                Err(e) => {
                    tracing::warn!(seat = handle, error = %e, "cannot write the reflection; trying again");
                    Disposition::Nak
                }
            },
            Ok(None) => Disposition::Ack,
            Err(e) => {
                tracing::warn!(seat = handle, error = %e, "reflection failed; dropped");
                Disposition::Ack
            }
        }
    }

    /// After a finished turn: the conversation ledger and counterparty
    /// profiles (both keyed so a re-run writes nothing twice), and a
    /// reflection wake on the seat's own reflect subject.
    pub(super) async fn after_turn(&self, turn: &TurnInput) {
        let memory = &self.tools.memory;
        for t in &turn.triggers {
            if let Some(thread) = &t.thread {
                let text = match &t.body {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let key = crate::engine::envelope::conversation_key(t.from.as_deref(), thread);
                if let Err(e) = memory
                    .conversation_add(
                        &turn.seat,
                        &key,
                        t.message_id.as_deref(),
                        t.from.as_deref().unwrap_or("unknown"),
                        &text,
                    )
                    .await
                {
                    tracing::warn!(seat = %turn.seat, error = %e, "cannot write the conversation ledger");
                }
            }
            if let Some(from) = &t.from
                && let Err(e) = memory
                    .counterparty_seen(&turn.seat, from, turn.work_key.as_deref())
                    .await
            {
                tracing::warn!(seat = %turn.seat, error = %e, "cannot count the interaction");
            }
        }
        let wake = serde_json::json!({
            "type": "reflection_due",
            "turn_id": turn.turn_id,
            "work_key": turn.work_key,
            "trigger_ids": turn.triggers.iter().map(|t| t.id.clone()).collect::<Vec<_>>(),
        });
        if let Err(e) = self
            .queue
            .publish(
                &reflect_subject(&turn.seat),
                Some(&format!("reflect-{}", turn.turn_id)),
                bytes::Bytes::from(wake.to_string()),
            )
            .await
        {
            tracing::warn!(seat = %turn.seat, error = %e, "cannot wake the seat's reflection");
        }
    }
}
