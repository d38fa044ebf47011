//! How often a sign-in may be tried: growing delays per client address,
//! per name from one address and per name from anywhere, decided before
//! any password is checked.
//!
//! Pure: time enters as a value. An attempt is counted when it is admitted
//! (under the caller's lock, before the slow password check), so attempts
//! racing each other all see the ones before them. A success forgets the
//! attempt's keys. Nothing here is a lockout anyone can hold for long: the
//! per-name delay from anywhere stops growing at a few seconds, so somebody
//! guessing `admin`'s password from many addresses slows the real admin
//! down by at most that much; the long delays are per address.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How one kind of key grows its delay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Attempts admitted with no delay.
    pub free: u32,
    /// The delay after the first attempt past `free`; it doubles with each
    /// attempt after that.
    pub base: Duration,
    /// The longest delay.
    pub cap: Duration,
}

/// The rules a node signs people in by.
pub const BY_ADDRESS: Rule = Rule {
    free: 5,
    base: Duration::from_secs(1),
    cap: Duration::from_secs(60),
};
pub const BY_NAME_FROM_ADDRESS: Rule = Rule {
    free: 3,
    base: Duration::from_secs(1),
    cap: Duration::from_secs(60),
};
pub const BY_NAME: Rule = Rule {
    free: 20,
    base: Duration::from_millis(500),
    cap: Duration::from_secs(5),
};

/// A key not tried for this long is forgotten.
pub const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);
/// The most keys remembered; past it the longest-quiet key is forgotten.
pub const MAX_KEYS: usize = 10_000;

impl Rule {
    /// Pure: how long after its `n`th counted attempt a key must wait.
    pub fn delay(&self, n: u32) -> Duration {
        if n <= self.free {
            return Duration::ZERO;
        }
        let doublings = (n - self.free - 1).min(30);
        self.base
            .checked_mul(1u32 << doublings)
            .unwrap_or(self.cap)
            .min(self.cap)
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    attempts: u32,
    last: Instant,
    open_at: Instant,
    /// A refusal in the current wait was already reported.
    refusal_reported: bool,
}

/// The answer to an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Check the password (the attempt is counted).
    Check,
    /// Wait this long first. `first` is true for the first refusal in this
    /// wait (the one worth an audit row).
    Wait { retry_after: Duration, first: bool },
}

/// Every key's attempts.
#[derive(Debug, Default)]
pub struct Limiter {
    keys: HashMap<String, Entry>,
}

impl Limiter {
    /// Admit or refuse one attempt under `keys`, at `now`.
    pub fn admit(&mut self, keys: &[(String, Rule)], now: Instant) -> Admission {
        self.forget(now);
        let mut wait = Duration::ZERO;
        let mut first = false;
        for (k, _) in keys {
            if let Some(e) = self.keys.get_mut(k)
                && e.open_at > now
            {
                let left = e.open_at - now;
                if left > wait {
                    wait = left;
                }
                if !e.refusal_reported {
                    e.refusal_reported = true;
                    first = true;
                }
            }
        }
        if !wait.is_zero() {
            return Admission::Wait {
                retry_after: wait,
                first,
            };
        }
        for (k, rule) in keys {
            if !self.keys.contains_key(k) && self.keys.len() >= MAX_KEYS {
                self.evict_quietest();
            }
            let e = self.keys.entry(k.clone()).or_insert(Entry {
                attempts: 0,
                last: now,
                open_at: now,
                refusal_reported: false,
            });
            e.attempts = e.attempts.saturating_add(1);
            e.last = now;
            e.open_at = now + rule.delay(e.attempts);
            e.refusal_reported = false;
        }
        Admission::Check
    }

    /// The attempt under `keys` signed in: forget them.
    pub fn succeeded(&mut self, keys: &[(String, Rule)]) {
        for (k, _) in keys {
            self.keys.remove(k);
        }
    }

