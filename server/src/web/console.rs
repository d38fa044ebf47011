//! The node's answer to what the dashboard asks ([`Console`]).
//!
//! Every method that changes anything checks the acting person's role
//! again (the server functions check too) and writes an audit row with the
//! result, refused or not.

use std::sync::Arc;

use sqlx::SqlitePool;

use app::api::{AuditEntry, FleetView, NewPerson, Person, PersonRole, PersonView};
use app::console::{Console, ConsoleError};

use crate::audit;
use crate::config::CoordinationType;
use crate::node::NodeInfo;
use crate::node::fleet::read_fleet;
use crate::seat::sweep::SeatEngine;
use crate::web::auth::Auth;

pub struct NodeConsole {
    info: Arc<NodeInfo>,
    pool: SqlitePool,
    auth: Arc<Auth>,
    engine: Arc<SeatEngine>,
}

impl NodeConsole {
    pub fn new(
        info: Arc<NodeInfo>,
        pool: SqlitePool,
        auth: Arc<Auth>,
        engine: Arc<SeatEngine>,
    ) -> NodeConsole {
        NodeConsole {
            info,
            pool,
            auth,
            engine,
        }
    }

    async fn audited(
        &self,
        actor: &Person,
        action: &str,
        reason: Option<&str>,
        result: &str,
    ) -> Result<(), ConsoleError> {
        audit::record(&self.pool, &actor.name, action, None, reason, result)
            .await
            .map_err(|e| {
                tracing::error!(error = %e, "cannot write the audit log");
                ConsoleError::Unavailable(
                    "The audit log cannot be written, so nothing was done.".into(),
                )
            })
    }
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> ConsoleError {
    tracing::error!(error = %e, "{what}");
    ConsoleError::Unavailable(format!(
        "The node could not {what}. Try again; the node's log has the details."
    ))
}

#[async_trait::async_trait]
impl Console for NodeConsole {
    async fn fleet(&self) -> Result<FleetView, ConsoleError> {
        let i = &self.info;
        let coordination = match i.coordination {
            CoordinationType::Local => "local",
            CoordinationType::EmbeddedKv => "embedded-kv",
        };
        let company = self.engine.company();
        read_fleet(
            &**self.engine.store(),
            &i.node_id,
            &company.name,
            coordination,
        )
        .await
        .map_err(|e| {
            tracing::warn!(error = %e, "the roster cannot be read");
            ConsoleError::Unavailable(format!(
                "The fleet's roster cannot be read right now ({e}); node states are unknown."
            ))
        })
    }

    async fn people(&self) -> Result<Vec<PersonView>, ConsoleError> {
        self.auth
            .people()
            .await
            .map_err(|e| unavailable("read the people list", e))
    }

    async fn add_person(
        &self,
        actor: &Person,
        name: &str,
        role: PersonRole,
    ) -> Result<NewPerson, ConsoleError> {
        let name = name.trim();
        let reason = format!("{name} as {role}");
        if !actor.is_operator() {
            self.audited(
                actor,
                "add_person",
                Some(&reason),
                "refused: not an operator",
            )
            .await?;
            return Err(ConsoleError::Forbidden(format!(
                "{} is a viewer: only operators may add people.",
                actor.name
            )));
        }
        let bad = name.is_empty()
            || name.len() > 64
            || name.chars().any(|c| c.is_control() || c.is_whitespace());
        if bad {
            self.audited(actor, "add_person", Some(&reason), "refused: invalid name")
                .await?;
            return Err(ConsoleError::Invalid(
                "Name: use 1–64 characters with no spaces (for example \"alice\").".into(),
            ));
        }
        if self
            .auth
            .exists(name)
            .await
            .map_err(|e| unavailable("check the name", e))?
        {
            self.audited(actor, "add_person", Some(&reason), "refused: name taken")
                .await?;
            return Err(ConsoleError::Invalid(format!(
                "Name: {name:?} can already sign in. Pick another name."
            )));
        }
        let password = self
            .auth
            .add(name, role, &actor.name)
            .await
            .map_err(|e| unavailable("add the person", e))?;
        self.audited(actor, "add_person", Some(&reason), "ok")
            .await?;
        Ok(NewPerson {
            name: name.to_string(),
            role,
            password,
        })
    }

