//! The claim pace: how many seats the next pass may claim, and whether it
//! runs at the sweep interval or soon after this one.
//!
//! A pass claims at most `coordination.claim_limit` seats as configured,
//! because every takeover starts the seat's child processes. A pass that
//! won and established every claim it tried while its limit cut free
//! seats off is followed by another [`crate::seat::placement::RECHECK_AFTER`]
//! later with twice the limit, up to [`CLAIM_PACE_MAX`]: a cold node, or a
//! survivor of a dead peer, holds every seat its share allows within a few
//! passes whatever the seat count, while the establishments stay bounded
//! by how many run at once (`CLAIMS_AT_ONCE`), not by the sweep. Each
//! follow-up pass reads the roster afresh, so a peer that starts meanwhile
//! shrinks the share before the next pass claims more. Any claim lost to
//! a peer, refused, or handed back returns the pace to the configured
//! limit. Pure: the sweep keeps the current limit and asks here.
//!
//! Giving back has the same pace ([`next_release`]): a pass that handed
//! over every seat it gave back while `coordination.release_limit` cut
//! more of its excess off is followed soon by one allowed twice as many,
//! up to [`RELEASE_PACE_MAX`], so a node joining a fleet of 1,000-seat
//! nodes reaches its share in a few passes instead of one sweep for every
//! two seats. A seat the peer did not take (the offer withdrawn) returns
//! the pace to the configured limit.

/// The most seats one pass claims however long a node has been winning:
/// a peer starting while a pass is under way sees at most this many seats
/// claimed past its share, to be given back.
pub const CLAIM_PACE_MAX: usize = 256;

/// The most seats one pass gives back however long its handoffs have
/// been taken: a pass gives its seats back one after another, each a
/// handoff the taker answers, so this bounds how long one pass runs.
pub const RELEASE_PACE_MAX: usize = 64;

/// What one pass did with the seats it moved: for [`next`] its claims
/// (`tried`, and `won` and established), for [`next_release`] its
/// give-backs (`tried`, and `won`: handed over or let go).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassTally {
    /// The limit the pass was planned with.
    pub limit: usize,
    /// The plan had more free seats for this node than the limit let it try.
    pub cut: bool,
    /// Claims the pass tried.
    pub tried: usize,
    /// Of those, won and established here.
    pub won: usize,
}

/// The next pass's limit, and whether it runs soon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pace {
    pub limit: usize,
    /// Run the next pass soon (free seats wait for this node), not at the
    /// sweep interval.
    pub soon: bool,
}

/// The pace after a pass, `configured` being `coordination.claim_limit`.
pub fn next(configured: usize, pass: PassTally) -> Pace {
    paced(configured, CLAIM_PACE_MAX, pass)
}

/// The next pass's release limit, `configured` being
/// `coordination.release_limit`; `pass.cut` says the limit left excess
/// seats held.
pub fn next_release(configured: usize, pass: PassTally) -> Pace {
    paced(configured, RELEASE_PACE_MAX, pass)
}

fn paced(configured: usize, max: usize, pass: PassTally) -> Pace {
    let more_waiting = pass.cut && pass.won > 0;
    let all_won = pass.tried > 0 && pass.won == pass.tried;
    let limit = if more_waiting && all_won {
        pass.limit
            .saturating_mul(2)
            .clamp(configured, max.max(configured))
    } else {
        configured
    };
    Pace {
        limit,
        soon: more_waiting,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(limit: usize, cut: bool, tried: usize, won: usize) -> PassTally {
        PassTally {
            limit,
            cut,
            tried,
            won,
        }
    }

    #[test]
    fn a_pass_that_won_every_claim_with_free_seats_left_doubles_the_limit_and_runs_again_soon() {
        assert_eq!(
            next(4, pass(4, true, 4, 4)),
            Pace {
                limit: 8,
                soon: true
            }
        );
        assert_eq!(next(4, pass(64, true, 64, 64)).limit, 128);
    }

    #[test]
    fn a_pass_that_handed_over_every_seat_it_gave_back_with_excess_left_doubles_the_release_limit()
    {
        assert_eq!(
            next_release(2, pass(2, true, 2, 2)),
            Pace {
                limit: 4,
                soon: true
            }
        );
        assert_eq!(
            next_release(2, pass(64, true, 64, 64)).limit,
            RELEASE_PACE_MAX
        );
        // A withdrawn offer: back to the configured limit, excess tried soon.
        assert_eq!(
            next_release(2, pass(16, true, 16, 15)),
            Pace {
                limit: 2,
                soon: true
            }
        );
        // Nothing cut: the excess is gone, the next pass at the sweep.
        assert_eq!(
            next_release(2, pass(8, false, 3, 3)),
            Pace {
                limit: 2,
                soon: false
            }
        );
    }

    #[test]
    fn the_pace_never_passes_its_cap_nor_falls_below_the_configured_limit() {
        assert_eq!(next(4, pass(256, true, 256, 256)).limit, CLAIM_PACE_MAX);
        assert_eq!(next(4, pass(200, true, 200, 200)).limit, CLAIM_PACE_MAX);
        // A configured limit above the cap is the operator's: kept.
        assert_eq!(next(500, pass(500, true, 500, 500)).limit, 500);
    }

    #[test]
    fn a_lost_or_handed_back_claim_returns_to_the_configured_limit_but_the_seats_left_are_tried_soon()
     {
        assert_eq!(
            next(4, pass(32, true, 32, 31)),
            Pace {
                limit: 4,
                soon: true
            }
        );
    }

    #[test]
    fn a_pass_that_claimed_everything_it_found_or_nothing_waits_the_sweep_at_the_configured_limit()
    {
        let calm = Pace {
            limit: 4,
            soon: false,
        };
        // Every free seat taken: nothing waits.
        assert_eq!(next(4, pass(64, false, 10, 10)), calm);
        // Cut, yet nothing won (peers took them, or the gate refused).
        assert_eq!(next(4, pass(16, true, 16, 0)), calm);
        // Nothing to claim.
        assert_eq!(next(4, pass(8, false, 0, 0)), calm);
    }
}
