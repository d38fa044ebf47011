//! The node's HTTP surface: the dashboard (Leptos SSR + hydration), the
//! sign-in gate, `/health`, `/metrics`, the JSON query endpoints and the
//! live event stream (`/api/events`).
//!
//! Routes here are public contracts (docs/http-and-cli.md § HTTP). This module renders
//! and routes; what it shows comes from the node through [`NodeConsole`].

pub mod actions;
pub mod approvals;
pub mod auth;
pub mod console;
pub mod dead_letters;
pub mod headers;
pub mod history;
pub mod live;
pub mod memory;
pub mod nodes;
pub mod ownership;
pub mod ranking;
pub mod seats;
pub mod sessions;
pub mod unavailable;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::StringRejection;
use axum::extract::{DefaultBodyLimit, Extension};
use axum::http::header;
use axum::response::{IntoResponse, Redirect};
use axum::routing::{get, post};
use axum::{Json, Router};
use leptos::prelude::*;
use leptos_axum::{LeptosRoutes, generate_route_list};
use serde::Serialize;
use sqlx::SqlitePool;
use tower_sessions::cookie::SameSite;
use tower_sessions::{ExpiredDeletion, Expiry, SessionManagerLayer};
use tower_sessions_sqlx_store::SqliteStore;

use app::console::SharedConsole;
use app::{App, shell};

use crate::config::Config;
use crate::identity::NodeInfo;
use crate::seat::engine::SeatEngine;
use crate::tasks::Tasks;

pub use console::NodeConsole;

/// The name of the wasm bundle (`pkg/crewlet.js`, `pkg/crewlet_bg.wasm`).
pub const OUTPUT_NAME: &str = "crewlet";

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "crewlet_session";

