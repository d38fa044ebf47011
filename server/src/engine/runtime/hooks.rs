//! The turn engine as the seat host's [`SeatHooks`]: what starts with a
//! seat (judged against this node's policy first: its agent, tool servers,
//! memory, attachments) and what stops with it.

use std::sync::{Arc, Mutex};

use crate::config::AgentConfig;
use crate::engine::agent::Agent;
use crate::engine::command::CommandAgent;
use crate::engine::echo::EchoAgent;
use crate::engine::pause::{self, PAUSE_HOLD};
use crate::memory::changelog::{self};
use crate::queue::{Attachment, Handler, control_group, reflect_group};
use crate::seat::host::{Fence, HookError, SeatContext, SeatHooks};

use super::dispatch::{ControlHandler, InboxHandler, ReflectHandler};
use super::{SeatRuntime, TurnEngine, lock};

impl TurnEngine {
    /// Judge the role of `handle` against this node's policy
    /// ([`crate::config::AgentPolicy::judge_role`]): `Err` names every
    /// refusal, and the seat is not established here.
    pub(super) fn judge_here(&self, handle: &str) -> Result<(), HookError> {
        let company = self.company.borrow().clone();
        let Some(role) = company.roles.iter().find(|r| r.handle == handle) else {
            return Ok(());
        };
        let problems = self
            .policy
            .judge_role(role, &crate::config::programs::find_on_node);
        if problems.is_empty() {
            return Ok(());
        }
        Err(HookError::new(
            "children",
            format!(
                "this node does not run seat {handle:?}: {}",
                problems.join("; ")
            ),
        ))
    }

    pub(super) fn agent_for(&self, handle: &str) -> Result<Arc<dyn Agent>, HookError> {
        let company = self.company.borrow().clone();
        let role = company
            .roles
            .iter()
            .find(|r| r.handle == handle)
            .ok_or_else(|| {
                HookError::new(
                    "children",
                    format!(
                        "no role {handle:?} in company revision {}",
                        company.revision
                    ),
                )
            })?;
        // The role the seat was established under: what judges its built-in
        // calls should a revision remove the role before a turn begins.
        self.tools.roles_at_start.keep(role.clone());
        Ok(match &role.agent {
            AgentConfig::Echo(c) => {
                if c.drills && !self.policy.drills {
                    tracing::warn!(
                        seat = handle,
                        "the role asks for echo drills, but this node is not a test node (node.environment); the drills in its mail are ignored"
                    );
                }
                Arc::new(EchoAgent::new(c.clone(), self.policy.drills))
            }
            AgentConfig::Command(c) => Arc::new(
                CommandAgent::new(handle, &self.node_id, c)
                    .confined(self.policy.confinement.clone()),
            ),
            AgentConfig::Model(c) => {
                let mut c = c.clone();
                if let Some(f) = &c.instructions_file {
                    let inside = self
                        .policy
                        .instructions_lexical(f)
                        .map_err(|e| HookError::new("children", e.to_string()))?;
                    c.instructions_file = Some(inside);
                }
                Arc::new(
                    crate::engine::model::ModelAgent::new(
                        handle,
                        &self.node_id,
                        self.company.clone(),
                        &c,
                        self.tools.memory.clone(),
                        self.budgets.clone(),
                    )
                    .confined_to(self.policy.instructions_dir.clone()),
                )
            }
        })
    }
}

#[async_trait::async_trait]
impl SeatHooks for TurnEngine {
    async fn start_children(&self, seat: &SeatContext) -> Result<(), HookError> {
        // Nothing of the role starts here unless this node's own file
        // allows it all: its programs, the variables it is handed, its
        // instructions file (a company applied on another node was judged
        // there by that node's file, not this one's).
        self.judge_here(&seat.handle)?;
        // The tool servers first: a seat whose tools are not up runs with
        // none.
        self.start_tool_servers(&seat.handle).await?;
        let agent = match self.runtime(&seat.handle) {
            // A runtime left by a release that has not finished yet.
            Some(rt) => rt.agent.clone(),
            None => self.agent_for(&seat.handle)?,
        };
        if let Err(e) = agent.start().await {
            self.stop_tool_servers(&seat.handle).await.ok();
            return Err(HookError::new("children", e.to_string()));
        }
        lock(&self.seats)
            .entry(seat.handle.clone())
            .or_insert_with(|| {
                Arc::new(SeatRuntime {
                    handle: seat.handle.clone(),
                    agent,
                    fence: Mutex::new(None),
                    running: Mutex::new(None),
                    stop: Mutex::new(None),
                    last_error: Mutex::new(None),
                    turn_lock: tokio::sync::Mutex::new(()),
                })
            });
        Ok(())
    }

    async fn hydrate_memory(&self, seat: &SeatContext) -> Result<(), HookError> {
        let h = changelog::hydrate(&self.tools.memory, &*self.changelog, &seat.handle)
            .await
            .map_err(|e| HookError::new("memory hydration", e.to_string()))?;
        tracing::info!(
            seat = %seat.handle,
            inserted = h.inserted,
            kept_local = h.kept_local,
            vectors_taken = h.vectors_taken,
            replaced = h.replaced,
            collided = h.collided,
            unreadable = h.unreadable,
            "seat memory hydrated"
        );
        Ok(())
    }

