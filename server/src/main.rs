//! `crewlet`: the node binary. Parses the command line and hands over to
//! the library; the only place `anyhow` and process exit codes live.
//!
//! Exit codes: 0 success, 1 failure at run time, 2 invalid config or
//! usage, 75 the watchdog (a wedged node leaving).

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crewlet::config::Config;

#[derive(Parser)]
#[command(
    name = "crewlet",
    version,
    about = "Crewlet node: runs a company's agent seats and serves its dashboard"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a node: serve the dashboard and run the company's seats.
    Run {
        /// The company file.
        #[arg(long, short, default_value = "./crewlet.toml")]
        config: PathBuf,
    },
    /// Validate a company file and print the effective config (secrets
    /// redacted). Exits 0 when valid, 2 when not.
    Check {
        /// The company file.
        #[arg(long, short, default_value = "./crewlet.toml")]
        config: PathBuf,
    },
    /// Read a password on stdin and print its argon2 PHC string for
    /// `[[auth.users]] password_hash`.
    HashPassword,
    /// Validate a company file and make its [company] and [[roles]] the
    /// fleet's next active revision, through a running node's HTTP API.
    Apply {
        /// The company file to apply.
        file: PathBuf,
        /// The node to send it to (default: http://{node.listen of FILE}).
        #[arg(long)]
        node: Option<String>,
        /// An operator API token ([[auth.tokens]]).
        #[arg(long, env = "CREWLET_TOKEN", hide_env_values = true)]
        token: String,
    },
    /// Publish one envelope to a seat's inbox through a running node's HTTP
    /// API (POST /api/seats/{handle}/inbox).
    Send {
        /// The seat's handle.
        #[arg(long)]
        seat: String,
        /// The envelope's type (task_assigned, external_notification,
        /// a2a_request, a2a_message, or a type that runs no turn).
        #[arg(long = "type")]
        kind: String,
        /// The event id (the completion ledger's key); generated if absent.
        #[arg(long)]
        id: Option<String>,
        /// The node to send through.
        #[arg(long, default_value = "http://127.0.0.1:3000")]
        node: String,
        /// An operator API token ([[auth.tokens]]).
        #[arg(long, env = "CREWLET_TOKEN", hide_env_values = true)]
        token: String,
        /// The envelope's body: JSON (a bare word is sent as a JSON string).
        body: String,
    },
    /// Pause a seat fleet-wide through a running node's HTTP API (POST
    /// /api/seats/{handle}/pause): its holder holds the inbox until a
    /// resume. Exits 0 when done, 1 when refused or failed.
    Pause {
        /// The seat's handle.
        #[arg(long)]
        seat: String,
        /// Why (kept with the pause and in the audit log).
        #[arg(long)]
        reason: Option<String>,
        /// Also stop the running turn at its next round.
        #[arg(long)]
        stop_running_turn: bool,
        #[command(flatten)]
        api: Api,
    },
    /// Resume a paused seat through a running node's HTTP API (POST
    /// /api/seats/{handle}/resume). Exits 0 when done, 1 when refused or
    /// failed.
    Resume {
        /// The seat's handle.
        #[arg(long)]
        seat: String,
        #[command(flatten)]
        api: Api,
    },
    /// Ask a seat's running turn to stop at its next round through a
    /// running node's HTTP API (POST /api/seats/{handle}/stop). Exits 0 when
    /// asked, 1 when refused or failed.
    Stop {
        /// The seat's handle.
        #[arg(long)]
        seat: String,
        /// Why (kept in the audit log).
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        api: Api,
    },
}

