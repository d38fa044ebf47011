//! Real `nats-server` processes for tests: one JetStream server, or a
//! 3-server JetStream cluster, each on free loopback ports with its own
//! temporary store directory, killed on drop.
//!
//! A server is ready when JetStream answers `$JS.API.INFO` without an error
//! (on a cluster that needs the meta leader elected), polled with a
//! deadline. The binary is Debian's package (`/usr/sbin/nats-server`,
//! 2.9.x); `NATS_SERVER` overrides the path.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::free_port;

/// How long a server gets to start answering.
const READY: Duration = Duration::from_secs(60);

/// The last lines of a server's log, for a failure message: the log's
/// directory is removed as the failing test unwinds.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

fn binary() -> PathBuf {
    if let Ok(p) = std::env::var("NATS_SERVER") {
        return PathBuf::from(p);
    }
    for p in [
        "/usr/sbin/nats-server",
        "/usr/bin/nats-server",
        "/usr/local/bin/nats-server",
    ] {
        if Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    PathBuf::from("nats-server")
}

/// The version of the nats-server the tests start (`nats-server
/// --version`), as (major, minor, patch); `None` when it cannot be read.
pub fn version() -> Option<(u32, u32, u32)> {
    let out = Command::new(binary()).arg("--version").output().ok()?;
    parse_version(&String::from_utf8_lossy(&out.stdout))
}

/// `nats-server: v2.15.1` → (2, 15, 1).
fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let v = text.trim().rsplit('v').next()?;
    let mut parts = v.split(['.', '-']).map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??, parts.next()??))
}

/// The version in words, for a skip's reason.
pub fn version_words() -> String {
    match version() {
        Some((a, b, c)) => format!("nats-server {a}.{b}.{c}"),
        None => "this nats-server (its version cannot be read)".to_string(),
    }
}

/// Say on the terminal — past the test harness's capture, so a CI log
/// shows it — that `test` is skipped on this server, and why.
pub fn skip(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "skipped: {test} on {}: {why}",
        version_words()
    );
}

/// One running (or killed) nats-server.
pub struct NatsServer {
    name: String,
    /// The `server_name` in its config: the logical name made unique to
    /// this run, so readiness can tell it from another test's server that
    /// took the same port first.
    server_name: String,
    port: u16,
    monitor_port: u16,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    /// The user and password readiness is polled with.
    login: Option<(String, String)>,
    /// The authority readiness checks the server's certificate against
    /// (a server that requires TLS).
    tls_ca: Option<PathBuf>,
    /// The creds file readiness signs in with (a server in operator mode).
    creds: Option<PathBuf>,
    /// The nats-server executable.
    program: PathBuf,
    dir: tempfile::TempDir,
}

impl NatsServer {
    /// A single JetStream server.
    pub async fn start() -> NatsServer {
        NatsServer::start_with("", None).await
    }

    /// A single JetStream server with `extra` appended to its config (an
    /// `authorization { … }` block, say); `login` is the user and password
    /// the harness polls it with, when it needs one. A server that exits
    /// before it serves (a port taken between the harness picking it and
    /// the server binding it) is started again on fresh ports.
    pub async fn start_with(extra: &str, login: Option<(&str, &str)>) -> NatsServer {
        for _ in 0..3 {
            let mut s = NatsServer::configure("n0", free_port(), free_port(), None, extra);
            s.login = login.map(|(u, p)| (u.to_string(), p.to_string()));
            if s.serves_or_exits().await {
                return s;
            }
        }
        panic!("nats-server exited before serving, three times (see the logs above)");
    }

    /// A single JetStream server that requires TLS, with the certificate
    /// and key in `cert` / `key`, signed by the authority in `ca`.
    pub async fn start_tls(cert: &Path, key: &Path, ca: &Path) -> NatsServer {
        let extra = format!(
            "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n}}\n",
            cert.display(),
            key.display()
        );
        for _ in 0..3 {
            let mut s = NatsServer::configure("n0", free_port(), free_port(), None, &extra);
            s.tls_ca = Some(ca.to_path_buf());
            if s.serves_or_exits().await {
                return s;
            }
        }
        panic!("nats-server (TLS) exited before serving, three times");
    }