    async fn attach_reflect(&self, seat: &SeatContext) -> Result<Option<Attachment>, HookError> {
        let handler = Arc::new(ReflectHandler {
            engine: self.me.clone(),
            handle: seat.handle.clone(),
        });
        self.queue
            .attach(&reflect_group(&seat.handle), &[], handler)
            .await
            .map(Some)
            .map_err(|e| HookError::new("reflect attach", e.to_string()))
    }

    async fn attach_control(&self, seat: &SeatContext) -> Result<Option<Attachment>, HookError> {
        self.recover_runs(seat)
            .await
            .map_err(|e| HookError::new("run recovery", e.to_string()))?;
        self.recover_approvals(seat)
            .await
            .map_err(|e| HookError::new("approval recovery", e.to_string()))?;
        let handler = Arc::new(ControlHandler {
            engine: self.me.clone(),
            handle: seat.handle.clone(),
        });
        self.queue
            .attach(&control_group(&seat.handle), &[], handler)
            .await
            .map(Some)
            .map_err(|e| HookError::new("control attach", e.to_string()))
    }

    async fn pause_holds(&self, seat: &SeatContext) -> Result<Vec<String>, HookError> {
        let mut holds = match pause::read(&*self.store, &seat.handle).await {
            Ok(Some(p)) => {
                tracing::info!(seat = %seat.handle, by = %p.by, "the seat is paused; its inbox attaches held");
                vec![PAUSE_HOLD.to_string()]
            }
            Ok(None) => Vec::new(),
            // Unknown is not "not paused".
            Err(e) => return Err(HookError::new("pause holds", e.to_string())),
        };
        // A seat that reached a cap on its last holder stays held here.
        if let Some(ex) = self.budget_reached(&seat.handle).await {
            holds.push(crate::engine::budget::BUDGET_HOLD.to_string());
            lock(&self.budget_held).remove(&seat.handle);
            self.hold_for_budget(&seat.handle, &ex);
        }
        Ok(holds)
    }

    fn inbox_handler(&self, seat: &SeatContext, fence: Fence) -> Arc<dyn Handler> {
        let rt = match self.runtime(&seat.handle) {
            Some(rt) => rt,
            None => {
                // start_children always runs first; this is only reached if
                // a hook order changes. Build what it would have.
                let agent: Arc<dyn Agent> = self
                    .agent_for(&seat.handle)
                    .unwrap_or_else(|_| Arc::new(EchoAgent::new(Default::default(), false)));
                let rt = Arc::new(SeatRuntime {
                    handle: seat.handle.clone(),
                    agent,
                    fence: Mutex::new(None),
                    running: Mutex::new(None),
                    stop: Mutex::new(None),
                    last_error: Mutex::new(None),
                    turn_lock: tokio::sync::Mutex::new(()),
                });
                lock(&self.seats).insert(seat.handle.clone(), rt.clone());
                rt
            }
        };
        *lock(&rt.fence) = Some(fence.clone());
        Arc::new(InboxHandler {
            engine: self.me.clone(),
            rt,
            fence,
        })
    }

    async fn established(&self, seat: &SeatContext) {
        // A pause written while the hook ran may have been read (and its
        // nudge consumed) before the inbox existed: read it once more.
        if let Err(e) = self.apply_pause(&seat.handle).await {
            tracing::warn!(seat = %seat.handle, error = %e, "cannot re-read the seat's pause after attaching");
        }
    }

    async fn quiesce(&self, seat: &SeatContext) -> Result<(), HookError> {
        // The reflect subscription is gone and no turn runs: what the
        // successor hydrates is complete after this flush.
        changelog::flush(&self.tools.memory, &*self.changelog, &seat.handle)
            .await
            .map(|_| ())
            .map_err(|e| HookError::new("memory flush", e.to_string()))
    }

    async fn unprepare(&self, seat: &SeatContext) -> Result<(), HookError> {
        // Children started for a seat this node did not take; its memory
        // stays as hydrated (the holder's flushes replace it on a later
        // hydration), nothing is published.
        let rt = lock(&self.seats).remove(&seat.handle);
        if let Some(rt) = rt {
            rt.agent
                .stop()
                .await
                .map_err(|e| HookError::new("children", e.to_string()))?;
        }
        self.stop_tool_servers(&seat.handle).await
    }

    async fn release(&self, seat: &SeatContext) -> Result<(), HookError> {
        if self.faults.teardown_held(&seat.handle) {
            return Err(HookError::new(
                "children",
                format!("the teardown of seat {:?} is held by a fault", seat.handle),
            ));
        }
        if let Some(rt) = self.runtime(&seat.handle) {
            rt.agent
                .stop()
                .await
                .map_err(|e| HookError::new("children", e.to_string()))?;
        }
        self.stop_tool_servers(&seat.handle).await?;
        // The last flush, after the reflect subscription is gone: nothing
        // writes the seat's memory here after it.
        changelog::flush(&self.tools.memory, &*self.changelog, &seat.handle)
            .await
            .map_err(|e| HookError::new("memory flush", e.to_string()))?;
        lock(&self.seats).remove(&seat.handle);
        Ok(())
    }
}
