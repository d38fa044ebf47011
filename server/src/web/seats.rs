//! The Seats page's rows: every seat of the active company revision with
//! its holder, state, pause and last turn error, built from one read of
//! the seat leases and one of the pauses (pure, here), then filtered and
//! paged so that only the page's seats have their inbox depth read.

use std::collections::HashMap;

use app::api::{
    SEAT_PAGE_SIZE, SeatHolder, SeatPauseView, SeatQuery, SeatRow, SeatRunView, SeatState,
};

use crate::config::{PlacementConfig, RoleConfig};
use crate::coord::{Lease, LeaseState};
use crate::engine::pause::PauseRecord;
use crate::engine::runs::RunRecord;
use crate::seat::host::{Phase, SeatStatus};
use crate::web::live::SeatNote;

/// Everything a row is built from.
pub struct SeatFacts<'a> {
    pub roles: &'a [RoleConfig],
    /// Live seat leases (`seat:{handle}`).
    pub leases: &'a [Lease],
    pub pauses: &'a HashMap<String, PauseRecord>,
    /// This node's incarnation (the owner of the leases it holds).
    pub me: &'a str,
    /// What this node's seat host says of the seats it holds.
    pub local: &'a [SeatStatus],
    /// The last error of each seat whose turns run here.
    pub local_errors: &'a HashMap<String, String>,
    /// The turn running now in each seat whose turns run here.
    pub local_running: &'a HashMap<String, String>,
    /// What the fleet's events said of seats held anywhere.
    pub notes: &'a HashMap<String, SeatNote>,
}

/// `node-1` from `node-1:0a1b2c3d`.
pub fn node_of(incarnation: &str) -> &str {
    incarnation
        .rsplit_once(':')
        .map_or(incarnation, |(node, _)| node)
}

/// A role's placement in words.
pub fn placement_text(p: &PlacementConfig) -> String {
    let mut parts = Vec::new();
    if !p.nodes.is_empty() {
        let word = if p.nodes.len() == 1 { "node" } else { "nodes" };
        parts.push(format!("{word} {}", p.nodes.join(", ")));
    }
    if !p.labels.is_empty() {
        let word = if p.labels.len() == 1 {
            "label"
        } else {
            "labels"
        };
        parts.push(format!("{word} {}", p.labels.join(", ")));
    }
    if parts.is_empty() {
        "any node".to_string()
    } else {
        parts.join(" · ")
    }
}

/// A pause record as kept in `crewlet_pauses`. One nobody can read still
/// says "paused", as the seat's holder reads it (holding mail is the safe
/// reading).
pub fn pause_record(handle: &str, value: &[u8]) -> PauseRecord {
    serde_json::from_slice(value).unwrap_or_else(|e| {
        tracing::warn!(seat = handle, error = %e, "an unreadable pause record; showing the seat as paused");
        PauseRecord {
            by: "unknown".into(),
            at: String::new(),
            reason: Some("unreadable pause record".into()),
            stop_running_turn: false,
        }
    })
}