    /// A single JetStream server in operator mode (`operator` / `resolver`
    /// lines in `extra`), polled signing in with the creds file `creds`.
    pub async fn start_operator(extra: &str, creds: &Path) -> NatsServer {
        for _ in 0..3 {
            let mut s = NatsServer::configure("n0", free_port(), free_port(), None, extra);
            s.creds = Some(creds.to_path_buf());
            if s.serves_or_exits().await {
                return s;
            }
        }
        panic!("nats-server (operator mode) exited before serving, three times");
    }

    /// The server's client URL with the `tls://` scheme.
    pub fn tls_url(&self) -> String {
        format!("tls://127.0.0.1:{}", self.port)
    }

    /// Wait until JetStream answers (true) or the process has exited
    /// (false); past the deadline, panic naming the log.
    async fn serves_or_exits(&mut self) -> bool {
        let urls = vec![match self.tls_ca {
            Some(_) => self.tls_url(),
            None => self.url(),
        }];
        let until = std::time::Instant::now() + READY;
        loop {
            if jetstream_ready_with(
                &urls,
                self.login.clone(),
                self.tls_ca.clone(),
                self.creds.clone(),
                Some(&self.server_name),
            )
            .await
            {
                return true;
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                eprintln!(
                    "nats-server {} exited ({status}) before serving; starting it again on fresh ports. Its log:\n{log}",
                    self.name
                );
                self.child = None;
                return false;
            }
            assert!(
                std::time::Instant::now() < until,
                "timed out after {READY:?} waiting for nats-server {} to serve JetStream; the end of its log ({}):\n{}",
                self.name,
                self.log.display(),
                log_tail(&self.log)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn configure(
        name: &str,
        port: u16,
        monitor_port: u16,
        cluster: Option<(u16, &[u16], &str)>,
        extra: &str,
    ) -> NatsServer {
        let dir = tempfile::tempdir().expect("temp dir for nats-server");
        let store = dir.path().join("jetstream");
        let server_name = unique_server_name(name);
        let mut conf = format!(
            "server_name: {server_name}\nlisten: 127.0.0.1:{port}\nhttp: 127.0.0.1:{monitor_port}\n\
             jetstream {{\n  store_dir: \"{}\"\n}}\n",
            store.display()
        );
        if let Some((cluster_port, routes, cluster_extra)) = cluster {
            let routes: Vec<String> = routes
                .iter()
                .map(|p| format!("    nats-route://127.0.0.1:{p}"))
                .collect();
            conf.push_str(&format!(
                "cluster {{\n  name: crewlet-test\n  listen: 127.0.0.1:{cluster_port}\n  routes: [\n{}\n  ]\n{cluster_extra}}}\n",
                routes.join("\n")
            ));
        }
        conf.push_str(extra);
        let config = dir.path().join("nats.conf");
        std::fs::write(&config, conf).expect("write nats.conf");
        let log = dir.path().join("nats.log");
        let mut s = NatsServer {
            name: name.into(),
            server_name,
            port,
            monitor_port,
            config,
            log,
            child: None,
            login: None,
            tls_ca: None,
            creds: None,
            program: binary(),
            dir,
        };
        s.spawn();
        s
    }

    /// A single JetStream server on `port` (a node may already be waiting
    /// for it there).
    pub async fn start_on(port: u16) -> NatsServer {
        let mut s = NatsServer::configure("n0", port, free_port(), None, "");
        assert!(
            s.serves_or_exits().await,
            "nats-server on port {port} exited"
        );
        s
    }

    /// A single JetStream server run by `program` (another nats-server
    /// release than the default one).
    pub async fn start_program(program: &Path) -> NatsServer {
        for _ in 0..3 {
            let mut s = NatsServer::configure("n0", free_port(), free_port(), None, "");
            // configure started the default binary: start the one asked for.
            s.kill();
            s.program = program.to_path_buf();
            s.spawn();
            if s.serves_or_exits().await {
                return s;
            }
        }
        panic!("{} exited before serving, three times", program.display());
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open the server log");
        let err = log.try_clone().expect("clone the server log");
        let child = Command::new(&self.program)
            .arg("-c")
            .arg(&self.config)
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start nats-server ({}): {e}. Install it: apt-get install -y nats-server", self.program.display()));
        self.child = Some(child);
    }

    /// Does JetStream answer through `urls` within the readiness bound?
    /// `only_this` asks that the answer come from this server, not another
    /// that holds the port.
    async fn ready_within_bound(&self, urls: &[String], only_this: bool) -> bool {
        let urls = urls.to_vec();
        let login = self.login.clone();
        let expect = only_this.then(|| self.server_name.clone());
        super::poll_until(READY, Duration::from_millis(50), || {
            let urls = urls.clone();
            let login = login.clone();
            let expect = expect.clone();
            async move {
                jetstream_ready(&urls, login, expect.as_deref())
                    .await
                    .then_some(())
            }
        })
        .await
        .is_some()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the server writes its log (inside its temporary directory,
    /// gone once the server is dropped).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The monitoring endpoint (`/jsz?streams=true`, `/connz`, …).
    pub fn monitor_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.monitor_port)
    }

    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join("jetstream")
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start it again on the same ports and store directory. A server that
    /// exits instead of serving fails the test at once, its log printed:
    /// its ports are its identity to the cluster and the clients, so it
    /// cannot move.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn();
        assert!(
            self.serves_or_exits().await,
            "nats-server {} exited after a restart on its own ports (its log is above)",
            self.name
        );
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether JetStream answers `$JS.API.INFO` without an error through any of `urls`.
async fn jetstream_ready(
    urls: &[String],
    login: Option<(String, String)>,
    expect: Option<&str>,
) -> bool {
    jetstream_ready_with(urls, login, None, None, expect).await
}

/// `name` made unique to this test process and this server: two tests'
/// servers never share a `server_name`, whatever ports they were given.
fn unique_server_name(name: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{name}-{}-{n}", std::process::id())
}

async fn jetstream_ready_with(
    urls: &[String],
    login: Option<(String, String)>,
    tls_ca: Option<PathBuf>,
    creds: Option<PathBuf>,
    expect: Option<&str>,
) -> bool {
    let mut options = match login {
        Some((u, p)) => async_nats::ConnectOptions::with_user_and_password(u, p),
        None => async_nats::ConnectOptions::new(),
    };
    if let Some(ca) = tls_ca {
        options = options.add_root_certificates(ca).require_tls(true);
    }
    if let Some(path) = creds {
        match options.credentials_file(path).await {
            Ok(o) => options = o,
            Err(_) => return false,
        }
    }
    let Ok(Ok(client)) =
        tokio::time::timeout(Duration::from_secs(1), options.connect(urls.to_vec())).await
    else {
        return false;
    };
    // Another test's server on this port answers too: it is not ours.
    if let Some(name) = expect
        && client.server_info().server_name != name
    {
        let _ = client.drain().await;
        return false;
    }
    let ok = match tokio::time::timeout(
        Duration::from_secs(1),
        client.request("$JS.API.INFO", "".into()),
    )
    .await
    {
        Ok(Ok(reply)) => {
            let body: serde_json::Value =
                serde_json::from_slice(&reply.payload).unwrap_or_default();
            body.get("error").is_none() && body.get("type").is_some()
        }
        _ => false,
    };
    let _ = client.drain().await;
    ok
}

/// Can a stream with `replicas` replicas be created (and is it removed
/// again)?
async fn replicated_stream_placeable(urls: &[String], replicas: usize) -> bool {
    let Ok(Ok(client)) = tokio::time::timeout(
        Duration::from_secs(1),
        async_nats::ConnectOptions::new().connect(urls.to_vec()),
    )
    .await
    else {
        return false;
    };
    let js = async_nats::jetstream::new(client.clone());
    let made = tokio::time::timeout(
        Duration::from_secs(2),
        js.create_stream(async_nats::jetstream::stream::Config {
            name: "CLUSTER_READY_PROBE".into(),
            subjects: vec!["cluster.ready.probe".into()],
            num_replicas: replicas,
            ..Default::default()
        }),
    )
    .await;
    let ok = matches!(made, Ok(Ok(_)));
    if ok {
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            js.delete_stream("CLUSTER_READY_PROBE"),
        )
        .await;
    }
    let _ = client.drain().await;
    ok
}

/// A 3-server JetStream cluster on loopback.
pub struct NatsCluster {
    pub servers: Vec<NatsServer>,
}

impl NatsCluster {
    pub async fn start(n: usize) -> NatsCluster {
        NatsCluster::start_with(n, "").await
    }

    /// A cluster whose `cluster { … }` blocks also carry `cluster_extra`
    /// (`no_advertise: true`, say: clients learn no other server's address,
    /// so a client given proxies stays behind them).
    pub async fn start_with(n: usize, cluster_extra: &str) -> NatsCluster {
        NatsCluster::start_configured(n, cluster_extra, "").await
    }

    /// [`NatsCluster::start_with`], each server's config also carrying
    /// `extra` at its top level (`max_payload: 8MB`, say).
    pub async fn start_configured(n: usize, cluster_extra: &str, extra: &str) -> NatsCluster {
        // A cluster that does not serve JetStream or cannot place a
        // replicated stream in time (a route port another test took between
        // picking and binding it, a meta leader slow on a loaded machine) is
        // started again on fresh ports.
        for attempt in 1..=3 {
            if let Some(c) = NatsCluster::try_start(n, cluster_extra, extra).await {
                return c;
            }
            eprintln!(
                "the {n}-server cluster was not ready in time (attempt {attempt}); starting it again on fresh ports"
            );
        }
        panic!("a {n}-server cluster could not place a replicated stream, three times");
    }

    async fn try_start(n: usize, cluster_extra: &str, extra: &str) -> Option<NatsCluster> {
        let ports: Vec<(u16, u16, u16)> = (0..n)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect();
        let routes: Vec<u16> = ports.iter().map(|p| p.2).collect();
        let servers: Vec<NatsServer> = ports
            .iter()
            .enumerate()
            .map(|(i, (port, monitor, cluster))| {
                NatsServer::configure(
                    &format!("n{i}"),
                    *port,
                    *monitor,
                    Some((*cluster, &routes, cluster_extra)),
                    extra,
                )
            })
            .collect();
        let c = NatsCluster { servers };
        let urls = c.urls();
        // A server that does not serve JetStream in time (its cluster port
        // taken by another process between picking and binding it, so the
        // cluster never forms) is a cluster to start again, not a failure.
        for s in &c.servers {
            if !s.ready_within_bound(&[s.url()], true).await {
                eprintln!(
                    "nats-server {} did not serve JetStream in time (log: {})",
                    s.name,
                    s.log.display()
                );
                return None;
            }
        }
        // And through the whole list, the way a node connects.
        if !c.servers[0].ready_within_bound(&urls, false).await {
            return None;
        }
        // A meta leader answers before every peer has joined it: wait until
        // a stream replicated on every server can be placed.
        let n = c.servers.len();
        super::poll_until(READY, Duration::from_millis(100), || {
            let urls = urls.clone();
            async move { replicated_stream_placeable(&urls, n).await.then_some(()) }
        })
        .await?;
        Some(c)
    }

    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(NatsServer::url).collect()
    }

    /// The server called `name` (`n0`, `n1`, …).
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.servers
            .iter()
            .position(|s| s.name() == name || s.server_name == name)
    }

    /// The stream's leader, as its cluster info names it.
    pub async fn leader_of(
        &self,
        js: &async_nats::jetstream::Context,
        stream: &str,
    ) -> Option<usize> {
        let mut s = js.get_stream(stream).await.ok()?;
        let info = s.info().await.ok()?;
        let leader = info.cluster.as_ref()?.leader.clone()?;
        self.index_of(&leader)
    }
}
