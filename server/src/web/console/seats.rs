//! The seat list and one seat's page: every row read in full (lease,
//! pause, turns, runs, approvals, spend, tool servers), and a seat's
//! timeline, outbox, activity and inbox depth over the last hour.

use app::api::{EffectView, EventQuery, SeatDetail, SeatList, SeatQuery, SeatRow};
use app::console::{Console, ConsoleError};

use crate::company::Company;
use crate::web::seats::{SeatFacts, page_of, pause_record, seat_rows};
use crate::web::unavailable::unavailable;

use super::NodeConsole;

/// One page of the seats matching `query` (only seat `only`, when
/// given), each row read in full.
pub(super) async fn page(
    c: &NodeConsole,
    query: SeatQuery,
    only: Option<&str>,
) -> Result<SeatList, ConsoleError> {
    let company = c.engine.company();
    let rows = all_rows(c, &company).await?;
    let total = rows.len();
    let rows = match only {
        Some(h) => rows.into_iter().filter(|r| r.handle == h).collect(),
        None => rows,
    };
    let mut paged = page_of(rows, &query);
    fill_rows(c, &company, &mut paged.rows).await;
    Ok(SeatList {
        answered_by: c.info.node_id.clone(),
        company: company.name.clone(),
        revision: company.revision,
        total,
        matching: paged.matching,
        page: paged.page,
        pages: paged.pages,
        page_size: app::api::SEAT_PAGE_SIZE,
        counts: paged.counts,
        rows: paged.rows,
    })
}

/// Every seat's row, from the leases and pauses read once and what this
/// node knows of the seats it holds.
async fn all_rows(c: &NodeConsole, company: &Company) -> Result<Vec<SeatRow>, ConsoleError> {
    let store = c.engine.store();
    let (leases, pauses) = futures::join!(
        store.view("seat:"),
        store.entries(crate::coord::StateBucket::Pauses, "")
    );
    let leases = leases.map_err(|e| unavailable("read the seat leases", e))?;
    let pauses = pauses
        .map_err(|e| unavailable("read the pauses", e))?
        .into_iter()
        .map(|e| {
            let record = pause_record(&e.key, &e.value);
            (e.key, record)
        })
        .collect();
    let local = c.engine.host().status();
    let turns = c.turns.seats();
    let local_errors = turns
        .iter()
        .filter_map(|s| s.last_error.clone().map(|e| (s.handle.clone(), e)))
        .collect();
    let local_running = turns
        .into_iter()
        .filter_map(|s| s.running_turn.map(|t| (s.handle, t)))
        .collect();
    let notes = c.notes.snapshot();
    Ok(seat_rows(&SeatFacts {
        roles: &company.roles,
        leases: &leases,
        pauses: &pauses,
        me: c.info.incarnation.as_str(),
        local: &local,
        local_errors: &local_errors,
        local_running: &local_running,
        notes: &notes,
    }))
}

/// The page's rows filled in: inbox depth, detached runs, pending
/// approvals, spend, where Move… may go and the tool servers, each read
/// all at once for the page's seats only.
async fn fill_rows(c: &NodeConsole, company: &Company, rows: &mut [SeatRow]) {
    // Inbox depth for the page's seats only, asked all at once.
    let queue = c.engine.queue();
    let depths = futures::future::join_all(rows.iter().map(|r| {
        let group = crate::queue::inbox_group(&r.handle);
        async move { queue.pending(&group).await.ok() }
    }))
    .await;
    // The detached runs of the page's seats only, read all at once; a
    // seat whose runs cannot be read shows none.
    let runs = c.turns.runs();
    let records = futures::future::join_all(
        rows.iter()
            .map(|r| async move { runs.list(&r.handle).await.ok() }),
    )
    .await;
    let handles: Vec<String> = rows.iter().map(|r| r.handle.clone()).collect();
    let approvals = crate::web::approvals::pending_of(c.turns.approvals(), &handles).await;
    let spends = futures::future::join_all(rows.iter().map(|r| c.turns.spend(&r.handle))).await;
    // Whether Move… has anywhere to go: the live nodes, read once.
    let live = crate::seat::moves::live_targets(&**c.engine.store())
        .await
        .ok();
    for (row, spend) in rows.iter_mut().zip(spends) {
        row.spend = spend.map(|(windows, held)| app::api::SeatSpendView { windows, held });
        let role = company.roles.iter().find(|r| r.handle == row.handle);
        if let (Some(role), Some(live)) = (role, live.as_deref()) {
            row.move_blocked = crate::seat::moves::move_blocked(
                &row.handle,
                &role.placement,
                live,
                row.holder.as_ref().map(|h| h.node_id.as_str()),
            );
        }
        let here = c.turns.tool_server_states(&row.handle);
        row.tool_servers = crate::web::seats::tool_server_views(
            role.map(|r| r.mcp.as_slice()).unwrap_or_default(),
            here.as_deref(),
            row.holder.as_ref().map(|h| h.node_id.as_str()),
        );
    }
    for (((row, depth), records), approvals) in
        rows.iter_mut().zip(depths).zip(records).zip(approvals)
    {
        row.approvals = approvals;
        row.pending = depth;
        row.runs = crate::web::seats::run_views(
            records
                .unwrap_or_default()
                .into_iter()
                .map(|(r, _)| r)
                .collect(),
        );
    }
}