/// The largest body of an inbox envelope.
pub const LARGE_BODY: usize = 256 * 1024;
/// The largest company file an admin may apply (`POST /api/company`,
/// `crewlet apply`): room for the 10,000 roles a company may have. Nobody
/// else's body is read on that route.
pub const COMPANY_BODY: usize = 8 * 1024 * 1024;
/// The largest body of a sign-in, a password change or a seat action.
pub const SMALL_BODY: usize = 8 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum WebError {
    #[error("cannot prepare the session store: {0}")]
    Sessions(#[from] sqlx::Error),
    #[error("cannot create the first person: {0}")]
    Bootstrap(#[from] auth::AuthError),
}

/// Everything the router is built from.
pub struct WebSetup<'a> {
    pub config: &'a Config,
    pub info: NodeInfo,
    pub pool: SqlitePool,
    pub tasks: Tasks,
    pub site_root: PathBuf,
    pub addr: SocketAddr,
    pub engine: Arc<SeatEngine>,
    pub turns: Arc<crate::engine::runtime::TurnEngine>,
    /// Reads of a seat's memory, answered by its holder.
    pub memread: Arc<crate::memory::memread::MemRead>,
    /// The fleet's audit log, gathered from every live node.
    pub audit: Arc<crate::audit::FleetAudit>,
    /// The last hour of this node and, asked, of its peers.
    pub trends: Arc<crate::trends::Trends>,
}

/// `GET /health`.
#[derive(Debug, Serialize)]
pub struct Health {
    pub node: String,
    pub incarnation: String,
    pub version: &'static str,
    pub protocol: u32,
    /// Seats this node holds and runs (a stranded seat is not among them).
    pub seats: Vec<String>,
    /// Seat → seconds its teardown has been failing; only while one is.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub unproven_seconds: std::collections::BTreeMap<String, u64>,
    /// Detached runs whose command runs on this node now.
    pub detached_runs: usize,
    /// Seat → the last error that broke one of its turns here (a panic);
    /// only while there is one.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub last_errors: std::collections::BTreeMap<String, String>,
}

/// Build the whole HTTP surface. Creates `admin` on a node nobody can sign
/// in to (its password is printed once on stderr).
pub async fn router(setup: WebSetup<'_>) -> Result<Router, WebError> {
    let WebSetup {
        config,
        info,
        pool,
        tasks,
        site_root,
        addr,
        engine,
        turns,
        memread,
        audit,
        trends,
    } = setup;

    let sessions = session_layer(config, &pool, &tasks).await?;

    let auth = Arc::new(auth::Auth::new(pool.clone(), &config.auth));
    if let Some(password) = auth.bootstrap_admin().await? {
        // Printed once, straight to stderr, never through the logger.
        eprintln!(
            "\n  No people were configured, so this node created one:\n\n      sign in at http://{addr}/login as  admin  with password  {password}\n\n  You choose a new password at the first sign-in; only its hash is kept.\n  Add people in Settings › People or in [[auth.users]].\n"
        );
    }

    // The event log follows the bus from here on: every event a client of
    // `/api/events` may be sent is numbered by it.
    let event_log = Arc::new(live::EventLog::for_this_process());
    let notes = Arc::new(live::SeatNotes::default());
    // Kept from the first event on: the history listens before the log
    // numbers anything.
    let history = history::EventHistory::new(pool.clone(), event_log.clone());
    history.keep(&tasks);
    event_log.follow(engine.events(), notes.clone(), &tasks);
    let streams = live::EventStreams {
        log: event_log,
        stop: tasks.token(),
        ends: auth.session_end_sender(),
    };

    let info = Arc::new(info);
    let console: SharedConsole = Arc::new(NodeConsole::new(console::ConsoleParts {
        info: info.clone(),
        pool: pool.clone(),
        auth: auth.clone(),
        engine: engine.clone(),
        turns: turns.clone(),
        notes,
        memread,
        audit,
        history,
        trends,
        policy: crate::config::AgentPolicy::of(config),
        environment: config.node.environment,
    }));

    let leptos_options = LeptosOptions::builder()
        .output_name(OUTPUT_NAME)
        .site_root(site_root.display().to_string())
        .site_pkg_dir("pkg")
        .site_addr(addr)
        .build();
    let pages = generate_route_list(App);
    let ctx_console = console.clone();
    let app = api_routes()
        .leptos_routes_with_context(
            &leptos_options,
            pages,
            {
                let name = app::NodeName(info.node_id.clone());
                move || {
                    provide_context(ctx_console.clone());
                    provide_context(name.clone());
                }
            },
            {
                let o = leptos_options.clone();
                move || shell(o.clone())
            },
        )
        .fallback(leptos_axum::file_and_error_handler(shell))
        .layer(axum::middleware::from_fn(auth::gate))
        .layer(sessions)
        .layer(axum::middleware::from_fn(headers::secure))
        .layer(DefaultBodyLimit::max(SMALL_BODY * 8))
        .layer(Extension(auth))
        .layer(Extension(info))
        .layer(Extension(engine))
        .layer(Extension(turns))
        .layer(Extension(console))
        .layer(Extension(streams))
        // Every request counted and timed by its route (every layer of a
        // router runs once it has routed: the matched route is known).
        .layer(axum::middleware::from_fn(observe_http))
        .with_state(leptos_options);
    Ok(app)
}

/// The session store (expired sessions deleted every ten minutes) and its
/// cookie: strict, HTTP-only, secure where the node says, twelve hours
/// of inactivity. Kept under the hash of the cookie's id: the database
/// holds no cookie.
async fn session_layer(
    config: &Config,
    pool: &SqlitePool,
    tasks: &Tasks,
) -> Result<SessionManagerLayer<sessions::HashedIds<SqliteStore>>, WebError> {
    let store = SqliteStore::new(pool.clone())
        .with_table_name("sessions")
        .map_err(|e| WebError::Sessions(sqlx::Error::Configuration(e.into())))?;
    store.migrate().await?;
    {
        let store = store.clone();
        tasks.spawn("session-expiry", async move {
            if let Err(e) = store
                .continuously_delete_expired(Duration::from_secs(600))
                .await
            {
                tracing::warn!(error = %e, "expired-session cleanup stopped");
            }
        });
    }
    Ok(SessionManagerLayer::new(sessions::HashedIds::new(store))
        .with_name(SESSION_COOKIE)
        .with_http_only(true)
        .with_same_site(SameSite::Strict)
        .with_secure(config.auth.secure_cookies(&config.node))
        .with_expiry(Expiry::OnInactivity(time::Duration::hours(12))))
}

/// Every route but the dashboard's pages, with its body limit.
fn api_routes() -> Router<LeptosOptions> {
    Router::new()
        .route("/", get(|| async { Redirect::to(auth::HOME) }))
        .route(
            "/login",
            post(auth::login).layer(DefaultBodyLimit::max(SMALL_BODY)),
        )
        .route(
            "/logout",
            post(auth::logout).layer(DefaultBodyLimit::max(SMALL_BODY)),
        )
        .route(
            auth::PASSWORD_PAGE,
            post(auth::change_password).layer(DefaultBodyLimit::max(SMALL_BODY)),
        )
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/query/fleet", get(fleet))
        .route("/api/events", get(live::events))
        .route(
            "/api/company",
            post(actions::apply_company).layer(DefaultBodyLimit::disable()),
        )
        .route("/api/dead-letters", get(dead_letters))
        .route(
            "/api/dead-letters/{id}/requeue",
            post(requeue_dead_letter).layer(DefaultBodyLimit::max(SMALL_BODY)),
        )
        .route(
            "/api/dead-letters/{id}/discard",
            post(discard_dead_letter).layer(DefaultBodyLimit::max(SMALL_BODY)),
        )
        .route("/api/events/history", get(event_history))
        .route("/api/seats/{handle}/outbox", get(seat_outbox))
        .route(
            "/api/seats/{handle}/inbox",
            post(actions::send_to_inbox).layer(DefaultBodyLimit::max(LARGE_BODY)),
        )
        .route(
            "/api/seats/{handle}/pause",
            post(actions::pause_seat).layer(DefaultBodyLimit::max(SMALL_BODY)),
        )
        .route(
            "/api/seats/{handle}/resume",
            post(actions::resume_seat).layer(DefaultBodyLimit::max(SMALL_BODY)),
        )
        .route(
            "/api/seats/{handle}/stop",
            post(actions::stop_seat_turn).layer(DefaultBodyLimit::max(SMALL_BODY)),
        )
        .route(
            "/api/seats/{handle}/move",
            post(ranking::move_seat).layer(DefaultBodyLimit::max(SMALL_BODY)),
        )
        .route(
            "/api/nodes/order",
            get(ranking::get_order)
                .put(ranking::put_order)
                .layer(DefaultBodyLimit::max(SMALL_BODY)),
        )
        .route("/api/seats/{handle}/memory", get(seat_memory))
        .route("/api/seats/{handle}/tools", get(seat_tools))
        .route("/api/seats/{handle}/approvals", get(approvals::list))
        .route(
            "/api/seats/{handle}/approvals/{approval_id}",
            post(approvals::answer).layer(DefaultBodyLimit::max(SMALL_BODY)),
        )
        .route("/api/memory", get(memory_overview))
}

/// Count and time one HTTP request by its route (the route's pattern, not
/// the path: a bounded label) and status.
async fn observe_http(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use crate::metrics::{self as m, Update};
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let began = std::time::Instant::now();
    let res = next.run(req).await;
    m::apply(&Update::Count {
        name: m::HTTP_REQUESTS,
        labels: vec![
            ("route", route.clone()),
            ("status", res.status().as_u16().to_string()),
        ],
        by: 1,
    });
    m::apply(&Update::Observe {
        name: m::HTTP_DURATION,
        labels: vec![("route", route)],
        value: began.elapsed().as_secs_f64(),
    });
    res
}

/// `GET /health`: `{"status": "ok"}` for anyone (liveness); the node's
/// detail — seats, stranded seats, their last errors, which agents write —
/// for a signed-in person or a bearer token.
async fn health(
    person: Option<Extension<app::api::Person>>,
    Extension(info): Extension<Arc<NodeInfo>>,
    Extension(engine): Extension<Arc<SeatEngine>>,
    Extension(turns): Extension<Arc<crate::engine::runtime::TurnEngine>>,
) -> axum::response::Response {
    if person.is_none() {
        return Json(serde_json::json!({ "status": "ok" })).into_response();
    }
    let status = engine.host().status();
    Json(Health {
        node: info.node_id.clone(),
        incarnation: info.incarnation.to_string(),
        version: crate::VERSION,
        protocol: info.protocol,
        seats: engine.host().held(),
        unproven_seconds: status
            .iter()
            .filter_map(|s| s.unproven_for.map(|d| (s.handle.clone(), d.as_secs())))
            .collect(),
        detached_runs: turns.supervisor().running(),
        last_errors: turns
            .seats()
            .into_iter()
            .filter_map(|s| s.last_error.map(|e| (s.handle, e)))
            .collect(),
    })
    .into_response()
}

async fn metrics(
    Extension(info): Extension<Arc<NodeInfo>>,
    Extension(engine): Extension<Arc<SeatEngine>>,
) -> impl IntoResponse {
    use crate::metrics::{self as m, Update};
    // What is read at the scrape rather than counted as it happens.
    let status = engine.host().status();
    let oldest = status
        .iter()
        .filter_map(|s| s.unproven_for)
        .max()
        .unwrap_or_default();
    let mut now = vec![
        Update::Set {
            name: m::SEATS_HELD,
            value: engine.host().held().len() as f64,
        },
        Update::Set {
            name: m::SEATS_UNPROVEN,
            value: engine.host().undead().len() as f64,
        },
        Update::Set {
            name: m::UNPROVEN_OLDEST,
            value: oldest.as_secs_f64(),
        },
    ];
    match engine.queue().dead_letter_count().await {
        Ok(n) => now.push(Update::Set {
            name: m::DEAD_LETTERS,
            value: n as f64,
        }),
        Err(e) => tracing::debug!(error = %e, "the dead letters cannot be counted for a scrape"),
    }
    // One scrape's gauges and its rendering together (a process running
    // several nodes, as the tests do, shares one recorder).
    static SCRAPE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let rendered = {
        let _one = SCRAPE.lock().unwrap_or_else(|e| e.into_inner());
        for u in &now {
            m::apply(u);
        }
        m::render()
    };
    let body = format!(
        "# HELP crewlet_up 1 while the node serves.\n# TYPE crewlet_up gauge\ncrewlet_up{{node=\"{node}\"}} 1\n\
         # HELP crewlet_build_info The node's version and lease protocol.\n# TYPE crewlet_build_info gauge\n\
         crewlet_build_info{{node=\"{node}\",version=\"{}\",protocol=\"{}\"}} 1\n{}",
        crate::VERSION,
        info.protocol,
        rendered,
        node = info.node_id,
    );
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
}

/// A body the size limit or the encoding refused, as a JSON answer saying
/// so; otherwise the body.
pub(crate) fn read_body(
    body: Result<String, StringRejection>,
) -> Result<String, Box<axum::response::Response>> {
    use axum::http::StatusCode;
    body.map_err(|e| {
        let (status, why) = match e.status() {
            StatusCode::PAYLOAD_TOO_LARGE => (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the body is too large for this route (envelopes at most {} KiB, sign-ins and seat actions at most {} KiB); send a smaller one",
                    LARGE_BODY / 1024,
                    SMALL_BODY / 1024
                ),
            ),
            s => (s, format!("the body cannot be read: {e}")),
        };
        Box::new((status, Json(serde_json::json!({ "error": why }))).into_response())
    })
}

