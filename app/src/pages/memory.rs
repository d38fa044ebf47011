//! Memory: a seat's memory — diary, episodes, counterparty profiles,
//! skills and their versions, onboarding markers, conversations — answered
//! by the node that holds the seat, saying who answered ("answered by
//! node-b (holder, epoch 7)"), that nobody holds it, or why its holder's
//! copy cannot be had right now (never shown as empty). Below it, the
//! overview: every seat's rows per table in one round, and which holders
//! answered. Refreshed live from the event stream.
//!
//! The address carries the seat read and the overview's search and page
//! (`/memory?seat=alpha&q=al&page=2`).

use leptos::prelude::*;
use leptos_router::components::Form;
use leptos_router::hooks::use_query_map;

use crate::api::{
    ConversationRow, CounterpartyRow, DiaryRow, EpisodeRow, HolderCoverage, MEMORY_ROWS_SHOWN,
    MarkerRow, MemoryAnswer, MemoryCounts, MemoryOverviewPage, SeatMemoryCounts, SeatMemoryRead,
    SeatMemoryRows, SkillRow, SkillVersionRow,
};
use crate::components::notice::ErrorNotice;
use crate::components::pager::Pager;
use crate::error::AppError;
use crate::fns::{memory_overview, seat_memory};
use crate::live::{LiveBadge, MEMORY_EVENTS, refetch_on};

/// `2026-11-30 08:15` from an RFC 3339 timestamp (UTC, as the node writes
/// them).
fn when(at: &str) -> String {
    match (at.get(0..10), at.get(11..16)) {
        (Some(day), Some(time)) => format!("{day} {time}"),
        _ => at.to_string(),
    }
}

/// The sentence with its first letter in capitals.
fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(first) => first.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

fn memory_href(seat: &str, query: &str, page: u32) -> String {
    super::page_href("/memory", &[("seat", seat), ("q", query)], page)
}

#[component]
pub fn MemoryPage() -> impl IntoView {
    let query = use_query_map();
    let seat = move || query.with(|q| q.get("seat").unwrap_or_default());
    let text = move || query.with(|q| q.get("q").unwrap_or_default());
    let page = move || query.with(super::page_param);
    let read = Resource::new(seat, |h| async move {
        if h.trim().is_empty() {
            None
        } else {
            Some(seat_memory(h).await)
        }
    });
    let overview = Resource::new(move || (text(), page()), |(q, p)| memory_overview(q, p));
    // Memory changes when a turn ends, and its holder when a seat moves.
    let live = refetch_on(
        MEMORY_EVENTS,
        |_| true,
        move || {
            read.refetch();
            overview.refetch();
        },
    );

    view! {
        <section class="page memory">
            <div class="page-head">
                <leptos_meta::Title text="Memory" />
                <h1>"Memory"</h1>
                <LiveBadge state=live />
            </div>
            <p class="muted">
                "A seat's memory lives on the node that holds it, so that node answers for it. "
                "Pick a seat below, or type its handle."
            </p>
            <Form method="get" action="/memory" attr:class="filters">
                <label for="memory-seat">"Seat"</label>
                <input
                    id="memory-seat"
                    type="search"
                    name="seat"
                    placeholder="handle"
                    maxlength="200"
                    autocomplete="off"
                    value=seat
                />
                <input type="hidden" name="q" value=text />
                <button type="submit">"Read its memory"</button>
            </Form>
            <Transition fallback=|| view! { <p class="muted">"Asking the seat's holder…"</p> }>
                {move || {
                    read.get()
                        .flatten()
                        .map(|r| match r {
                            Ok(m) => view! { <SeatMemory read=m /> }.into_any(),
                            Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
                        })
                }}
            </Transition>

            <OverviewSection overview seat=Signal::derive(seat) text=Signal::derive(text) />
        </section>
    }
}

/// Every seat's rows per table, searchable and paged, and which holders
/// answered.
#[component]
fn OverviewSection(
    overview: Resource<Result<MemoryOverviewPage, AppError>>,
    seat: Signal<String>,
    text: Signal<String>,
) -> impl IntoView {
    view! {
        <h2 id="overview-title">"Every seat"</h2>
        <Form method="get" action="/memory" attr:class="filters">
            <input type="hidden" name="seat" value=seat />
            <label for="memory-q">"Search"</label>
            <input
                id="memory-q"
                type="search"
                name="q"
                placeholder="handle"
                maxlength="200"
                value=text
            />
            <button type="submit">"Filter"</button>
        </Form>
        <Transition fallback=|| view! { <p class="muted">"Asking every holder…"</p> }>
            {move || {
                overview
                    .get()
                    .map(|r| match r {
                        Ok(o) => view! { <OverviewSummary overview=o /> }.into_any(),
                        Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
                    })
            }}
            <OverviewTable overview seat text />
            {move || {
                overview
                    .get()
                    .and_then(|r| r.ok())
                    .map(|o| {
                        let (seat, query) = (seat.get(), text.get());
                        view! {
                            <Pager
                                label="Overview pages"
                                page=o.page
                                pages=o.pages
                                matching=o.matching
                                href=move |p| memory_href(&seat, &query, p)
                            />
                        }
                    })
            }}
        </Transition>
    }
}

