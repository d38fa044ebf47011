//! Applying a company (admins only): the file parsed off the async
//! workers, one file at a time, every role judged against this node's
//! policy, the result audited either way.

use app::api::Person;
use app::console::ConsoleError;

use crate::web::unavailable::unavailable;

use super::NodeConsole;

pub(super) async fn apply(
    c: &NodeConsole,
    actor: &Person,
    company_toml: &str,
) -> Result<u64, ConsoleError> {
    c.admit_admin(actor, "company.apply", "", "apply a company")
        .await?;
    let _one_at_a_time = c.applying.lock().await;
    // Parsing a large file is CPU work: off the async workers, so the
    // node keeps answering meanwhile.
    let text = company_toml.to_string();
    let environment = c.environment;
    let policy = c.policy.clone();
    let parsed = tokio::task::spawn_blocking(move || {
        crate::config::Config::parse_applied(
            "the applied company file",
            &text,
            environment,
            &policy,
        )
    })
    .await
    .map_err(|e| unavailable("read the company file", e))?;
    let config = match parsed {
        Ok(c) => c,
        Err(e) => {
            c.audited(actor, "company.apply", None, "refused: invalid file")
                .await?;
            return Err(ConsoleError::Invalid(e.to_string()));
        }
    };
    judge(c, actor, &config.roles).await?;
    let store = c.engine.store().clone();
    match crate::company::apply_company(&*store, &config.company, &config.roles, &config.schedules)
        .await
    {
        Ok(revision) => {
            let reason = format!("revision {revision}: {} seats", config.roles.len());
            c.audited(actor, "company.apply", Some(&reason), "ok")
                .await?;
            Ok(revision)
        }
        Err(e) => {
            c.audited(actor, "company.apply", None, "failed: store unavailable")
                .await?;
            Err(unavailable("apply the company", e))
        }
    }
}

/// Judge every role of a company being applied against this node's own
/// policy (programs found on this node): `Err` is the refusal a person
/// reads — every role and program named, nothing applied, the refusal
/// audited.
async fn judge(
    c: &NodeConsole,
    actor: &Person,
    roles: &[crate::config::RoleConfig],
) -> Result<(), ConsoleError> {
    let policy = c.policy.clone();
    let roles = roles.to_vec();
    let problems = tokio::task::spawn_blocking(move || {
        roles
            .iter()
            .flat_map(|r| policy.judge_role(r, &crate::config::programs::find_on_node))
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| unavailable("judge the company", e))?;
    if problems.is_empty() {
        return Ok(());
    }
    let shown = problems
        .iter()
        .take(10)
        .map(|p| format!("- {p}"))
        .collect::<Vec<_>>()
        .join("\n");
    let more = match problems.len() {
        n if n > 10 => format!("\n… and {} more", n - 10),
        _ => String::new(),
    };
    let first: String = problems[0].chars().take(300).collect();
    c.audited(
        actor,
        "company.apply",
        Some(&first),
        "refused: the node does not allow what the company asks",
    )
    .await?;
    Err(ConsoleError::Forbidden(format!(
        "This node does not allow what the company asks, so nothing was applied:\n{shown}{more}"
    )))
}
