//! One node in this process behind its real HTTP listener, for the HTTP
//! suites: the company file's sign-in users and bearer tokens every suite
//! shares, a client that keeps its session cookie, and a graceful stop.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use crewlet::config::Config;
use crewlet::node::{self, RunningNode};
use reqwest::StatusCode;
use reqwest::redirect::Policy;
use sha2::{Digest, Sha256};

/// The admin's name and password.
pub const ADMIN: (&str, &str) = ("ada", "admin-pass");
/// The operator's name and password.
pub const OPERATOR: (&str, &str) = ("olivia", "op-pass");
/// The viewer's name and password.
pub const VIEWER: (&str, &str) = ("victor", "view-pass");
/// The bearer token named `monitoring` (viewer).
pub const MONITORING_TOKEN: &str = "monitoring-token-1234";
/// The bearer token named `deploy` (admin).
pub const DEPLOY_TOKEN: &str = "deploy-token-5678";
/// The bearer token named `ops` (operator).
pub const OPS_TOKEN: &str = "ops-token-9012";

/// What kind of node a suite starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rig {
    /// `node.environment = "test"`: alpha's echo agent honours drills, and
    /// detached runs may start `/bin/sh`, `/bin/sleep`, `/bin/true` and
    /// `/bin/echo`.
    Test,
    /// A node as shipped: no drills, no detached runs.
    Production,
}

/// A password's stored hash, computed once per password per test binary
/// (the hash is deliberately slow).
pub fn hash(password: &str) -> String {
    static CACHE: OnceLock<Mutex<BTreeMap<String, String>>> = OnceLock::new();
    let mut c = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    c.entry(password.to_string())
        .or_insert_with(|| crewlet::web::auth::hash_password(password).unwrap())
        .clone()
}

/// Where an answer redirects to (empty when it does not).
pub fn location(r: &reqwest::Response) -> String {
    r.headers()
        .get("location")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

/// A client that keeps its session cookie and does not follow redirects.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .cookie_store(true)
        .redirect(Policy::none())
        .build()
        .unwrap()
}

pub struct HttpNode {
    pub node: Option<RunningNode>,
    pub base: String,
    /// The company file it was started with (a restart reads it again).
    text: String,
    _dir: tempfile::TempDir,
}

impl HttpNode {
    /// `node-http` with one seat, `alpha`.
    pub async fn start() -> HttpNode {
        HttpNode::start_with("").await
    }

    /// `node-http` with seat `alpha`, and `more` added to its company file
    /// (more roles, say).
    pub async fn start_with(more: &str) -> HttpNode {
        HttpNode::start_as(Rig::Test, more).await
    }

    /// A `rig` node with seat `alpha` and `more` in its company file.
    pub async fn start_as(rig: Rig, more: &str) -> HttpNode {
        HttpNode::start_full(rig, "", more).await
    }

    /// A `rig` node with `node_keys` added to its `[node]` section, seat
    /// `alpha` and `more` in its company file.
    pub async fn start_full(rig: Rig, node_keys: &str, more: &str) -> HttpNode {
        HttpNode::start_at(rig, "127.0.0.1:0", node_keys, more).await
    }

    /// A `rig` node listening on `listen` (an address with port 0).
    pub async fn start_listening(rig: Rig, listen: &str) -> HttpNode {
        HttpNode::start_at(rig, listen, "", "").await
    }

    async fn start_at(rig: Rig, listen: &str, node_keys: &str, more: &str) -> HttpNode {
        let dir = tempfile::tempdir().unwrap();
        let (environment, alpha_agent, runs) = match rig {
            Rig::Test => (
                "environment = \"test\"",
                "agent = { kind = \"echo\", drills = true }",
                "[runs]\nallow = [\"/bin/sh\", \"/bin/sleep\", \"/bin/true\", \"/bin/echo\"]",
            ),
            Rig::Production => ("", "", ""),
        };
        let text = format!(
            r#"
[node]
id = "node-http"
listen = "{listen}"
data_dir = "{data}"
{environment}
{node_keys}

{runs}

[[roles]]
handle = "alpha"
{alpha_agent}

{more}

[[auth.users]]
name = "{admin}"
password_hash = "{admin_hash}"
role = "admin"

[[auth.users]]
name = "{op}"
password_hash = "{op_hash}"
role = "operator"

[[auth.users]]
name = "{viewer}"
password_hash = "{viewer_hash}"
role = "viewer"

[[auth.tokens]]
name = "monitoring"
sha256 = "{monitoring}"
role = "viewer"

[[auth.tokens]]
name = "deploy"
sha256 = "{deploy}"
role = "admin"

[[auth.tokens]]
name = "ops"
sha256 = "{ops}"
role = "operator"
"#,
            data = dir.path().join("data").display(),
            op = OPERATOR.0,
            op_hash = hash(OPERATOR.1),
            viewer = VIEWER.0,
            viewer_hash = hash(VIEWER.1),
            monitoring = hex::encode(Sha256::digest(MONITORING_TOKEN.as_bytes())),
            deploy = hex::encode(Sha256::digest(DEPLOY_TOKEN.as_bytes())),
            ops = hex::encode(Sha256::digest(OPS_TOKEN.as_bytes())),
            admin = ADMIN.0,
            admin_hash = hash(ADMIN.1),
        );
        let config = Config::parse("test.toml", &text, &BTreeMap::new()).unwrap();
        let node = node::start(config).await.unwrap();
        let base = format!("http://127.0.0.1:{}", node.addr.port());
        HttpNode {
            node: Some(node),
            base,
            text,
            _dir: dir,
        }
    }

    /// Stop the node gracefully and start it again on the same data
    /// folder and company file (on a new port).
    pub async fn restart(mut self) -> HttpNode {
        if let Some(n) = self.node.take() {
            n.shutdown().await.unwrap();
        }
        let config = Config::parse("test.toml", &self.text, &BTreeMap::new()).unwrap();
        let node = node::start(config).await.unwrap();
        self.base = format!("http://127.0.0.1:{}", node.addr.port());
        self.node = Some(node);
        self
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// The node's data directory (its database among it).
    pub fn data_dir(&self) -> std::path::PathBuf {
        self._dir.path().join("data")
    }

    pub fn running(&self) -> &RunningNode {
        self.node.as_ref().unwrap()
    }

    /// The fleet's audit log, newest first, as an operator reads it.
    pub async fn audit_log(&self) -> Vec<serde_json::Value> {
        let op = self.signed_in(OPERATOR).await;
        super::audit_entries(
            op.post(self.url("/api/audit_log"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap(),
        )
    }

    /// A client signed in as `who` (name, password).
    pub async fn signed_in(&self, who: (&str, &str)) -> reqwest::Client {
        let c = client();
        let r = c
            .post(self.url("/login"))
            .form(&[("name", who.0), ("password", who.1), ("next", "/")])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::SEE_OTHER, "{} signs in", who.0);
        c
    }

    pub async fn stop(mut self) {
        if let Some(n) = self.node.take() {
            n.shutdown().await.unwrap();
        }
    }
}
