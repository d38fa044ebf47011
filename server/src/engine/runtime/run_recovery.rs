//! Interrupted-run recovery when a seat is established here (the acquire
//! hook, with the control subscription): the detached runs an earlier
//! holder launched are adopted, failed, or resumed under this epoch.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::engine::pause::ControlMessage;
use crate::engine::runs::{RunCompletion, RunState, unsettled_before};
use crate::events::Event;
use crate::seat::host::SeatContext;

use super::TurnEngine;

impl TurnEngine {
    /// Interrupted-run recovery (the acquire hook, with the control
    /// subscription): adopt each live run under this epoch; fail one
    /// whose launcher is gone (`sandbox_run_failed`, `launcher_lost`)
    /// unless its answer is recorded; resume an answer the last holder
    /// recorded and never resumed with (the launcher records it before it
    /// publishes the completion, so a launcher that died before the resume
    /// loses nothing), and a resume claimed at an earlier epoch that never
    /// settled (its holder died mid-resume).
    pub(super) async fn recover_runs(&self, seat: &SeatContext) -> Result<(), RecoveryError> {
        let me = self.tools.incarnation.clone();
        for (r, _) in self.runs.list(&seat.handle).await? {
            let r = match r.state {
                RunState::Running | RunState::Parked => {
                    let alive = self
                        .store
                        .lease(&format!("node:{}", r.launcher_node))
                        .await?
                        .is_some_and(|l| l.owner == r.launcher);
                    if alive {
                        let x = self
                            .runs
                            .mutate(&seat.handle, &r.run_id, seat.epoch, |x| {
                                x.owner = me.clone();
                                x.owner_epoch = seat.epoch;
                                true
                            })
                            .await?;
                        self.events.emit(Event::RunAdopted {
                            seat: seat.handle.clone(),
                            run_id: r.run_id.clone(),
                            epoch: seat.epoch,
                        });
                        x
                    } else {
                        // Failed only while still live: an answer the
                        // launcher recorded meanwhile is resumed below.
                        let failed = AtomicBool::new(false);
                        let x = self
                            .runs
                            .mutate(&seat.handle, &r.run_id, seat.epoch, |x| {
                                let live = x.state.is_live();
                                failed.store(live, Ordering::SeqCst);
                                if live {
                                    x.state = RunState::Failed;
                                    x.owner = me.clone();
                                    x.owner_epoch = seat.epoch;
                                    x.result = Some(crate::engine::runs::RunResult {
                                        error: Some(format!("its launcher {} is gone", x.launcher)),
                                        ..Default::default()
                                    });
                                }
                                live
                            })
                            .await?;
                        if failed.load(Ordering::SeqCst) {
                            self.events.emit(Event::SandboxRunFailed {
                                seat: seat.handle.clone(),
                                run_id: r.run_id.clone(),
                                reason: "launcher_lost".into(),
                            });
                        }
                        x
                    }
                }
                _ => r,
            };
            // An answer never resumed, or a resume claimed under an earlier
            // epoch that never settled (its holder died mid-resume): the
            // completion goes round again, and the resume takes the claim
            // over.
            let unresumed = r.state == RunState::Finished && !r.resumed;
            if unresumed || unsettled_before(&r, seat.epoch) {
                if !unresumed {
                    tracing::info!(seat = %seat.handle, run_id = %r.run_id, claimed_at = r.owner_epoch, "a resume the last holder claimed never settled; resuming it again");
                }
                let msg = ControlMessage::RunCompleted(RunCompletion {
                    run_id: r.run_id.clone(),
                    result: r.result.clone().unwrap_or_default(),
                });
                self.queue
                    .publish(
                        &crate::queue::control_subject(&seat.handle),
                        Some(&format!("run-redo-{}-{}", r.run_id, seat.epoch)),
                        bytes::Bytes::from(serde_json::to_vec(&msg).unwrap_or_default()),
                    )
                    .await?;
            }
        }
        Ok(())
    }
}

/// Why a seat's interrupted runs could not be recovered when it was
/// established (the acquire hook fails, and the seat is handed back).
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    #[error(transparent)]
    Runs(#[from] crate::engine::runs::RunError),
    #[error(transparent)]
    Store(#[from] crate::coord::StoreError),
    #[error(transparent)]
    Queue(#[from] crate::queue::QueueError),
}