/// Where a running node's HTTP API is, and the token to use it.
#[derive(clap::Args)]
struct Api {
    /// The node to talk to.
    #[arg(long, default_value = "http://127.0.0.1:3000")]
    node: String,
    /// An operator API token ([[auth.tokens]]).
    #[arg(long, env = "CREWLET_TOKEN", hide_env_values = true)]
    token: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { config } => check(&config),
        Command::Run { config } => run(&config),
        Command::HashPassword => hash_password(),
        Command::Apply { file, node, token } => apply(&file, node, &token),
        Command::Send {
            seat,
            kind,
            id,
            node,
            token,
            body,
        } => send(&seat, &kind, id, &node, &token, &body),
        Command::Pause {
            seat,
            reason,
            stop_running_turn,
            api,
        } => seat_action(
            &api,
            &seat,
            "pause",
            serde_json::json!({ "reason": reason, "stop_running_turn": stop_running_turn }),
        ),
        Command::Resume { seat, api } => seat_action(&api, &seat, "resume", serde_json::json!({})),
        Command::Stop { seat, reason, api } => {
            seat_action(&api, &seat, "stop", serde_json::json!({ "reason": reason }))
        }
    }
}

/// POST /api/seats/{seat}/{action} and print the node's answer: `seat:
/// result` on success (exit 0), the node's reason on stderr otherwise
/// (exit 1).
fn seat_action(api: &Api, seat: &str, action: &str, body: serde_json::Value) -> ExitCode {
    let url = format!(
        "{}/api/seats/{seat}/{action}",
        api.node.trim_end_matches('/')
    );
    match post(&url, &api.token, "application/json", body.to_string()) {
        Ok((status, answer)) if status.is_success() => {
            println!(
                "{}: {}",
                answer["seat"].as_str().unwrap_or(seat),
                answer["result"].as_str().unwrap_or("done")
            );
            ExitCode::SUCCESS
        }
        Ok((status, answer)) => {
            eprintln!(
                "error: the node refused to {action} {seat} ({status}): {}",
                answer["error"].as_str().unwrap_or("no reason given")
            );
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

/// POST `body` to `url` with the bearer token: the answer's status and JSON.
fn post(
    url: &str,
    token: &str,
    content_type: &str,
    body: String,
) -> anyhow::Result<(reqwest::StatusCode, serde_json::Value)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the runtime: {e}"))?;
    rt.block_on(async {
        let r = reqwest::Client::new()
            .post(url)
            .bearer_auth(token)
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot reach the node at {url}: {e}. Is it running? Pass --node URL."
                )
            })?;
        let status = r.status();
        let json: serde_json::Value = r.json().await.unwrap_or_default();
        Ok((status, json))
    })
}

fn send(
    seat: &str,
    kind: &str,
    id: Option<String>,
    node: &str,
    token: &str,
    body: &str,
) -> ExitCode {
    let body: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|_| serde_json::Value::String(body.to_string()));
    let mut envelope = serde_json::json!({ "type": kind, "body": body });
    if let Some(id) = id {
        envelope["id"] = serde_json::json!(id);
    }
    let url = format!("{}/api/seats/{seat}/inbox", node.trim_end_matches('/'));
    match post(&url, token, "application/json", envelope.to_string()) {
        Ok((status, answer)) if status.is_success() => {
            println!("sent {} to {seat}", answer["id"].as_str().unwrap_or("?"));
            ExitCode::SUCCESS
        }
        Ok((status, answer)) => {
            eprintln!(
                "error: the node refused the envelope ({status}): {}",
                answer["error"].as_str().unwrap_or("no reason given")
            );
            ExitCode::from(if status.is_client_error() { 2 } else { 1 })
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn apply(path: &Path, node: Option<String>, token: &str) -> ExitCode {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: cannot read {}: {e}", path.display());
            return ExitCode::from(2);
        }
    };
    // Validate here first: a bad file never reaches the node. What depends
    // on the node (drills, command agents) the node itself judges.
    let config = match Config::parse_applied(
        &path.display().to_string(),
        &text,
        crewlet::config::Environment::Test,
        &crewlet::config::AgentPolicy::test_rig(&[]),
    ) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let base = node.unwrap_or_else(|| format!("http://{}", config.node.listen));
    let url = format!("{}/api/company", base.trim_end_matches('/'));
    let sent = post(&url, token, "application/toml", text);
    match sent {
        Ok((status, body)) if status.is_success() => {
            println!(
                "applied {}: revision {} is active ({} seats)",
                path.display(),
                body["revision"],
                config.roles.len()
            );
            ExitCode::SUCCESS
        }
        Ok((status, body)) => {
            eprintln!(
                "error: the node refused the company ({status}): {}",
                body["error"].as_str().unwrap_or("no reason given")
            );
            ExitCode::from(if status.is_client_error() { 2 } else { 1 })
        }
        Err(e) => {
            eprintln!(
                "error: cannot reach the node at {url}: {e}. Is it running? Pass --node URL."
            );
            ExitCode::from(1)
        }
    }
}

