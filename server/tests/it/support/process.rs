//! A `crewlet run` child process, as a user starts it: its company file in
//! a temporary directory, its stderr kept (and searched), killed on drop.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::Digest;

/// The viewer token every node process started here knows (its
/// `/health` detail is read with it).
pub const HARNESS_TOKEN: &str = "harness-token-5678";

/// One node process.
pub struct NodeProcess {
    child: Child,
    pub base: String,
    pub port: u16,
    stderr: Arc<Mutex<Vec<String>>>,
    pub dir: tempfile::TempDir,
}

impl NodeProcess {
    /// Start `crewlet run` with `config` (its `listen` is filled in from
    /// `{listen}`, its data directory from `{data}`).
    pub fn start(config: &str) -> NodeProcess {
        NodeProcess::start_with_env(config, &[])
    }

    /// [`NodeProcess::start`] with `env` added to the node's environment.
    pub fn start_with_env(config: &str, env: &[(&str, &str)]) -> NodeProcess {
        let dir = tempfile::tempdir().unwrap();
        let port = super::free_port();
        // The harness reads `/health`'s detail with a viewer token of its own.
        let text = format!(
            "{}\n\n[[auth.tokens]]\nname = \"harness\"\nsha256 = \"{}\"\nrole = \"viewer\"\n",
            config
                .replace("{listen}", &format!("127.0.0.1:{port}"))
                .replace("{data}", &dir.path().join("data").display().to_string()),
            hex::encode(sha2::Sha256::digest(HARNESS_TOKEN.as_bytes()))
        );
        let file = dir.path().join("crewlet.toml");
        std::fs::write(&file, text).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_crewlet"))
            .args(["run", "--config"])
            .arg(&file)
            // The suites read turns from the log: their events at debug.
            .env(
                "RUST_LOG",
                format!("{},crewlet::event=debug", crewlet::logging::DEFAULT_FILTER),
            )
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let pipe = child.stderr.take().unwrap();
        let kept = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { return };
                kept.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            }
        });
        NodeProcess {
            child,
            base: format!("http://127.0.0.1:{port}"),
            port,
            stderr,
            dir,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Every stderr line so far.
    pub fn stderr(&self) -> Vec<String> {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The first stderr line containing `needle`, waited for.
    pub async fn line_with(&self, needle: &str, within: Duration) -> String {
        super::wait_for(
            &format!("a line with {needle:?} on the node's stderr"),
            within,
            Duration::from_millis(50),
            || async { self.stderr().into_iter().find(|l| l.contains(needle)) },
        )
        .await
    }

    /// Wait until `/health` answers 200; past `within`, fail with the
    /// node's own last words (what it was doing, or why it stopped).
    pub async fn healthy(&self, within: Duration) {
        let url = self.url("/health");
        let answered = super::poll_until(within, Duration::from_millis(100), || {
            let url = url.clone();
            async move {
                reqwest::get(url)
                    .await
                    .ok()
                    .filter(|r| r.status() == reqwest::StatusCode::OK)
                    .map(|_| ())
            }
        })
        .await;
        if answered.is_none() {
            let said = self.stderr();
            let tail = &said[said.len().saturating_sub(40)..];
            panic!(
                "timed out after {within:?} waiting for the node to answer /health; its last stderr lines:\n{}",
                tail.join("\n")
            );
        }
    }

    /// The seats its `/health` says it holds.
    pub async fn seats(&self) -> Vec<String> {
        let Ok(r) = reqwest::Client::new()
            .get(self.url("/health"))
            .bearer_auth(HARNESS_TOKEN)
            .send()
            .await
        else {
            return Vec::new();
        };
        let v: serde_json::Value = r.json().await.unwrap_or_default();
        v["seats"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Its resident memory, in bytes.
    pub fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .unwrap()
    }

    /// `kill -9`: no drain, nothing settled.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet).
pub fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Err(_) => true,
        Ok(s) => s
            .lines()
            .any(|l| l.starts_with("State:") && l.contains('Z')),
    }
}

/// The JSON a child wrote to `path` (written whole: to a temporary name,
/// then renamed), once it is there.
pub async fn report_of(path: &std::path::Path, what: &str) -> serde_json::Value {
    super::wait_for(
        what,
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            std::fs::read_to_string(path)
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
        },
    )
    .await
}

/// Kill the node with SIGKILL and wait until process `pid` is gone too.
pub async fn dies_with(node: &mut NodeProcess, pid: u32, what: &str) {
    assert!(!gone(pid), "{what} was not running before the kill");
    node.kill9();
    super::wait_for(
        what,
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async { gone(pid).then_some(()) },
    )
    .await;
}
