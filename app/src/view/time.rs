//! How a moment reads to a person: relative while it is today ("just
//! now", "42 s ago", "3 min ago", "2 h ago", "in 5 min"), the date and
//! time when it is not, and on hover the absolute time with its zone —
//! on the browser's clock, or on UTC when the person switched to it.

use time::{OffsetDateTime, UtcOffset};

use super::fleet::rfc3339_seconds;

/// The clock a page reads times on.
#[derive(Clone, Debug, PartialEq)]
pub struct Clock {
    /// Now, in Unix seconds.
    pub now: f64,
    /// The browser's offset from UTC in minutes (east positive).
    pub offset_minutes: i32,
    /// The browser's zone name (`America/Los_Angeles`), when it says.
    pub zone: String,
    /// Show UTC instead of the browser's time.
    pub utc: bool,
}

/// Pure: `UTC−08:00` for an offset in minutes.
pub fn offset_label(minutes: i32) -> String {
    if minutes == 0 {
        return "UTC".into();
    }
    let sign = if minutes < 0 { '−' } else { '+' };
    let m = minutes.unsigned_abs();
    format!("UTC{sign}{:02}:{:02}", m / 60, m % 60)
}

fn on(t: f64, minutes: i32) -> Option<OffsetDateTime> {
    let offset = UtcOffset::from_whole_seconds(minutes * 60).ok()?;
    Some(
        OffsetDateTime::from_unix_timestamp(t.floor() as i64)
            .ok()?
            .to_offset(offset),
    )
}

fn ymd_hms(d: &OffsetDateTime) -> (String, String) {
    (
        format!("{:04}-{:02}-{:02}", d.year(), u8::from(d.month()), d.day()),
        format!("{:02}:{:02}:{:02}", d.hour(), d.minute(), d.second()),
    )
}

/// Pure: the words for `seconds` between now and then.
fn relative(seconds: f64) -> String {
    let future = seconds < 0.0;
    let s = seconds.abs().round() as u64;
    let span = match s {
        0..=9 => return "just now".into(),
        10..=59 => format!("{s} s"),
        60..=3599 => format!("{} min", s / 60),
        _ => format!("{} h", s / 3600),
    };
    if future {
        format!("in {span}")
    } else {
        format!("{span} ago")
    }
}

/// Pure: what a moment `at` (RFC 3339) shows on `clock` — the visible
/// words and the hover text. `None` when `at` is not a UTC RFC 3339 time.
pub fn when(at: &str, clock: &Clock) -> Option<(String, String)> {
    let t = rfc3339_seconds(at)?;
    let minutes = if clock.utc { 0 } else { clock.offset_minutes };
    let then = on(t, minutes)?;
    let now = on(clock.now, minutes)?;
    let (day, hms) = ymd_hms(&then);
    let zone = if clock.utc || clock.zone.is_empty() {
        offset_label(minutes)
    } else {
        format!("{} ({})", clock.zone, offset_label(minutes))
    };
    let hover = format!("{day} {hms} {zone}");
    let delta = clock.now - t;
    let visible = if then.date() == now.date() || delta.abs() < 3600.0 {
        relative(delta)
    } else {
        format!("{day} {}", &hms[..5])
    };
    Some((visible, hover))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock(now: &str, offset_minutes: i32, zone: &str, utc: bool) -> Clock {
        Clock {
            now: rfc3339_seconds(now).unwrap(),
            offset_minutes,
            zone: zone.into(),
            utc,
        }
    }

    #[test]
    fn a_moment_today_reads_relative_with_the_local_time_and_zone_on_hover() {
        // 08:18 UTC is 00:18 in Los Angeles: "since 08:18" was wrong there.
        let la = clock("2026-12-01T08:22:00Z", -480, "America/Los_Angeles", false);
        assert_eq!(
            when("2026-12-01T08:18:30Z", &la),
            Some((
                "3 min ago".into(),
                "2026-12-01 00:18:30 America/Los_Angeles (UTC−08:00)".into()
            ))
        );
        assert_eq!(when("2026-12-01T08:21:55Z", &la).unwrap().0, "just now");
        assert_eq!(when("2026-12-01T08:21:18Z", &la).unwrap().0, "42 s ago");
        assert_eq!(when("2026-12-01T08:27:00Z", &la).unwrap().0, "in 5 min");
    }

    #[test]
    fn a_moment_on_another_day_shows_its_date_and_utc_is_a_switch() {
        let la = clock("2026-12-01T10:00:00Z", -480, "America/Los_Angeles", false);
        // 07:00 UTC is 23:00 the day before in Los Angeles.
        assert_eq!(
            when("2026-12-01T07:00:00Z", &la).unwrap().0,
            "2026-11-30 23:00"
        );
        let utc = Clock { utc: true, ..la };
        assert_eq!(
            when("2026-12-01T07:00:00Z", &utc),
            Some(("3 h ago".into(), "2026-12-01 07:00:00 UTC".into()))
        );
        assert_eq!(offset_label(330), "UTC+05:30");
        assert_eq!(when("not a time", &utc), None);
    }
}