    async fn apply_company(&self, actor: &Person, company_toml: &str) -> Result<u64, ConsoleError> {
        if !actor.is_operator() {
            self.audited(actor, "apply_company", None, "refused: not an operator")
                .await?;
            return Err(ConsoleError::Forbidden(format!(
                "{} is a viewer: only operators may apply a company.",
                actor.name
            )));
        }
        let config = match crate::config::Config::parse(
            "the applied company file",
            company_toml,
            &Default::default(),
        ) {
            Ok(c) => c,
            Err(e) => {
                self.audited(actor, "apply_company", None, "refused: invalid file")
                    .await?;
                return Err(ConsoleError::Invalid(e.to_string()));
            }
        };
        let store = self.engine.store().clone();
        match crate::node::company::apply(&*store, &config.company.name, &config.roles).await {
            Ok(revision) => {
                let reason = format!("revision {revision}: {} seats", config.roles.len());
                self.audited(actor, "apply_company", Some(&reason), "ok")
                    .await?;
                Ok(revision)
            }
            Err(e) => {
                self.audited(actor, "apply_company", None, "failed: store unavailable")
                    .await?;
                Err(unavailable("apply the company", e))
            }
        }
    }

    async fn send_to_inbox(
        &self,
        actor: &Person,
        handle: &str,
        envelope_json: &str,
    ) -> Result<String, ConsoleError> {
        use crate::engine::envelope::Envelope;
        let refuse = |why: &str| format!("refused: {why}");
        if !actor.is_operator() {
            audit::record(
                &self.pool,
                &actor.name,
                "send",
                Some(handle),
                None,
                &refuse("not an operator"),
            )
            .await
            .map_err(|e| unavailable("write the audit log", e))?;
            return Err(ConsoleError::Forbidden(format!(
                "{} is a viewer: only operators may send to a seat's inbox.",
                actor.name
            )));
        }
        if !self.engine.company().handles().any(|h| h == handle) {
            return Err(ConsoleError::Invalid(format!(
                "seat {handle:?} is not in the active company; check the handle (GET /query/fleet lists the seats held)."
            )));
        }
        let mut value: serde_json::Value = serde_json::from_str(envelope_json)
            .map_err(|e| ConsoleError::Invalid(format!("the envelope is not JSON: {e}")))?;
        let Some(obj) = value.as_object_mut() else {
            return Err(ConsoleError::Invalid(
                "the envelope must be a JSON object with at least \"type\"".into(),
            ));
        };
        if !obj.contains_key("id") {
            let r: u64 = rand::random();
            obj.insert("id".into(), serde_json::json!(format!("evt-{r:016x}")));
        }
        obj.entry("from")
            .or_insert_with(|| serde_json::json!(actor.name));
        obj.entry("sent_at")
            .or_insert_with(|| serde_json::json!(audit::now_rfc3339()));
        let envelope: Envelope = serde_json::from_value(value)
            .map_err(|e| ConsoleError::Invalid(format!("the envelope is not valid: {e}")))?;
        envelope
            .check()
            .map_err(|e| ConsoleError::Invalid(format!("the envelope is not valid: {e}")))?;
        let fresh = self
            .engine
            .queue()
            .publish(
                &crate::queue::inbox_subject(handle),
                Some(&envelope.id),
                bytes::Bytes::from(envelope.encode()),
            )
            .await
            .map_err(|e| unavailable("publish to the inbox", e))?;
        let reason = format!("type {}, id {}", envelope.kind, envelope.id);
        let result = if fresh {
            "ok"
        } else {
            "duplicate id: not published again"
        };
        audit::record(
            &self.pool,
            &actor.name,
            "send",
            Some(handle),
            Some(&reason),
            result,
        )
        .await
        .map_err(|e| unavailable("write the audit log", e))?;
        Ok(envelope.id)
    }

    async fn audit(&self, limit: u32) -> Result<Vec<AuditEntry>, ConsoleError> {
        audit::newest(&self.pool, limit.min(1000))
            .await
            .map_err(|e| unavailable("read the audit log", e))
    }
}
