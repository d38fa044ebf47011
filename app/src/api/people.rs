//! People and identities: who a request acts under, their roles, the
//! people Settings › People lists and the answer to adding one.

use serde::{Deserialize, Serialize};

/// What a signed-in person may do. Viewers read; operators act on seats;
/// admins also deploy (apply a company) and manage people. Ordered: each
/// role may do everything the one before it may.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Hash)]
#[serde(rename_all = "lowercase")]
pub enum PersonRole {
    Viewer,
    Operator,
    Admin,
}

impl PersonRole {
    pub const ALL: [PersonRole; 3] = [PersonRole::Viewer, PersonRole::Operator, PersonRole::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            PersonRole::Viewer => "viewer",
            PersonRole::Operator => "operator",
            PersonRole::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<PersonRole> {
        PersonRole::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl std::fmt::Display for PersonRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The identity a request acts under: a signed-in person, or an API token
/// (whose `name` is the token's name from the company file).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Person {
    pub name: String,
    pub role: PersonRole,
    /// True when the identity came from a bearer token rather than a session.
    #[serde(default)]
    pub via_token: bool,
    /// The person must choose a new password before doing anything else
    /// (the first-start password, or one an admin reset).
    #[serde(default)]
    pub must_change_password: bool,
}

impl Person {
    /// May act on seats (pause, resume, stop, move, send): operators and
    /// admins.
    pub fn is_operator(&self) -> bool {
        self.role >= PersonRole::Operator
    }

    /// May deploy and manage people: admins only.
    pub fn is_admin(&self) -> bool {
        self.role == PersonRole::Admin
    }
}

/// A person known to the node (never carries a password or its hash).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PersonView {
    pub name: String,
    pub role: PersonRole,
    /// `file` (from the company file's `[[auth.users]]`) or `database`.
    /// Only people from the database can be changed on the dashboard.
    pub source: String,
    /// Their password must be changed at their next sign-in.
    #[serde(default)]
    pub must_change_password: bool,
}

/// The answer to adding a person: the generated password, shown once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewPerson {
    pub name: String,
    pub role: PersonRole,
    pub password: String,
}