/// The overview's table: a row per seat, its rows per table and who
/// answered.
#[component]
fn OverviewTable(
    overview: Resource<Result<MemoryOverviewPage, AppError>>,
    seat: Signal<String>,
    text: Signal<String>,
) -> impl IntoView {
    let rows = move || {
        overview
            .get()
            .and_then(|r| r.ok())
            .map(|o| o.seats)
            .unwrap_or_default()
    };

    view! {
        // Rows are keyed by their content: a refresh replaces only the
        // rows that changed, so the others keep their place and focus.
        <div class="table-wrap" hidden=move || rows().is_empty()>
            <table class="memory-overview stack-table" aria-labelledby="overview-title">
                <thead>
                    <tr>
                        <th scope="col">"Seat"</th>
                        <th scope="col">"Answered by"</th>
                        {MemoryCounts::default()
                            .named()
                            .into_iter()
                            .map(|(name, _)| view! { <th scope="col" class="num">{name}</th> })
                            .collect_view()}
                    </tr>
                </thead>
                <tbody>
                    <For each=rows key=|r| format!("{r:?}") let:r>
                        <OverviewRow row=r selected=seat query=text />
                    </For>
                </tbody>
            </table>
        </div>
    }
}

/// One seat's memory, or why it cannot be shown.
#[component]
fn SeatMemory(read: SeatMemoryRead) -> impl IntoView {
    let who = capitalised(&read.who_answered());
    let state = read.state();
    let handle = read.handle().to_string();
    let body = match read {
        MemoryAnswer::Held {
            memory,
            answered_by,
            ..
        } => view! {
            <p class="answered" role="status" data-answered-by=answered_by.node_id>{who}"."</p>
            <MemoryTables memory=memory />
        }
        .into_any(),
        MemoryAnswer::Unheld { answered_by, .. } => view! {
            <div class="notice notice-info answered" data-answered-by="">
                <p><strong>{who}"."</strong></p>
                <p>
                    "Its memory is not shown: the copies nodes kept from earlier tenures are of unknown age, "
                    "and a copy of unknown age is not the seat's memory. The node that takes the seat next answers for it. "
                </p>
                <p class="muted small">{format!("Asked {}.", answered_by.node_id)}</p>
            </div>
        }
        .into_any(),
        MemoryAnswer::Unavailable {
            holder,
            answered_by,
            reason,
            why,
            ..
        } => view! {
            <div class="notice notice-error answered" role="alert" data-reason=reason.kind() title=why>
                <p><strong>{who}"."</strong></p>
                <p>
                    {format!(
                        "The seat's memory cannot be read right now — it is unavailable, not empty. {} holds it (epoch {}); asked {}.",
                        holder.node_id, holder.epoch, answered_by.node_id,
                    )}
                </p>
            </div>
        }
        .into_any(),
    };
    let title = handle.clone();
    view! {
        <section class="memory-seat" data-seat=handle data-state=state aria-labelledby="memory-seat-title">
            <h2 id="memory-seat-title" class="mono">{title}</h2>
            {body}
        </section>
    }
}

/// A table of one kind of memory row.
struct Table {
    title: &'static str,
    slug: &'static str,
    headers: &'static [&'static str],
    rows: Vec<(String, Vec<String>)>,
}

fn opt(s: &Option<String>) -> String {
    s.clone()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "—".into())
}

fn tables(m: SeatMemoryRows) -> Vec<Table> {
    vec![
        diary_table(m.diary),
        episodes_table(m.episodes),
        counterparty_profiles_table(m.counterparty_profiles),
        skills_table(m.skills),
        skill_versions_table(m.skill_versions),
        onboarding_markers_table(m.onboarding_markers),
        conversations_table(m.conversations),
    ]
}

fn diary_table(rows: Vec<DiaryRow>) -> Table {
    Table {
        title: "Diary",
        slug: "diary",
        headers: &["Written", "Note", "Work key", "Expires"],
        rows: rows
            .into_iter()
            .map(|r| {
                let expires = r.expires_at.as_deref().map(when);
                (
                    r.id,
                    vec![
                        when(&r.created_at),
                        r.content,
                        opt(&r.work_key),
                        opt(&expires),
                    ],
                )
            })
            .collect(),
    }
}

