//! Every seat's memory at a glance ([`MemRead::overview`]): the seat
//! leases listed once, this node's seats counted in its own store, one
//! request per other holder, and the company's seats nobody holds.

use std::collections::BTreeMap;

use app::api::{
    HolderCoverage, MemoryAnswer, MemoryCounts, MemoryCoverage, MemoryHolder, MemoryOverview,
};

use super::{
    Here, MemRead, MemReadError, SeatMemoryCounts, Want, WireAnswer, WireRequest, count_rows,
    holder_of, take_seat, unavailable, why,
};

impl MemRead {
    /// Every seat's memory, as rows per table, in one round: the seat
    /// leases listed once, this node's seats from its store, one request
    /// per other holder.
    pub async fn overview(&self) -> Result<MemoryOverview, MemReadError> {
        let leases = self.holdings.store().list("seat:").await?;
        let mut by_owner: BTreeMap<String, Vec<(String, MemoryHolder)>> = BTreeMap::new();
        for l in &leases {
            if let Some(handle) = l.resource.strip_prefix("seat:") {
                by_owner
                    .entry(l.owner.clone())
                    .or_default()
                    .push((handle.to_string(), holder_of(l)));
            }
        }
        let mut seats: BTreeMap<String, SeatMemoryCounts> = BTreeMap::new();
        let mut coverage = MemoryCoverage::default();

        // This node's own seats, from its own store.
        if let Some(mine) = by_owner.remove(self.incarnation()) {
            let answered = self.overview_here(mine, &mut seats).await?;
            coverage.answered.push(answered);
        }
        self.overview_peers(by_owner, &mut seats, &mut coverage)
            .await;

        // The company's seats nobody holds.
        for handle in self.holdings.company_handles() {
            if !seats.contains_key(&handle) {
                seats.insert(
                    handle.to_string(),
                    MemoryAnswer::Unheld {
                        handle: handle.to_string(),
                        answered_by: self.me(None),
                        memory: MemoryCounts::default(),
                    },
                );
            }
        }
        Ok(MemoryOverview {
            node_id: self.node_id().to_string(),
            incarnation: self.incarnation().to_string(),
            seats: seats.into_values().collect(),
            coverage,
        })
    }

    /// This node's own seats' rows, counted in its own store; what it
    /// answered for.
    async fn overview_here(
        &self,
        mine: Vec<(String, MemoryHolder)>,
        seats: &mut BTreeMap<String, SeatMemoryCounts>,
    ) -> Result<HolderCoverage, MemReadError> {
        let mut attached = Vec::new();
        for (handle, holder) in &mine {
            match self.here(handle) {
                Here::Attached(epoch) => attached.push((handle.clone(), holder.clone(), epoch)),
                Here::Not(epoch, reason) => {
                    seats.insert(
                        handle.clone(),
                        unavailable(handle, holder.clone(), self.me(epoch), reason),
                    );
                }
            }
        }
        let handles: Vec<String> = attached.iter().map(|(h, _, _)| h.clone()).collect();
        let mut counts = count_rows(&self.memory, &handles).await?;
        for (handle, holder, epoch) in attached {
            let memory = counts.remove(&handle).unwrap_or_default();
            seats.insert(
                handle.clone(),
                MemoryAnswer::Held {
                    handle,
                    holder,
                    answered_by: self.me(Some(epoch)),
                    memory,
                },
            );
        }
        Ok(HolderCoverage {
            node_id: self.node_id().to_string(),
            incarnation: self.incarnation().to_string(),
            local: true,
            seats: mine.into_iter().map(|(h, _)| h).collect(),
            reason: None,
            why: None,
        })
    }

    /// The other holders' seats: one request per holder, all at once; a
    /// holder that does not answer has its seats marked unavailable, saying
    /// why.
    async fn overview_peers(
        &self,
        by_owner: BTreeMap<String, Vec<(String, MemoryHolder)>>,
        seats: &mut BTreeMap<String, SeatMemoryCounts>,
        coverage: &mut MemoryCoverage,
    ) {
        let asks = by_owner.into_iter().map(|(owner, held)| async move {
            let request = WireRequest {
                seats: held.iter().map(|(h, _)| h.clone()).collect(),
                want: Want::Counts,
            };
            // Every lease of one owner names the same node.
            let holder = held[0].1.clone();
            let answer = self.ask(&holder, &request).await;
            (owner, held, answer)
        });
        for (owner, held, answer) in futures::future::join_all(asks).await {
            let node_id = held[0].1.node_id.clone();
            let handles: Vec<String> = held.iter().map(|(h, _)| h.clone()).collect();
            match answer {
                Ok(mut reply) => {
                    for (handle, holder) in held {
                        let seat = take_seat(&mut reply, &handle, holder, |a| match a {
                            WireAnswer::Counts(c) => Some(c),
                            _ => None,
                        });
                        seats.insert(handle, seat);
                    }
                    coverage.answered.push(HolderCoverage {
                        node_id,
                        incarnation: owner,
                        local: false,
                        seats: handles,
                        reason: None,
                        why: None,
                    });
                }
                Err(reason) => {
                    let said = why(&node_id, &reason);
                    for (handle, holder) in held {
                        seats.insert(
                            handle.clone(),
                            unavailable(&handle, holder, self.me(None), reason.clone()),
                        );
                    }
                    coverage.unanswered.push(HolderCoverage {
                        node_id,
                        incarnation: owner,
                        local: false,
                        seats: handles,
                        reason: Some(reason),
                        why: Some(said),
                    });
                }
            }
        }
    }
}
