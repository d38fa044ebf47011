//! Windowed token budgets (spec § Mixed-version fleets, protocol 4: the holder charges the
//! seat's rounds to the windowed token counters — a slot per day, week and
//! month on the company's clock). A role's `budget` caps what its seat may
//! spend in each; what each completion spent is added to the seat's three
//! current slots in the coordination store (`crewlet_budgets`, key
//! `budget:{seat}:{day|week|month}:{window}`), by compare-and-set so that
//! two writers lose nothing, and wherever the seat runs it reads the same
//! figures. A seat with a cap reached is held (the named hold `budget`, as
//! a pause holds: its mail kept, nothing consumed) until the window rolls
//! over or a company revision raises the cap.
//!
//! [`windows`] and [`over`] are pure; [`Budgets`] is the store's side.

use std::sync::Arc;

use bytes::Bytes;
use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};

use crate::config::BudgetConfig;
use crate::coord::{KvError, StateBucket, Store, StoreError};

/// The named hold a seat over a cap is under.
pub const BUDGET_HOLD: &str = "budget";

/// A window's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Span {
    Day,
    Week,
    Month,
}

impl Span {
    pub const ALL: [Span; 3] = [Span::Day, Span::Week, Span::Month];

    pub fn name(self) -> &'static str {
        match self {
            Span::Day => "day",
            Span::Week => "week",
            Span::Month => "month",
        }
    }

    /// The cap's key in a role's `budget`.
    pub fn cap_key(self) -> &'static str {
        match self {
            Span::Day => "tokens_per_day",
            Span::Week => "tokens_per_week",
            Span::Month => "tokens_per_month",
        }
    }

    /// The role's cap for this window, if it sets one.
    pub fn cap(self, b: &BudgetConfig) -> Option<u64> {
        match self {
            Span::Day => b.tokens_per_day,
            Span::Week => b.tokens_per_week,
            Span::Month => b.tokens_per_month,
        }
    }
}

/// One current window: its id on the company's clock (`2026-12-01`,
/// `2026-W49`, `2026-12`) and when the next one begins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    pub span: Span,
    pub id: String,
    pub ends_at: DateTime<Utc>,
}

/// Pure: midnight at the start of `date` on `tz`'s clock, in UTC (a
/// midnight a clock change skips is the first hour that exists).
fn start_of(date: NaiveDate, tz: Tz) -> DateTime<Utc> {
    (0..4)
        .find_map(|h| {
            date.and_hms_opt(h, 0, 0)
                .and_then(|t| tz.from_local_datetime(&t).earliest())
        })
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_else(|| Utc.from_utc_datetime(&date.and_hms_opt(0, 0, 0).unwrap_or_default()))
}

/// Pure: the day, ISO week and month `now` falls in on `tz`'s clock.
pub fn windows(now: DateTime<Utc>, tz: Tz) -> [Window; 3] {
    let d = now.with_timezone(&tz).date_naive();
    let next_day = d.succ_opt().unwrap_or(d);
    let monday = d - chrono::Days::new(u64::from(d.weekday().num_days_from_monday()));
    let next_monday = monday + chrono::Days::new(7);
    let iso = d.iso_week();
    let (y, m) = (d.year(), d.month());
    let next_month = if m == 12 {
        NaiveDate::from_ymd_opt(y + 1, 1, 1)
    } else {
        NaiveDate::from_ymd_opt(y, m + 1, 1)
    }
    .unwrap_or(next_day);
    [
        Window {
            span: Span::Day,
            id: d.format("%Y-%m-%d").to_string(),
            ends_at: start_of(next_day, tz),
        },
        Window {
            span: Span::Week,
            id: format!("{}-W{:02}", iso.year(), iso.week()),
            ends_at: start_of(next_monday, tz),
        },
        Window {
            span: Span::Month,
            id: format!("{y}-{m:02}"),
            ends_at: start_of(next_month, tz),
        },
    ]
}