fn episodes_table(rows: Vec<EpisodeRow>) -> Table {
    Table {
        title: "Episodes",
        slug: "episodes",
        headers: &["When", "Summary", "Work key", "Turn"],
        rows: rows
            .into_iter()
            .map(|r| {
                (
                    r.id,
                    vec![when(&r.created_at), r.summary, opt(&r.work_key), r.turn_id],
                )
            })
            .collect(),
    }
}

fn counterparty_profiles_table(rows: Vec<CounterpartyRow>) -> Table {
    Table {
        title: "Counterparty profiles",
        slug: "counterparty_profiles",
        headers: &["Counterparty", "Interactions", "Last work key", "Updated"],
        rows: rows
            .into_iter()
            .map(|r| {
                (
                    r.id,
                    vec![
                        r.counterparty,
                        r.interaction_count.to_string(),
                        opt(&r.last_work_key),
                        when(&r.updated_at),
                    ],
                )
            })
            .collect(),
    }
}

fn skills_table(rows: Vec<SkillRow>) -> Table {
    Table {
        title: "Skills",
        slug: "skills",
        headers: &["Skill", "State", "Uses", "Updated"],
        rows: rows
            .into_iter()
            .map(|r| {
                (
                    r.id,
                    vec![
                        r.name,
                        r.state,
                        r.use_count.to_string(),
                        when(&r.updated_at),
                    ],
                )
            })
            .collect(),
    }
}

fn skill_versions_table(rows: Vec<SkillVersionRow>) -> Table {
    Table {
        title: "Skill versions",
        slug: "skill_versions",
        headers: &["Skill", "Version", "Body", "Written"],
        rows: rows
            .into_iter()
            .map(|r| {
                (
                    r.id,
                    vec![
                        r.skill_name,
                        r.version.to_string(),
                        r.body,
                        when(&r.created_at),
                    ],
                )
            })
            .collect(),
    }
}

fn onboarding_markers_table(rows: Vec<MarkerRow>) -> Table {
    Table {
        title: "Onboarding markers",
        slug: "onboarding_markers",
        headers: &["Marker", "Value", "Updated"],
        rows: rows
            .into_iter()
            .map(|r| (r.id, vec![r.marker, r.value, when(&r.updated_at)]))
            .collect(),
    }
}

fn conversations_table(rows: Vec<ConversationRow>) -> Table {
    Table {
        title: "Conversations",
        slug: "conversations",
        headers: &["When", "Thread", "Author", "Text"],
        rows: rows
            .into_iter()
            .map(|r| (r.id, vec![when(&r.at), r.thread, r.author, r.text]))
            .collect(),
    }
}

#[component]
fn MemoryTables(memory: SeatMemoryRows) -> impl IntoView {
    view! {
        <p class="muted small">
            {format!("Newest first; at most {MEMORY_ROWS_SHOWN} rows of each kind are shown.")}
        </p>
        <nav class="memory-jump" aria-label="Kinds of memory">
            {tables(memory.clone())
                .into_iter()
                .map(|t| {
                    view! { <a href=format!("#memory-{}", t.slug)>{format!("{} ({})", t.title, t.rows.len())}</a> }
                })
                .collect_view()}
        </nav>
        {tables(memory).into_iter().map(|t| view! { <MemoryTable table=t /> }).collect_view()}
    }
}

#[component]
fn MemoryTable(table: Table) -> impl IntoView {
    let Table {
        title,
        slug,
        headers,
        rows,
    } = table;
    let id = format!("memory-{slug}");
    let labelled_by = id.clone();
    let count = rows.len();
    view! {
        <section class="memory-kind" data-kind=slug aria-labelledby=labelled_by>
            <h3 id=id>{title} " " <span class="muted small">{format!("({count})")}</span></h3>
            {if rows.is_empty() {
                view! { <p class="muted">"None."</p> }.into_any()
            } else {
                view! {
                    <div class="table-wrap">
                        <table class="memory-rows stack-table">
                            <thead>
                                <tr>
                                    {headers.iter().map(|h| view! { <th scope="col">{*h}</th> }).collect_view()}
                                </tr>
                            </thead>
                            <tbody>
                                {rows
                                    .into_iter()
                                    .map(|(id, cells)| {
                                        view! {
                                            <tr data-id=id>
                                                {cells
                                                    .into_iter()
                                                    .zip(headers.iter())
                                                    .map(|(c, h)| view! { <td data-label=*h>{c}</td> })
                                                    .collect_view()}
                                            </tr>
                                        }
                                    })
                                    .collect_view()}
                            </tbody>
                        </table>
                    </div>
                }
                    .into_any()
            }}
        </section>
    }
}

