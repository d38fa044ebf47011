//! A seat's windowed budgets as the turn engine keeps them: the gate
//! before a turn, the hold (and its recheck timer) once a cap is reached,
//! the spend pages show.

use crate::config::AgentConfig;
use crate::events::Event;
use crate::queue::Disposition;

use super::{BUDGET_RECHECK, TurnEngine, lock};

impl TurnEngine {
    /// Whether a turn of `handle` may spend: `Err` when one of its role's
    /// token caps is reached (`Ok(Some)`) or its counters cannot be read
    /// (`Err(None)`: a turn does not spend blind; its mail waits and comes
    /// again). `Ok(())` for a seat with no budget, or with room.
    pub(super) async fn budget_gate(
        &self,
        handle: &str,
    ) -> Result<(), Option<crate::engine::budget::Exhausted>> {
        match self.budget_read(handle).await {
            Ok(None) => Ok(()),
            Ok(Some(ex)) => Err(Some(ex)),
            Err(e) => {
                tracing::warn!(seat = handle, error = %e, "cannot read the seat's token counters; its turn waits rather than spend blind");
                Err(None)
            }
        }
    }

    /// The cap `handle` has reached, if any; `Err` when its counters
    /// cannot be read.
    pub(super) async fn budget_read(
        &self,
        handle: &str,
    ) -> Result<Option<crate::engine::budget::Exhausted>, crate::engine::budget::BudgetError> {
        let Some((caps, tz)) = self.caps_of(handle) else {
            return Ok(None);
        };
        let windows = crate::engine::budget::windows(chrono::Utc::now(), tz);
        let spent = self.budgets.spent(handle, &windows).await?;
        Ok(crate::engine::budget::over(&caps, &windows, &spent))
    }

    pub(super) fn caps_of(
        &self,
        handle: &str,
    ) -> Option<(crate::config::BudgetConfig, chrono_tz::Tz)> {
        let company = self.company.borrow();
        let caps = company
            .roles
            .iter()
            .find(|r| r.handle == handle)
            .and_then(|r| r.budget.clone())?;
        Some((caps, company.timezone.parse().unwrap_or(chrono_tz::UTC)))
    }

    /// A resume is a turn like any other: it starts only while every cap
    /// has room (and the counters can be read). `Some` is the delivery's
    /// disposition when it must wait (the seat held for a reached cap).
    pub(super) async fn resume_waits_for_budget(&self, handle: &str) -> Option<Disposition> {
        match self.budget_gate(handle).await {
            Ok(()) => None,
            Err(reached) => {
                if let Some(ex) = reached {
                    self.hold_for_budget(handle, &ex);
                }
                Some(Disposition::Nak)
            }
        }
    }

    /// Has `handle` reached one of its role's token caps? `None` for a
    /// seat with no budget (nothing read), with room, or whose counters
    /// cannot be read (the hold's timer and the acquire hook look again).
    pub(super) async fn budget_reached(
        &self,
        handle: &str,
    ) -> Option<crate::engine::budget::Exhausted> {
        self.budget_read(handle).await.unwrap_or_else(|e| {
            tracing::warn!(seat = handle, error = %e, "cannot read the seat's token counters");
            None
        })
    }

    /// Hold `handle` for a reached cap (its mail kept, nothing consumed),
    /// say so, and arm the timer that releases it once there is room —
    /// the window rolled over, or a company revision raised the cap
    /// (looked at every [`BUDGET_RECHECK`]).
    pub(super) fn hold_for_budget(&self, handle: &str, ex: &crate::engine::budget::Exhausted) {
        if let Some(fence) = self.runtime(handle).and_then(|r| lock(&r.fence).clone()) {
            fence.hold(crate::engine::budget::BUDGET_HOLD, true);
        }
        if !lock(&self.budget_held).insert(handle.to_string()) {
            return;
        }
        let window = {
            let company = self.company.borrow();
            let tz = company.timezone.parse().unwrap_or(chrono_tz::UTC);
            crate::engine::budget::windows(chrono::Utc::now(), tz)
                .into_iter()
                .find(|w| w.span == ex.span)
                .map(|w| w.id)
                .unwrap_or_default()
        };
        tracing::warn!(
            seat = handle,
            cap = ex.span.cap_key(),
            limit = ex.cap,
            spent = ex.spent,
            "the seat reached a token cap; held until its window reopens"
        );
        self.events.emit(Event::SeatBudgetExhausted {
            seat: handle.to_string(),
            cap: ex.span.cap_key().into(),
            limit: ex.cap,
            spent: ex.spent,
            window,
            reopens_at: ex
                .reopens_at
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        });
        let (me, seat) = (self.me.clone(), handle.to_string());
        let mut until = ex.reopens_at;
        self.timers.spawn("budget hold", async move {
            loop {
                let left = (until - chrono::Utc::now()).to_std().unwrap_or_default();
                tokio::time::sleep(left.min(BUDGET_RECHECK)).await;
                let Some(engine) = me.upgrade() else { return };
                let Some(fence) = engine.runtime(&seat).and_then(|r| lock(&r.fence).clone()) else {
                    // Given back meanwhile: its next holder judges it.
                    lock(&engine.budget_held).remove(&seat);
                    return;
                };
                match engine.budget_reached(&seat).await {
                    Some(ex) => until = ex.reopens_at,
                    None => {
                        lock(&engine.budget_held).remove(&seat);
                        fence.hold(crate::engine::budget::BUDGET_HOLD, false);
                        tracing::info!(seat, "the seat's token caps have room again");
                        engine
                            .events
                            .emit(Event::SeatBudgetRestored { seat: seat.clone() });
                        return;
                    }
                }
            }
        });
    }

    /// A model seat's spend in its current windows (day, week, month: id,
    /// spent, cap) and whether it is held for a cap; `None` for a seat
    /// whose agent is no model, or whose counters cannot be read.
    pub async fn spend(&self, handle: &str) -> Option<(Vec<(String, u64, Option<u64>)>, bool)> {
        let (caps, tz) = {
            let company = self.company.borrow();
            let role = company.roles.iter().find(|r| r.handle == handle)?;
            if !matches!(role.agent, AgentConfig::Model(_)) {
                return None;
            }
            (
                role.budget.clone().unwrap_or_default(),
                company.timezone.parse().unwrap_or(chrono_tz::UTC),
            )
        };
        let windows = crate::engine::budget::windows(chrono::Utc::now(), tz);
        let spent = self.budgets.spent(handle, &windows).await.ok()?;
        let held = crate::engine::budget::over(&caps, &windows, &spent).is_some();
        Some((
            windows
                .iter()
                .zip(spent)
                .map(|(w, s)| (w.id.clone(), s, w.span.cap(&caps)))
                .collect(),
            held,
        ))
    }
}