pub(crate) fn console_error(e: app::console::ConsoleError) -> axum::response::Response {
    use app::console::ConsoleError;
    use axum::http::StatusCode;
    let status = match e {
        ConsoleError::Invalid(_) => StatusCode::BAD_REQUEST,
        ConsoleError::Forbidden(_) => StatusCode::FORBIDDEN,
        ConsoleError::NotFound(_) => StatusCode::NOT_FOUND,
        ConsoleError::Conflict(_) => StatusCode::CONFLICT,
        ConsoleError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    (status, Json(serde_json::json!({ "error": e.to_string() }))).into_response()
}

#[derive(serde::Deserialize)]
struct OutboxQuery {
    #[serde(default)]
    limit: Option<usize>,
}

/// `GET /api/seats/{handle}/outbox?limit=N`: what the seat posted, newest
/// first (default 50, at most 1000) — its replies and messages, on a
/// single node as on a fleet.
async fn seat_outbox(
    Extension(console): Extension<SharedConsole>,
    axum::extract::Path(handle): axum::extract::Path<String>,
    axum::extract::Query(q): axum::extract::Query<OutboxQuery>,
) -> axum::response::Response {
    let limit = q
        .limit
        .unwrap_or(app::api::SEAT_OUTBOX_SHOWN)
        .clamp(1, 1000);
    match console.outbox(&handle, limit).await {
        Ok(v) => Json(serde_json::json!({ "seat": handle, "effects": v })).into_response(),
        Err(e) => console_error(e),
    }
}

/// `GET /api/events/history?before=&seat=&node=&turn=&type=&noise=&limit=`:
/// one page of the events this node kept, newest first (docs/mail-and-turns.md § Events).
async fn event_history(
    Extension(console): Extension<SharedConsole>,
    axum::extract::Query(q): axum::extract::Query<HistoryParams>,
) -> axum::response::Response {
    let query = app::api::EventQuery {
        before: q.before,
        seat: q.seat,
        node: q.node,
        turn: q.turn,
        kind: q.kind,
        noise: q.noise,
        limit: q.limit,
    };
    match console.events(query).await {
        Ok(p) => Json(p).into_response(),
        Err(e) => console_error(e),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryParams {
    #[serde(default)]
    before: Option<u64>,
    #[serde(default)]
    seat: String,
    #[serde(default)]
    node: String,
    #[serde(default)]
    turn: String,
    #[serde(default, rename = "type")]
    kind: String,
    #[serde(default)]
    noise: bool,
    #[serde(default)]
    limit: u32,
}

#[derive(serde::Deserialize)]
struct DeadLetterQuery {
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    seat: Option<String>,
}

/// `GET /api/dead-letters?limit=N&seat=H`: the newest dead letters
/// (default 100, at most 1,000; only seat `H`'s when given), newest first,
/// as `{"letters": [{id, seat, subscription, subject, delivered, msg_id,
/// reason, payload, truncated, at}], "total"}`.
async fn dead_letters(
    Extension(console): Extension<SharedConsole>,
    axum::extract::Query(q): axum::extract::Query<DeadLetterQuery>,
) -> axum::response::Response {
    let limit = q.limit.unwrap_or(100);
    let seat = q.seat.as_deref().map(str::trim).filter(|s| !s.is_empty());
    match console.dead_letters(seat, limit).await {
        Ok(list) => Json(list).into_response(),
        Err(e) => console_error(e),
    }
}

/// `POST /api/dead-letters/{id}/requeue`: publish dead letter `id` again
/// to the inbox it was sent to (operators only; audited). Answers
/// `{"id", "result"}`; 404 when it is not there.
async fn requeue_dead_letter(
    Extension(console): Extension<SharedConsole>,
    Extension(person): Extension<app::api::Person>,
    axum::extract::Path(id): axum::extract::Path<u64>,
) -> axum::response::Response {
    match console.requeue_dead_letter(&person, id).await {
        Ok(done) => Json(done).into_response(),
        Err(e) => console_error(e),
    }
}

/// `POST /api/dead-letters/{id}/discard`: remove dead letter `id` for good
/// (operators only; audited). Answers `{"id", "result"}`; 404 when it is
/// not there.
async fn discard_dead_letter(
    Extension(console): Extension<SharedConsole>,
    Extension(person): Extension<app::api::Person>,
    axum::extract::Path(id): axum::extract::Path<u64>,
) -> axum::response::Response {
    match console.discard_dead_letter(&person, id).await {
        Ok(done) => Json(done).into_response(),
        Err(e) => console_error(e),
    }
}

/// `GET /query/fleet`. While the roster cannot be read: 503 carrying the
/// last roster read, marked stale (every node's status `unknown`).
async fn fleet(Extension(console): Extension<SharedConsole>) -> axum::response::Response {
    match console.fleet().await {
        Ok(f) if f.stale.is_some() => {
            (axum::http::StatusCode::SERVICE_UNAVAILABLE, Json(f)).into_response()
        }
        Ok(f) => Json(f).into_response(),
        Err(e) => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({ "error": e.to_string() })),
        )
            .into_response(),
    }
}

/// `GET /api/seats/{handle}/memory`: the seat's memory, answered by its
/// holder (docs/http-and-cli.md § HTTP). 404 for a seat not in the active company.
async fn seat_memory(
    Extension(console): Extension<SharedConsole>,
    axum::extract::Path(handle): axum::extract::Path<String>,
) -> axum::response::Response {
    match console.memory(&handle).await {
        Ok(m) => Json(m).into_response(),
        Err(e) => console_error(e),
    }
}

/// `GET /api/seats/{handle}/tools`: the seat's tools with their
/// annotations, as this node tells its agent (docs/agents.md § Tools).
/// 404 for a seat not in the active company; `held_here: false` (and no
/// MCP tools) when another node holds it.
async fn seat_tools(
    Extension(info): Extension<Arc<NodeInfo>>,
    Extension(engine): Extension<Arc<SeatEngine>>,
    Extension(turns): Extension<Arc<crate::engine::runtime::TurnEngine>>,
    axum::extract::Path(handle): axum::extract::Path<String>,
) -> axum::response::Response {
    let company = engine.company();
    let Some(role) = company.roles.iter().find(|r| r.handle == handle) else {
        return console_error(app::console::ConsoleError::NotFound(format!(
            "seat {handle:?} is not in the active company; check the handle (the Seats page lists them)."
        )));
    };
    let held_here = engine.host().held().contains(&handle);
    Json(serde_json::json!({
        "seat": handle,
        "node": info.node_id,
        "held_here": held_here,
        "servers": role.mcp.iter().map(|m| m.name.clone()).collect::<Vec<_>>(),
        "tools": if held_here { turns.tool_surface(&handle) } else { Vec::new() },
    }))
    .into_response()
}

/// `GET /api/memory`: every seat's rows per table in one round, with the
/// holders that answered and those that did not.
async fn memory_overview(Extension(console): Extension<SharedConsole>) -> axum::response::Response {
    match console.memory_overview().await {
        Ok(o) => Json(o).into_response(),
        Err(e) => console_error(e),
    }
}
