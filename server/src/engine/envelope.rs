//! The inbox envelope: the JSON users' systems publish to
//! `crewlet.agent.{handle}.inbox` (docs/mail-and-turns.md § The inbox envelope).
//!
//! `id` is the event id (the completion ledger's key), `type` says what it
//! is, `body` is free JSON; `thread` and `message_id` are the chat identity
//! a later turn may answer; `from` and `sent_at` say who and when. Decoding
//! is strict about the fields it needs and ignores the ones it does not
//! know; anything that does not decode is poison — dead-lettered at once,
//! never retried. This module does no I/O.

use serde::{Deserialize, Serialize};

/// The trigger types that run a turn and are consulted in, and recorded
/// to, the completion ledger (spec § The completion ledger). The set is
/// closed: any other type contributes nothing to the work key.
pub const LEDGERED: [&str; 4] = [
    "task_assigned",
    "external_notification",
    "a2a_request",
    "a2a_message",
];

/// The engine's own continuation types: a detached run's completion and a
/// person's answer to an approval, which the engine itself hands to a
/// seat's inbox. Nobody else may send them (docs/security.md § Security model): the
/// HTTP inbox and a schedule refuse them, and one arriving on the stream is
/// believed only as far as its run's or approval's own record goes.
pub const ENGINE_TYPES: [&str; 2] = crate::config::ENGINE_MAIL_TYPES;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub body: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_at: Option<String>,
}

/// Why a payload is not an envelope.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("not an envelope: {0}")]
    Json(String),
    #[error("`{0}` must not be empty")]
    Empty(&'static str),
    #[error("`id` {0:?} is too long (at most 256 bytes)")]
    IdTooLong(String),
    #[error(
        "`{0}` must be printable ASCII with no spaces (letters, digits and punctuation; `type` at most 64 of them)"
    )]
    NotPrintable(&'static str),
}

/// Pure: the key a conversation is kept under: its sender with the thread
/// the sender named, so one sender's `thread` never writes into, or reads
/// from, another's (the sender is quoted: no pair of sender and thread
/// makes another pair's key).
pub fn conversation_key(from: Option<&str>, thread: &str) -> String {
    format!("{:?}/{thread}", from.unwrap_or("unknown"))
}

/// Pure: every byte is printable ASCII other than a space.
fn printable(s: &str) -> bool {
    s.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

impl Envelope {
    /// Decode one inbox payload.
    pub fn decode(payload: &[u8]) -> Result<Envelope, EnvelopeError> {
        let e: Envelope =
            serde_json::from_slice(payload).map_err(|err| EnvelopeError::Json(err.to_string()))?;
        e.check()?;
        Ok(e)
    }

    /// The checks a decoded (or about to be published) envelope must pass.
    pub fn check(&self) -> Result<(), EnvelopeError> {
        if self.id.trim().is_empty() {
            return Err(EnvelopeError::Empty("id"));
        }
        if self.id.len() > 256 {
            return Err(EnvelopeError::IdTooLong(self.id.chars().take(40).collect()));
        }
        if !printable(&self.id) {
            return Err(EnvelopeError::NotPrintable("id"));
        }
        if self.kind.trim().is_empty() {
            return Err(EnvelopeError::Empty("type"));
        }
        if self.kind.len() > 64 || !printable(&self.kind) {
            return Err(EnvelopeError::NotPrintable("type"));
        }
        Ok(())
    }

    /// Is this one of the engine's own continuation types?
    pub fn is_engines(&self) -> bool {
        ENGINE_TYPES.contains(&self.kind.as_str())
    }

    /// Does this type run a turn (and go through the ledger)?
    pub fn is_ledgered(&self) -> bool {
        LEDGERED.contains(&self.kind.as_str())
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_envelope_round_trips_and_unknown_fields_are_ignored() {
        let raw = br#"{"id":"evt-1","type":"task_assigned","body":{"title":"x"},"thread":"t","message_id":"m","from":"alice","sent_at":"2026-11-30T07:00:00Z","extra":1}"#;
        let e = Envelope::decode(raw).unwrap();
        assert_eq!(e.id, "evt-1");
        assert!(e.is_ledgered());
        assert_eq!(Envelope::decode(&e.encode()).unwrap(), e);
    }

    #[test]
    fn an_id_or_type_with_control_bytes_or_spaces_is_refused_naming_the_field() {
        for (raw, field) in [
            (r#"{"id":"a\r\nb","type":"task_assigned"}"#, "id"),
            (r#"{"id":"a\u0000b","type":"task_assigned"}"#, "id"),
            (r#"{"id":"a b","type":"task_assigned"}"#, "id"),
            (r#"{"id":"é","type":"task_assigned"}"#, "id"),
            (r#"{"id":"ok","type":"task\nassigned"}"#, "type"),
        ] {
            match Envelope::decode(raw.as_bytes()) {
                Err(EnvelopeError::NotPrintable(f)) => assert_eq!(f, field, "{raw}"),
                other => panic!("{raw}: {other:?}"),
            }
        }
        assert!(Envelope::decode(br#"{"id":"evt-1:x/y","type":"task_assigned"}"#).is_ok());
    }

    #[test]
    fn what_does_not_decode_is_poison_with_a_reason() {
        assert!(matches!(
            Envelope::decode(b"{not json"),
            Err(EnvelopeError::Json(_))
        ));
        assert!(matches!(
            Envelope::decode(br#"{"type":"task_assigned"}"#),
            Err(EnvelopeError::Json(m)) if m.contains("id")
        ));
        assert_eq!(
            Envelope::decode(br#"{"id":" ","type":"x"}"#),
            Err(EnvelopeError::Empty("id"))
        );
        assert_eq!(
            Envelope::decode(br#"{"id":"a","type":""}"#),
            Err(EnvelopeError::Empty("type"))
        );
    }

    #[test]
    fn only_the_four_turn_types_are_ledgered() {
        for (kind, ledgered) in [
            ("task_assigned", true),
            ("external_notification", true),
            ("a2a_request", true),
            ("a2a_message", true),
            ("observability", false),
            ("reflection_due", false),
        ] {
            let e = Envelope {
                id: "i".into(),
                kind: kind.into(),
                body: serde_json::Value::Null,
                thread: None,
                message_id: None,
                from: None,
                sent_at: None,
            };
            assert_eq!(e.is_ledgered(), ledgered, "{kind}");
        }
    }
}
