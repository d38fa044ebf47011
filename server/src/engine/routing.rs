//! Routing is org-derived, never instance-derived (spec § Routing): a
//! recipient's inbox subject and agent id come from the company every node
//! holds in full, never from the seats this process happens to run. A miss
//! here means "no such seat in the company", never "not on this node".

use crate::company::Company;
use crate::queue::inbox_subject;

/// Where mail for one seat goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub handle: String,
    pub inbox_subject: String,
    pub agent_id: uuid::Uuid,
}

/// The agent id of `handle` in the company `company`: a UUID v5 over the
/// company name and the handle (namespace: the OID namespace; name:
/// `{company}` NUL `{handle}`). The same on every node and every restart.
pub fn agent_id(company: &str, handle: &str) -> uuid::Uuid {
    let mut name = Vec::with_capacity(company.len() + handle.len() + 1);
    name.extend_from_slice(company.as_bytes());
    name.push(0);
    name.extend_from_slice(handle.as_bytes());
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, &name)
}

/// Resolve `handle` against the active company; `None` when the company
/// has no such seat.
pub fn resolve(company: &Company, handle: &str) -> Option<Route> {
    company.handles().any(|h| h == handle).then(|| Route {
        handle: handle.to_string(),
        inbox_subject: inbox_subject(handle),
        agent_id: agent_id(&company.name, handle),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RoleConfig;

    fn company(handles: &[&str]) -> Company {
        Company {
            revision: 1,
            name: "Acme".into(),
            timezone: "UTC".into(),
            roles: handles
                .iter()
                .map(|h| RoleConfig {
                    handle: h.to_string(),
                    agent: Default::default(),
                    placement: Default::default(),
                    mcp: Vec::new(),
                    ..Default::default()
                })
                .collect(),
            schedules: vec![],
        }
    }

    #[test]
    fn a_recipient_resolves_from_the_company_not_from_running_seats() {
        let c = company(&["alice", "bob"]);
        let r = resolve(&c, "bob").expect("bob is in the company");
        assert_eq!(r.inbox_subject, "crewlet.agent.bob.inbox");
        assert_eq!(r.agent_id, agent_id("Acme", "bob"));
        assert_eq!(resolve(&c, "carol"), None, "not in the company");
    }

    #[test]
    fn agent_ids_are_uuid_v5_stable_and_distinct_per_company_and_handle() {
        let a = agent_id("Acme", "bob");
        assert_eq!(a.get_version_num(), 5);
        assert_eq!(a, agent_id("Acme", "bob"));
        assert_ne!(a, agent_id("Acme", "alice"));
        assert_ne!(a, agent_id("Other", "bob"));
        // The separator keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(agent_id("ab", "c"), agent_id("a", "bc"));
    }
}
