//! The node's seat hooks: what establishing and giving back a seat does on
//! this build.
//!
//! Turns are not run yet, so a seat's inbox is attached under the hold
//! `no-runtime`: its mail is retained (nothing is consumed, nothing lost)
//! until the agent runtime fills in the inbox handler.

use std::sync::Arc;

use crate::queue::{Delivery, Disposition, Handler, handler_fn};
use crate::seat::host::{Fence, HookError, SeatContext, SeatHooks};

/// The hold an inbox is attached under while no agent runtime runs turns.
pub const NO_RUNTIME_HOLD: &str = "no-runtime";

pub struct NodeHooks;

#[async_trait::async_trait]
impl SeatHooks for NodeHooks {
    async fn pause_holds(&self, _seat: &SeatContext) -> Result<Vec<String>, HookError> {
        Ok(vec![NO_RUNTIME_HOLD.to_string()])
    }

    fn inbox_handler(&self, seat: &SeatContext, _fence: Fence) -> Arc<dyn Handler> {
        let handle = seat.handle.clone();
        handler_fn(move |_d: Delivery| {
            let handle = handle.clone();
            async move { Disposition::Defer(format!("seat {handle:?} runs no turns on this build")) }
        })
    }
}