/// Every seat of `facts.roles`, sorted by handle, inbox depth not read.
pub fn seat_rows(facts: &SeatFacts<'_>) -> Vec<SeatRow> {
    let leases: HashMap<&str, &Lease> = facts
        .leases
        .iter()
        .filter_map(|l| l.resource.strip_prefix("seat:").map(|h| (h, l)))
        .collect();
    let local: HashMap<&str, &SeatStatus> =
        facts.local.iter().map(|s| (s.handle.as_str(), s)).collect();
    let mut rows: Vec<SeatRow> = facts
        .roles
        .iter()
        .map(|role| {
            let handle = role.handle.as_str();
            let lease = leases.get(handle).copied();
            let mine = lease.is_some_and(|l| l.owner == facts.me);
            let here = local
                .get(handle)
                .copied()
                .filter(|s| mine && lease.is_some_and(|l| l.epoch == s.epoch));
            let note = facts.notes.get(handle);
            let holder = lease.map(|l| SeatHolder {
                node_id: node_of(&l.owner).to_string(),
                incarnation: l.owner.clone(),
                epoch: l.epoch,
                since: l.acquired_at.to_string(),
            });
            let undead = here.is_some_and(|s| s.phase == Phase::Undead)
                || match (lease, note.and_then(|n| n.unproven.as_ref())) {
                    (Some(l), Some((node, epoch))) => {
                        node == node_of(&l.owner) && *epoch == l.epoch
                    }
                    _ => false,
                };
            let pause = facts.pauses.get(handle);
            let state = if undead {
                SeatState::Undead
            } else if pause.is_some() {
                SeatState::Paused
            } else if here.is_some_and(|s| s.phase == Phase::Establishing)
                || lease.is_some_and(|l| l.state == LeaseState::Claiming)
            {
                SeatState::Establishing
            } else if lease.is_some() {
                SeatState::Attached
            } else {
                SeatState::Unowned
            };
            let (last_error, last_error_node) = match facts.local_errors.get(handle) {
                Some(e) if mine => (Some(e.clone()), Some(node_of(facts.me).to_string())),
                _ => match note.and_then(|n| n.last_error.as_ref()) {
                    Some((node, e)) => (Some(e.clone()), Some(node.clone())),
                    None => (None, None),
                },
            };
            SeatRow {
                handle: handle.to_string(),
                placement: placement_text(&role.placement),
                holder,
                state,
                pending: None,
                pause: pause.map(|p| SeatPauseView {
                    by: p.by.clone(),
                    at: p.at.clone(),
                    reason: p.reason.clone(),
                    stop_running_turn: p.stop_running_turn,
                }),
                last_error,
                last_error_node,
                // This node's own engine for the seats it holds; for a
                // peer's, the fleet's turn events of the holder's tenure.
                running_turn: if mine {
                    facts.local_running.get(handle).cloned()
                } else {
                    note.and_then(|n| n.running_turn.as_ref())
                        .filter(|(node, epoch, _)| {
                            lease.is_some_and(|l| node == node_of(&l.owner) && *epoch == l.epoch)
                        })
                        .map(|(_, _, turn)| turn.clone())
                },
                runs: Vec::new(),
                tool_servers: Vec::new(),
                spend: None,
                approvals: Vec::new(),
                move_blocked: None,
            }
        })
        .collect();
    rows.sort_by(|a, b| a.handle.cmp(&b.handle));
    rows
}

/// A seat's run records as its row shows them: live runs first, then by
/// run id.
pub fn run_views(records: Vec<RunRecord>) -> Vec<SeatRunView> {
    let mut records = records;
    records.sort_by(|a, b| (!a.state.is_live(), &a.run_id).cmp(&(!b.state.is_live(), &b.run_id)));
    records
        .into_iter()
        .map(|r| SeatRunView {
            state: serde_json::to_value(r.state)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            run_id: r.run_id,
            launcher_node: r.launcher_node,
        })
        .collect()
}

/// A role's tool servers as its row shows them: `here` is this node's
/// reading of them (name, up, tools) when it holds the seat; otherwise
/// they run on `holder`, or nowhere.
pub fn tool_server_views(
    cfgs: &[crate::config::McpServerConfig],
    here: Option<&[(String, bool, usize)]>,
    holder: Option<&str>,
) -> Vec<app::api::ToolServerView> {
    cfgs.iter()
        .map(|c| {
            let mine = here.and_then(|h| h.iter().find(|(n, _, _)| *n == c.name));
            let (state, tools) = match (mine, holder) {
                (Some((_, true, n)), _) => ("running".to_string(), Some(*n)),
                (Some((_, false, n)), _) => ("down".to_string(), Some(*n)),
                (None, Some(node)) => (format!("on {node}"), None),
                (None, None) => ("not running".to_string(), None),
            };
            app::api::ToolServerView {
                name: c.name.clone(),
                transport: if c.url.is_some() { "http" } else { "stdio" }.into(),
                state,
                tools,
            }
        })
        .collect()
}

/// One page of `rows` matching `q`.
#[derive(Debug, PartialEq)]
pub struct Paged {
    pub rows: Vec<SeatRow>,
    pub matching: usize,
    pub page: u32,
    pub pages: u32,
    pub counts: Vec<(SeatState, usize)>,
}

/// Does `row` match the search text (already lower-cased and trimmed)?
fn matches(row: &SeatRow, text: &str) -> bool {
    text.is_empty()
        || row.handle.to_lowercase().contains(text)
        || row
            .holder
            .as_ref()
            .is_some_and(|h| h.node_id.to_lowercase().contains(text))
}

/// Filter `rows` by `q` and cut out its page (`SEAT_PAGE_SIZE` rows; a
/// page past the end is the last page).
pub fn page_of(rows: Vec<SeatRow>, q: &SeatQuery) -> Paged {
    let counts = SeatState::ALL
        .into_iter()
        .map(|st| (st, rows.iter().filter(|r| r.state == st).count()))
        .collect();
    let text = q.query.trim().to_lowercase();
    let matched: Vec<SeatRow> = rows
        .into_iter()
        .filter(|r| q.state.is_none_or(|st| r.state == st) && matches(r, &text))
        .collect();
    let matching = matched.len();
    let size = SEAT_PAGE_SIZE as usize;
    let pages = matching.div_ceil(size).max(1) as u32;
    let page = q.page.clamp(1, pages);
    let rows = matched
        .into_iter()
        .skip((page as usize - 1) * size)
        .take(size)
        .collect();
    Paged {
        rows,
        matching,
        page,
        pages,
        counts,
    }
}