fn holder_names(list: &[HolderCoverage]) -> String {
    list.iter()
        .map(|h| {
            if h.local {
                format!("{} (this node)", h.node_id)
            } else {
                h.node_id.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[component]
fn OverviewSummary(overview: MemoryOverviewPage) -> impl IntoView {
    let o = overview;
    let answered = o.coverage.answered.len();
    let unanswered = o.coverage.unanswered.clone();
    let holders = answered + unanswered.len();
    let summary = format!(
        "{} seat{} · {} held · {} nobody holds · {} unavailable · {} rows · answered by {}",
        o.total,
        if o.total == 1 { "" } else { "s" },
        o.held,
        o.unheld,
        o.unavailable,
        o.rows.total(),
        o.node_id,
    );
    let coverage = if holders == 0 {
        "Coverage: no node holds a seat, so no holder was asked.".to_string()
    } else {
        format!(
            "Coverage: {answered} of {holders} holder{} answered — {}.",
            if holders == 1 { "" } else { "s" },
            if answered == 0 {
                "none".to_string()
            } else {
                holder_names(&o.coverage.answered)
            }
        )
    };
    let none = o.seats.is_empty();
    view! {
        <p class="muted">{summary}</p>
        <p class="coverage" data-answered=answered data-unanswered=unanswered.len()>{coverage}</p>
        {(!unanswered.is_empty())
            .then(|| {
                view! {
                    <div class="notice notice-error" role="alert">
                        <p><strong>"Not every holder answered: their seats read unavailable, not empty."</strong></p>
                        <ul class="unanswered">
                            {unanswered
                                .into_iter()
                                .map(|h| {
                                    let what = h
                                        .reason
                                        .as_ref()
                                        .map(|r| r.sentence())
                                        .unwrap_or_else(|| "did not answer".into());
                                    let n = h.seats.len();
                                    view! {
                                        <li data-node=h.node_id.clone() title=h.why.clone().unwrap_or_default()>
                                            {format!(
                                                "{} {what} ({n} seat{})",
                                                h.node_id,
                                                if n == 1 { "" } else { "s" },
                                            )}
                                        </li>
                                    }
                                })
                                .collect_view()}
                        </ul>
                    </div>
                }
            })}
        {none.then(|| view! { <p class="muted">"No seat matches."</p> })}
    }
}

#[component]
fn OverviewRow(
    row: SeatMemoryCounts,
    selected: Signal<String>,
    query: Signal<String>,
) -> impl IntoView {
    let handle = row.handle().to_string();
    let state = row.state();
    let href = {
        let handle = handle.clone();
        move || memory_href(&handle, &query.get(), 1)
    };
    let current = {
        let handle = handle.clone();
        move || (selected.get() == handle).then_some("true")
    };
    let (answer, counts): (AnyView, Option<MemoryCounts>) = match &row {
        MemoryAnswer::Held {
            answered_by,
            holder,
            memory,
            ..
        } => (
            view! {
                <span>{answered_by.node_id.clone()}</span>
                <div class="muted small">{format!("holder · epoch {}", holder.epoch)}</div>
            }
            .into_any(),
            Some(*memory),
        ),
        MemoryAnswer::Unheld { .. } => (
            view! { <span class="muted">"nobody holds it"</span> }.into_any(),
            None,
        ),
        MemoryAnswer::Unavailable { .. } => (
            view! { <span class="bad small">{capitalised(&row.who_answered())}</span> }.into_any(),
            None,
        ),
    };
    view! {
        <tr data-seat=handle.clone() data-state=state>
            <td data-label="Seat">
                <a class="mono" href=href aria-current=current>{handle.clone()}</a>
            </td>
            <td data-label="Answered by">{answer}</td>
            {MemoryCounts::default()
                .named()
                .into_iter()
                .enumerate()
                .map(|(i, (name, _))| {
                    let n = counts.map(|c| c.named()[i].1.to_string()).unwrap_or_else(|| "—".into());
                    view! { <td data-label=name class="num">{n}</td> }
                })
                .collect_view()}
        </tr>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_addresses_read_well() {
        assert_eq!(when("2026-11-30T08:15:42Z"), "2026-11-30 08:15");
        assert_eq!(when("soon"), "soon");
        assert_eq!(capitalised("answered by n1"), "Answered by n1");
        assert_eq!(memory_href("", "", 1), "/memory");
        assert_eq!(memory_href("a b", "x", 2), "/memory?seat=a%20b&q=x&page=2");
    }
}