/// A seat's inbox depth over `hour`, from the node that holds it
/// (nothing when no node does; why, when its holder cannot say).
async fn inbox_hour(
    c: &NodeConsole,
    handle: &str,
    hour: &[String],
) -> Result<Vec<app::api::InboxMinute>, InboxHourError> {
    let lease = c
        .engine
        .store()
        .lease(&format!("seat:{handle}"))
        .await
        .map_err(InboxHourError::Holder)?;
    match lease {
        None => Ok(Vec::new()),
        Some(l) => c
            .trends
            .seat_inbox(handle, &l.owner, hour)
            .await
            .map_err(InboxHourError::Samples),
    }
}

/// Why a seat's inbox hour is not shown (the page says so in its place).
#[derive(Debug, thiserror::Error)]
enum InboxHourError {
    #[error("the seat's holder cannot be read: {0}")]
    Holder(crate::coord::StoreError),
    #[error("its holder's samples cannot be had: {0}")]
    Samples(crate::trends::NoReply),
}

pub(super) async fn detail(
    c: &NodeConsole,
    handle: &str,
    before: Option<u64>,
) -> Result<SeatDetail, ConsoleError> {
    c.company_seat(handle)?;
    let list = super::seats::page(c, SeatQuery::default(), Some(handle)).await?;
    let row = list.rows.into_iter().next().ok_or_else(|| {
        ConsoleError::NotFound(format!("no seat {handle:?} in the active company"))
    })?;
    let timeline = c.events(EventQuery {
        before,
        seat: handle.to_string(),
        limit: app::api::EVENT_PAGE,
        ..Default::default()
    });
    let actions = c.fleet_audit.read_about(100, Some(handle));
    let outbox = c.outbox(handle, app::api::SEAT_OUTBOX_SHOWN);
    // The last hour, on this node's clock.
    let minutes = crate::trends::hour_to(time::OffsetDateTime::now_utc());
    let activity_to = minutes.last().cloned().unwrap_or_default();
    let activity = c.history.activity(handle, &minutes[0]);
    let inbox = inbox_hour(c, handle, &minutes);
    let (timeline, actions, outbox, activity, inbox) =
        futures::join!(timeline, actions, outbox, activity, inbox);
    let (inbox, inbox_error) = match inbox {
        Ok(v) => (v, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let (outbox, outbox_error) = match outbox {
        Ok(v) => (v, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    Ok(SeatDetail {
        row,
        company: list.company,
        timeline: timeline?,
        actions: actions.map(|a| a.entries).unwrap_or_default(),
        outbox,
        outbox_error,
        activity: crate::web::history::fill_minutes(
            &minutes,
            activity.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "a seat's activity cannot be read");
                Vec::new()
            }),
        ),
        activity_to,
        inbox,
        inbox_error,
    })
}

pub(super) async fn outbox(
    c: &NodeConsole,
    handle: &str,
    limit: usize,
) -> Result<Vec<EffectView>, ConsoleError> {
    c.company_seat(handle)?;
    let effects = c
        .turns
        .outbox()
        .recent(handle, limit.clamp(1, 1000))
        .await
        .map_err(|e| unavailable("read the outbox", e))?;
    Ok(effects
        .into_iter()
        .map(crate::web::seats::effect_view)
        .collect())
}