fn check(path: &Path) -> ExitCode {
    match Config::load(path) {
        Ok(c) => {
            println!(
                "# {}: valid. Effective configuration (secrets redacted):\n",
                path.display()
            );
            print!("{}", c.redacted_toml());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn hash_password() -> ExitCode {
    if std::io::stdin().is_terminal() {
        eprintln!("Type the password, then press Enter and Ctrl-D:");
    }
    let mut input = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut input) {
        eprintln!("error: cannot read stdin: {e}");
        return ExitCode::from(1);
    }
    let password = input.trim_end_matches(['\n', '\r']);
    if password.is_empty() {
        eprintln!(
            "error: the password is empty; pipe one in, e.g. `printf %s 'secret' | crewlet hash-password`"
        );
        return ExitCode::from(2);
    }
    match crewlet::web::auth::hash_password(password) {
        Ok(h) => {
            println!("{h}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn run(path: &Path) -> ExitCode {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let _log = match crewlet::logging::init(&config.logging) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(serve(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    // The signal handlers are installed before the node starts: a SIGTERM
    // that arrives just after "node started" is a shutdown, not a kill.
    let shutdown = ShutdownSignal::install()?;
    let node = crewlet::node::start(config).await?;
    eprintln!("{}", ready_block(&node));
    tokio::select! {
        _ = shutdown.recv() => tracing::info!("shutdown asked for; stopping"),
        _ = node.stopped() => {}
    }
    node.shutdown().await?;
    tracing::info!("node stopped");
    Ok(())
}

/// What a person reads once the node is up (straight to stderr, never
/// through the logger): where it is, how to sign in and get back in, a
/// first message to a seat, how to stop it.
fn ready_block(node: &crewlet::node::RunningNode) -> String {
    let url = format!("http://{}", node.addr);
    let seat = node
        .engine
        .company()
        .roles
        .first()
        .map(|r| r.handle.clone())
        .unwrap_or_else(|| "SEAT".into());
    format!(
        "\n  Crewlet node {id} is ready: {url}/\n\n\
         \x20     sign in        {url}/login (the admin printed above on a first start, or a person of\n\
         \x20                    [[auth.users]] / Settings › People)\n\
         \x20     lost password  an admin gives anyone a new one in Settings › People; with no admin\n\
         \x20                    left, add an [[auth.users]] admin (password_hash from\n\
         \x20                    `crewlet hash-password`) to the config and restart\n\
         \x20     talk to a seat crewlet send --node {url} --token $CREWLET_TOKEN --seat {seat} \\\n\
         \x20                      --type task_assigned '{{\"text\": \"hello\"}}'   (an operator token of\n\
         \x20                    [[auth.tokens]]; or the seat's page in the dashboard)\n\
         \x20     stop           Ctrl-C or SIGTERM: the seats are handed back, then the node exits 0\n",
        id = node.info.node_id,
    )
}

/// SIGINT and SIGTERM, each registered when installed (not on first poll).
struct ShutdownSignal {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl ShutdownSignal {
    #[cfg(unix)]
    fn install() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        let interrupt = signal(SignalKind::interrupt())
            .map_err(|e| anyhow::anyhow!("cannot listen for SIGINT: {e}"))?;
        let terminate = signal(SignalKind::terminate())
            .map_err(|e| anyhow::anyhow!("cannot listen for SIGTERM: {e}"))?;
        Ok(Self {
            interrupt,
            terminate,
        })
    }

    #[cfg(not(unix))]
    fn install() -> anyhow::Result<Self> {
        Ok(Self {})
    }

    #[cfg(unix)]
    async fn recv(mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }

    #[cfg(not(unix))]
    async fn recv(self) {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