/// An outbound effect as a person reads it.
pub fn effect_view(e: crate::engine::outbox::Effect) -> app::api::EffectView {
    app::api::EffectView {
        text: e
            .body
            .get("text")
            .and_then(|t| t.as_str())
            .map(str::to_string),
        body: e.body.to_string(),
        turn_id: e.turn_id,
        kind: e.kind,
        node: e.node,
        epoch: e.epoch,
        trigger_ids: e.trigger_ids,
        at: e.at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::StoreTime;
    use crate::engine::runs::RunState;

    fn role(handle: &str) -> RoleConfig {
        RoleConfig {
            handle: handle.into(),
            agent: Default::default(),
            placement: PlacementConfig::default(),
            mcp: Vec::new(),
            ..Default::default()
        }
    }

    fn lease(handle: &str, owner: &str, epoch: u64) -> Lease {
        Lease {
            resource: format!("seat:{handle}"),
            owner: owner.into(),
            epoch,
            acquired_at: StoreTime::from_unix_nanos(0),
            expires_at: StoreTime::from_unix_nanos(0),
            preferred: String::new(),
            protocol: 4,
            state: LeaseState::Held,
            metadata: Default::default(),
            revision: 1,
            ttl: std::time::Duration::from_secs(45),
            claim: String::new(),
            offer: None,
        }
    }

    fn pause(by: &str) -> PauseRecord {
        PauseRecord {
            by: by.into(),
            at: "2026-11-30T08:15:00Z".into(),
            reason: Some("keys".into()),
            stop_running_turn: false,
        }
    }

    struct World {
        roles: Vec<RoleConfig>,
        leases: Vec<Lease>,
        pauses: HashMap<String, PauseRecord>,
        local: Vec<SeatStatus>,
        local_errors: HashMap<String, String>,
        local_running: HashMap<String, String>,
        notes: HashMap<String, SeatNote>,
    }

    impl World {
        fn rows(&self) -> Vec<SeatRow> {
            seat_rows(&SeatFacts {
                roles: &self.roles,
                leases: &self.leases,
                pauses: &self.pauses,
                me: "n1:aaaa",
                local: &self.local,
                local_errors: &self.local_errors,
                local_running: &self.local_running,
                notes: &self.notes,
            })
        }
    }

    fn status(l: &Lease, phase: Phase) -> SeatStatus {
        SeatStatus {
            handle: l.resource.trim_start_matches("seat:").into(),
            epoch: l.epoch,
            phase,
            lease: l.clone(),
            unproven_for: None,
            attempts: 0,
        }
    }

    #[test]
    fn each_state_comes_from_the_lease_the_pause_and_the_holder() {
        let attached = lease("a-attached", "n1:aaaa", 1);
        let establishing = lease("b-establishing", "n1:aaaa", 2);
        let undead_here = lease("c-undead-here", "n1:aaaa", 3);
        let undead_there = lease("d-undead-there", "n2:bbbb", 4);
        let paused = lease("e-paused", "n2:bbbb", 5);
        let mut claiming = lease("f-claiming", "n2:bbbb", 0);
        claiming.state = LeaseState::Claiming;
        let w = World {
            roles: [
                "a-attached",
                "b-establishing",
                "c-undead-here",
                "d-undead-there",
                "e-paused",
                "f-claiming",
                "g-unowned",
                "h-unowned-paused",
            ]
            .into_iter()
            .rev()
            .map(role)
            .collect(),
            leases: vec![
                attached.clone(),
                establishing.clone(),
                undead_here.clone(),
                undead_there.clone(),
                paused.clone(),
                claiming,
            ],
            pauses: [
                ("e-paused", pause("ann")),
                ("h-unowned-paused", pause("bo")),
            ]
            .into_iter()
            .map(|(h, p)| (h.to_string(), p))
            .collect(),
            local: vec![
                status(&attached, Phase::Attached),
                status(&establishing, Phase::Establishing),
                status(&undead_here, Phase::Undead),
            ],
            local_errors: HashMap::new(),
            local_running: HashMap::new(),
            notes: [(
                "d-undead-there".to_string(),
                SeatNote {
                    unproven: Some(("n2".into(), 4)),
                    unproven_since: None,
                    last_error: None,
                    running_turn: None,
                },
            )]
            .into_iter()
            .collect(),
        };
        let got: Vec<(String, SeatState, Option<String>)> = w
            .rows()
            .into_iter()
            .map(|r| (r.handle, r.state, r.holder.map(|h| h.node_id)))
            .collect();
        let n = |s: &str| Some(s.to_string());
        assert_eq!(
            got,
            vec![
                ("a-attached".into(), SeatState::Attached, n("n1")),
                ("b-establishing".into(), SeatState::Establishing, n("n1")),
                ("c-undead-here".into(), SeatState::Undead, n("n1")),
                ("d-undead-there".into(), SeatState::Undead, n("n2")),
                ("e-paused".into(), SeatState::Paused, n("n2")),
                ("f-claiming".into(), SeatState::Establishing, n("n2")),
                ("g-unowned".into(), SeatState::Unowned, None),
                ("h-unowned-paused".into(), SeatState::Paused, None),
            ]
        );
    }

    #[test]
    fn an_unproven_note_about_an_older_tenure_does_not_make_a_seat_undead() {
        let w = World {
            roles: vec![role("a")],
            leases: vec![lease("a", "n3:cccc", 7)],
            pauses: HashMap::new(),
            local: Vec::new(),
            local_errors: HashMap::new(),
            local_running: HashMap::new(),
            notes: [(
                "a".to_string(),
                SeatNote {
                    unproven: Some(("n2".into(), 6)),
                    unproven_since: None,
                    last_error: Some(("n2".into(), "boom".into())),
                    running_turn: None,
                },
            )]
            .into_iter()
            .collect(),
        };
        let row = &w.rows()[0];
        assert_eq!(row.state, SeatState::Attached);
        assert_eq!(row.last_error.as_deref(), Some("boom"));
        assert_eq!(row.last_error_node.as_deref(), Some("n2"));
    }

    #[test]
    fn the_pause_and_this_nodes_last_error_are_shown() {
        let l = lease("a", "n1:aaaa", 1);
        let w = World {
            roles: vec![role("a")],
            leases: vec![l.clone()],
            pauses: [("a".to_string(), pause("ann"))].into_iter().collect(),
            local: vec![status(&l, Phase::Attached)],
            local_errors: [("a".to_string(), "panicked".to_string())]
                .into_iter()
                .collect(),
            local_running: HashMap::new(),
            notes: HashMap::new(),
        };
        let row = &w.rows()[0];
        assert_eq!(row.pause.as_ref().unwrap().by, "ann");
        assert_eq!(row.pause.as_ref().unwrap().reason.as_deref(), Some("keys"));
        assert_eq!(row.last_error.as_deref(), Some("panicked"));
        assert_eq!(row.last_error_node.as_deref(), Some("n1"));
    }

    #[test]
    fn a_running_turn_is_shown_for_a_seat_held_here_only() {
        let mine = lease("a", "n1:aaaa", 1);
        let theirs = lease("b", "n2:bbbb", 3);
        let w = World {
            roles: vec![role("a"), role("b")],
            leases: vec![mine.clone(), theirs],
            pauses: HashMap::new(),
            local: vec![status(&mine, Phase::Attached)],
            local_errors: HashMap::new(),
            // A turn this node still reports for a seat that moved away
            // is not the holder's.
            local_running: [("a", "turn-1"), ("b", "turn-stale")]
                .into_iter()
                .map(|(h, t)| (h.to_string(), t.to_string()))
                .collect(),
            notes: HashMap::new(),
        };
        let rows = w.rows();
        assert_eq!(rows[0].running_turn.as_deref(), Some("turn-1"));
        assert_eq!(rows[1].running_turn, None);
    }

    #[test]
    fn a_peers_running_turn_is_shown_from_its_events_for_its_tenure_only() {
        let theirs = lease("b", "n2:bbbb", 3);
        let mut w = World {
            roles: vec![role("b")],
            leases: vec![theirs],
            pauses: HashMap::new(),
            local: vec![],
            local_errors: HashMap::new(),
            local_running: HashMap::new(),
            notes: [(
                "b".to_string(),
                SeatNote {
                    running_turn: Some(("n2".into(), 3, "turn-9".into())),
                    ..SeatNote::default()
                },
            )]
            .into_iter()
            .collect(),
        };
        assert_eq!(w.rows()[0].running_turn.as_deref(), Some("turn-9"));
        // Said of an earlier tenure: not the holder's turn.
        w.notes.get_mut("b").unwrap().running_turn = Some(("n2".into(), 2, "turn-8".into()));
        assert_eq!(w.rows()[0].running_turn, None);
    }

    fn run(id: &str, state: RunState, node: &str) -> RunRecord {
        RunRecord {
            run_id: id.into(),
            seat: "a".into(),
            owner: "n1:aaaa".into(),
            owner_epoch: 1,
            launcher: format!("{node}:x"),
            launcher_node: node.into(),
            state,
            argv: vec!["sleep".into(), "30".into()],
            work_key: None,
            result: None,
            resumed: false,
            created_at: String::new(),
            updated_at: String::new(),
        }
    }

    #[test]
    fn a_seats_runs_show_live_ones_first_with_their_state_and_launcher() {
        let views = run_views(vec![
            run("r1", RunState::Finished, "node-b"),
            run("r3", RunState::Running, "node-a"),
            run("r2", RunState::Parked, "node-a"),
        ]);
        let states: Vec<(&str, &str, &str)> = views
            .iter()
            .map(|v| {
                (
                    v.run_id.as_str(),
                    v.state.as_str(),
                    v.launcher_node.as_str(),
                )
            })
            .collect();
        assert_eq!(
            states,
            [
                ("r2", "parked", "node-a"),
                ("r3", "running", "node-a"),
                ("r1", "finished", "node-b"),
            ]
        );
        assert_eq!(
            app::api::runs_summary(&views[1..2]).as_deref(),
            Some("1 run: running on node-a")
        );
        assert_eq!(
            app::api::runs_summary(&views).as_deref(),
            Some("3 runs: parked on node-a, running on node-a, finished on node-b")
        );
        assert_eq!(app::api::runs_summary(&[]), None);
    }

    fn many(n: usize) -> Vec<SeatRow> {
        (0..n)
            .map(|i| SeatRow {
                handle: format!("seat-{i:04}"),
                placement: "any node".into(),
                holder: (i % 2 == 0).then(|| SeatHolder {
                    node_id: format!("node-{}", i % 3),
                    incarnation: format!("node-{}:x", i % 3),
                    epoch: 1,
                    since: String::new(),
                }),
                state: if i % 2 == 0 {
                    SeatState::Attached
                } else {
                    SeatState::Unowned
                },
                pending: None,
                pause: None,
                last_error: None,
                last_error_node: None,
                running_turn: None,
                runs: Vec::new(),
                tool_servers: Vec::new(),
                spend: None,
                approvals: Vec::new(),
                move_blocked: None,
            })
            .collect()
    }

    fn q(query: &str, state: Option<SeatState>, page: u32) -> SeatQuery {
        SeatQuery {
            query: query.into(),
            state,
            page,
        }
    }

    #[test]
    fn pages_hold_fifty_seats_and_a_page_past_the_end_is_the_last() {
        let p = page_of(many(120), &q("", None, 1));
        assert_eq!((p.matching, p.page, p.pages, p.rows.len()), (120, 1, 3, 50));
        assert_eq!(p.rows[0].handle, "seat-0000");
        let p = page_of(many(120), &q("", None, 3));
        assert_eq!((p.page, p.rows.len()), (3, 20));
        assert_eq!(p.rows[0].handle, "seat-0100");
        let p = page_of(many(120), &q("", None, 9));
        assert_eq!(p.page, 3);
        let p = page_of(many(120), &q("", None, 0));
        assert_eq!(p.page, 1);
        let p = page_of(Vec::new(), &q("", None, 2));
        assert_eq!((p.matching, p.page, p.pages), (0, 1, 1));
    }

    #[test]
    fn the_search_matches_handles_and_holder_nodes_and_the_state_filters() {
        let p = page_of(many(120), &q("  SEAT-001 ", None, 1));
        assert_eq!(p.matching, 10, "seat-0010 … seat-0019");
        let p = page_of(many(120), &q("node-1", None, 1));
        assert!(
            p.rows
                .iter()
                .all(|r| r.holder.as_ref().unwrap().node_id == "node-1")
        );
        assert_eq!(p.matching, 20);
        let p = page_of(many(120), &q("", Some(SeatState::Unowned), 1));
        assert_eq!(p.matching, 60);
        assert!(p.rows.iter().all(|r| r.state == SeatState::Unowned));
        // Counts are of every seat, whatever the query.
        assert_eq!(p.counts[0], (SeatState::Attached, 60));
        assert_eq!(p.counts[4], (SeatState::Unowned, 60));
    }

    #[test]
    fn placement_reads_as_words() {
        assert_eq!(placement_text(&PlacementConfig::default()), "any node");
        assert_eq!(
            placement_text(&PlacementConfig {
                nodes: vec!["a".into(), "b".into()],
                labels: vec!["gpu".into()],
            }),
            "nodes a, b · label gpu"
        );
    }
}