/// A cap the seat has reached: which, its figure, what was spent, and
/// when its window reopens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exhausted {
    pub span: Span,
    pub cap: u64,
    pub spent: u64,
    pub reopens_at: DateTime<Utc>,
}

/// Pure: the first cap `spent` (per window, in [`windows`]' order) has
/// reached — the one whose window reopens last, so that the hold lasts
/// as long as any cap is reached; `None` while every cap has room.
pub fn over(budget: &BudgetConfig, windows: &[Window; 3], spent: &[u64; 3]) -> Option<Exhausted> {
    windows
        .iter()
        .zip(spent)
        .filter_map(|(w, s)| {
            let cap = w.span.cap(budget)?;
            (*s >= cap).then_some(Exhausted {
                span: w.span,
                cap,
                spent: *s,
                reopens_at: w.ends_at,
            })
        })
        .max_by_key(|e| e.reopens_at)
}

/// Pure: the tokens left before the first cap is reached (`None`: no cap).
pub fn left(budget: &BudgetConfig, windows: &[Window; 3], spent: &[u64; 3]) -> Option<u64> {
    windows
        .iter()
        .zip(spent)
        .filter_map(|(w, s)| Some(w.span.cap(budget)?.saturating_sub(*s)))
        .min()
}

/// Pure: what a completion whose endpoint reported no usage is charged —
/// about four characters a token of what was sent and what came back, and
/// never nothing.
pub fn estimate_tokens(sent_chars: usize, reply_chars: usize) -> u64 {
    ((sent_chars + reply_chars) as u64).div_ceil(4).max(1)
}