    /// Keys remembered (tests).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    fn forget(&mut self, now: Instant) {
        self.keys
            .retain(|_, e| e.open_at > now || now.duration_since(e.last) < FORGET_AFTER);
    }

    fn evict_quietest(&mut self) {
        if let Some(k) = self
            .keys
            .iter()
            .min_by_key(|(_, e)| e.last)
            .map(|(k, _)| k.clone())
        {
            self.keys.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(addr: &str, name: &str) -> Vec<(String, Rule)> {
        vec![
            (format!("ip:{addr}"), BY_ADDRESS),
            (format!("name:{name}@{addr}"), BY_NAME_FROM_ADDRESS),
            (format!("name:{name}"), BY_NAME),
        ]
    }

    #[test]
    fn delays_grow_after_the_free_attempts_and_stop_at_the_cap() {
        let r = BY_NAME_FROM_ADDRESS;
        assert_eq!(r.delay(1), Duration::ZERO);
        assert_eq!(r.delay(3), Duration::ZERO);
        assert_eq!(r.delay(4), Duration::from_secs(1));
        assert_eq!(r.delay(5), Duration::from_secs(2));
        assert_eq!(r.delay(6), Duration::from_secs(4));
        assert_eq!(r.delay(100), Duration::from_secs(60));
        assert_eq!(r.delay(u32::MAX), Duration::from_secs(60));
    }

    #[test]
    fn attempts_are_counted_when_admitted_so_a_burst_cannot_pass_the_limit() {
        let mut l = Limiter::default();
        let now = Instant::now();
        let k = keys("10.0.0.1", "admin");
        // A hundred attempts at the same instant, none of them finished:
        // only the free ones are admitted.
        let admitted = (0..100)
            .filter(|_| l.admit(&k, now) == Admission::Check)
            .count();
        assert_eq!(admitted as u32, BY_NAME_FROM_ADDRESS.free + 1);
    }

    #[test]
    fn a_waiting_key_reports_its_first_refusal_once_and_opens_after_its_delay() {
        let mut l = Limiter::default();
        let t0 = Instant::now();
        let k = keys("10.0.0.1", "admin");
        for _ in 0..4 {
            assert_eq!(l.admit(&k, t0), Admission::Check);
        }
        assert_eq!(
            l.admit(&k, t0),
            Admission::Wait {
                retry_after: Duration::from_secs(1),
                first: true
            }
        );
        assert!(matches!(
            l.admit(&k, t0 + Duration::from_millis(500)),
            Admission::Wait { first: false, .. }
        ));
        assert_eq!(l.admit(&k, t0 + Duration::from_secs(1)), Admission::Check);
    }

    #[test]
    fn guesses_from_one_address_do_not_hold_the_name_from_another() {
        let mut l = Limiter::default();
        let t0 = Instant::now();
        let attacker = keys("10.0.0.66", "admin");
        for _ in 0..50 {
            l.admit(&attacker, t0);
        }
        assert!(matches!(l.admit(&attacker, t0), Admission::Wait { .. }));
        // The real admin, elsewhere, waits at most the per-name cap.
        match l.admit(&keys("10.0.0.7", "admin"), t0) {
            Admission::Check => {}
            Admission::Wait { retry_after, .. } => assert!(retry_after <= BY_NAME.cap),
        }
        assert_eq!(
            l.admit(&keys("10.0.0.7", "admin"), t0 + BY_NAME.cap),
            Admission::Check
        );
    }

    #[test]
    fn a_success_forgets_the_attempts_keys() {
        let mut l = Limiter::default();
        let t0 = Instant::now();
        let k = keys("10.0.0.1", "alice");
        for _ in 0..3 {
            l.admit(&k, t0);
        }
        l.succeeded(&k);
        assert!(l.is_empty());
    }

    #[test]
    fn quiet_keys_are_forgotten_and_the_table_is_bounded() {
        let mut l = Limiter::default();
        let t0 = Instant::now();
        l.admit(&keys("10.0.0.1", "a"), t0);
        assert_eq!(l.len(), 3);
        l.admit(&keys("10.0.0.2", "b"), t0 + FORGET_AFTER);
        assert_eq!(l.len(), 3, "the first attempt's keys were forgotten");
        let mut l = Limiter::default();
        for i in 0..(MAX_KEYS + 10) {
            l.admit(
                &[(format!("ip:{i}"), BY_ADDRESS)],
                t0 + Duration::from_millis(i as u64),
            );
        }
        assert_eq!(l.len(), MAX_KEYS);
    }
}