fn key(seat: &str, w: &Window) -> String {
    format!("budget:{seat}:{}:{}", w.span.name(), w.id)
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Counter {
    tokens: u64,
}

/// The seats' counters in the coordination store.
/// Why a seat's token counters could not be read or charged.
#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    #[error("the token counters cannot be read: {0}")]
    Read(#[from] StoreError),
    #[error("the token counter {key} cannot be written: {source}")]
    Write { key: String, source: KvError },
    #[error("{key}: the counter kept changing under the write")]
    Contended { key: String },
}

#[derive(Clone)]
pub struct Budgets {
    store: Arc<dyn Store>,
}

impl Budgets {
    pub fn new(store: Arc<dyn Store>) -> Budgets {
        Budgets { store }
    }

    /// What `seat` spent in each current window.
    pub async fn spent(&self, seat: &str, windows: &[Window; 3]) -> Result<[u64; 3], BudgetError> {
        let mut out = [0; 3];
        for (i, w) in windows.iter().enumerate() {
            out[i] = match self.store.get(StateBucket::Budgets, &key(seat, w)).await? {
                Some(e) => serde_json::from_slice::<Counter>(&e.value)
                    .map(|c| c.tokens)
                    .unwrap_or(0),
                None => 0,
            };
        }
        Ok(out)
    }

    /// Add `tokens` to each of `seat`'s current windows (compare-and-set,
    /// tried again on a concurrent write: nothing is lost). Answers what
    /// each window holds now.
    pub async fn charge(
        &self,
        seat: &str,
        windows: &[Window; 3],
        tokens: u64,
    ) -> Result<[u64; 3], BudgetError> {
        let mut out = [0; 3];
        for (i, w) in windows.iter().enumerate() {
            out[i] = self.add(&key(seat, w), tokens).await?;
        }
        Ok(out)
    }

    async fn add(&self, k: &str, tokens: u64) -> Result<u64, BudgetError> {
        for _ in 0..64 {
            let current = self.store.get(StateBucket::Budgets, k).await?;
            let was = current
                .as_ref()
                .and_then(|e| serde_json::from_slice::<Counter>(&e.value).ok())
                .map_or(0, |c| c.tokens);
            let now = was.saturating_add(tokens);
            let body =
                Bytes::from(serde_json::to_vec(&Counter { tokens: now }).unwrap_or_default());
            let wrote = match &current {
                Some(e) => {
                    self.store
                        .update(StateBucket::Budgets, k, body, e.revision)
                        .await
                }
                None => self.store.create(StateBucket::Budgets, k, body).await,
            };
            match wrote {
                Ok(_) => return Ok(now),
                Err(KvError::WrongRevision | KvError::AlreadyExists) => continue,
                Err(source) => {
                    return Err(BudgetError::Write {
                        key: k.to_string(),
                        source,
                    });
                }
            }
        }
        Err(BudgetError::Contended { key: k.to_string() })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn what_is_left_is_the_least_room_of_any_capped_window_and_an_estimate_is_never_nothing() {
        let now = chrono::Utc::now();
        let w = super::windows(now, chrono_tz::UTC);
        let caps = crate::config::BudgetConfig {
            tokens_per_day: Some(100),
            tokens_per_month: Some(1_000),
            ..Default::default()
        };
        assert_eq!(super::left(&caps, &w, &[40, 40, 950]), Some(50));
        assert_eq!(super::left(&caps, &w, &[120, 0, 0]), Some(0));
        assert_eq!(super::left(&Default::default(), &w, &[5, 5, 5]), None);
        assert_eq!(super::estimate_tokens(0, 0), 1);
        assert_eq!(super::estimate_tokens(400, 400), 200);
    }

    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn the_windows_are_the_day_iso_week_and_month_on_the_companys_clock() {
        // 23:30 UTC on Sunday 2026-11-29 is already Monday in Berlin.
        let now = at("2026-11-29T23:30:00Z");
        let utc = windows(now, chrono_tz::UTC);
        assert_eq!(
            utc.iter().map(|w| w.id.as_str()).collect::<Vec<_>>(),
            ["2026-11-29", "2026-W48", "2026-11"]
        );
        assert_eq!(utc[0].ends_at, at("2026-11-30T00:00:00Z"));
        assert_eq!(utc[1].ends_at, at("2026-11-30T00:00:00Z"));
        assert_eq!(utc[2].ends_at, at("2026-12-01T00:00:00Z"));
        let berlin = windows(now, chrono_tz::Europe::Berlin);
        assert_eq!(
            berlin.iter().map(|w| w.id.as_str()).collect::<Vec<_>>(),
            ["2026-11-30", "2026-W49", "2026-11"]
        );
        assert_eq!(
            berlin[0].ends_at,
            at("2026-11-30T23:00:00Z"),
            "Berlin's midnight"
        );
        assert_eq!(berlin[2].ends_at, at("2026-11-30T23:00:00Z"));
    }

    #[test]
    fn the_year_turns_and_an_iso_week_may_belong_to_the_next_year() {
        let w = windows(at("2026-12-31T12:00:00Z"), chrono_tz::UTC);
        assert_eq!(w[1].id, "2026-W53");
        assert_eq!(w[2].ends_at, at("2027-01-01T00:00:00Z"));
        let w = windows(at("2024-12-30T12:00:00Z"), chrono_tz::UTC);
        assert_eq!(w[1].id, "2025-W01");
    }

    #[test]
    fn a_reached_cap_holds_until_the_last_reached_window_reopens() {
        let w = windows(at("2026-12-01T10:00:00Z"), chrono_tz::UTC);
        let caps = BudgetConfig {
            tokens_per_day: Some(100),
            tokens_per_week: Some(500),
            tokens_per_month: None,
        };
        assert_eq!(
            over(&caps, &w, &[99, 99, 10_000]),
            None,
            "room everywhere capped"
        );
        let day = over(&caps, &w, &[100, 100, 0]).unwrap();
        assert_eq!((day.span, day.cap, day.spent), (Span::Day, 100, 100));
        assert_eq!(day.reopens_at, at("2026-12-02T00:00:00Z"));
        let both = over(&caps, &w, &[600, 600, 0]).unwrap();
        assert_eq!(both.span, Span::Week, "the later window rules");
        assert_eq!(over(&BudgetConfig::default(), &w, &[u64::MAX; 3]), None);
    }
}
