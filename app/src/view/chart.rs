//! A seat's last hour as its page charts it: the shapes of a bar chart and
//! a line, in an SVG's own units — pure, so every shape is tested as
//! numbers.

/// One bar: x, y, width and height.
#[derive(Clone, Debug, PartialEq)]
pub struct Bar {
    pub x: f64,
    pub y: f64,
    pub w: f64,
    pub h: f64,
}

/// Pure: a bar per value across `width`, the tallest `height` high (all
/// flat when every value is 0).
pub fn bars(values: &[u64], width: f64, height: f64) -> Vec<Bar> {
    let top = values.iter().copied().max().unwrap_or(0).max(1) as f64;
    let step = width / values.len().max(1) as f64;
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let h = *v as f64 / top * height;
            Bar {
                x: i as f64 * step,
                y: height - h,
                w: (step - 1.0).max(1.0),
                h,
            }
        })
        .collect()
}

/// Pure: a point per value that is some (a minute with no turn has no
/// duration), across `width`, the highest at the top of `height`.
pub fn dots(values: &[Option<u64>], width: f64, height: f64) -> Vec<(f64, f64)> {
    let top = values.iter().flatten().copied().max().unwrap_or(0).max(1) as f64;
    let step = width / values.len().max(1) as f64;
    values
        .iter()
        .enumerate()
        .filter_map(|(i, v)| {
            v.map(|v| {
                (
                    i as f64 * step + step / 2.0,
                    height - v as f64 / top * height,
                )
            })
        })
        .collect()
}

/// Pure: an SVG polyline's points through [`dots`].
pub fn line_points(values: &[Option<u64>], width: f64, height: f64) -> String {
    dots(values, width, height)
        .into_iter()
        .map(|(x, y)| format!("{x:.1},{y:.1}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Pure: a duration in milliseconds in words: `850 ms`, `2.5 s`, then
/// as [`super::duration_words`] from 10 s.
pub fn ms_words(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms} ms"),
        1_000..=9_999 => format!("{:.1} s", ms as f64 / 1000.0),
        _ => super::duration_words(ms / 1000),
    }
}

/// Pure: a seat's inbox over the hour in words: its depth at the latest
/// sample, the deepest in the hour, or that nobody sampled it.
pub fn inbox_words(minutes: &[crate::api::InboxMinute]) -> String {
    let latest = minutes
        .iter()
        .filter_map(|m| m.latest.or(m.depth))
        .next_back();
    let top = minutes.iter().filter_map(|m| m.depth).max();
    match (latest, top) {
        (Some(now), Some(top)) => {
            let mail = |n: u64| {
                if n == 1 {
                    "1 message".to_string()
                } else {
                    format!("{n} messages")
                }
            };
            format!(
                "{} waiting at the last sample, at most {} in the hour.",
                mail(now),
                mail(top)
            )
        }
        _ => "not sampled in the last hour (no node held the seat).".to_string(),
    }
}

/// A node's strip in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StripWords {
    pub held: String,
    pub turns: String,
    pub store: String,
    pub turns_total: u64,
}

/// Pure: a node's hour in words: the seats it holds at its last sample,
/// its turns in the hour and its busiest minute, and its store p99 at its
/// last timed minute and at its worst.
pub fn strip_words(minutes: &[crate::api::NodeMinute]) -> StripWords {
    let held = minutes.iter().filter_map(|m| m.seats_held).next_back();
    let turns_total: u64 = minutes.iter().map(|m| m.turns).sum();
    let busiest = minutes.iter().map(|m| m.turns).max().unwrap_or(0);
    let p99s: Vec<u64> = minutes.iter().filter_map(|m| m.store_p99_us).collect();
    let us = |v: u64| match v {
        0..=999 => format!("{v} µs"),
        1_000..=9_999 => format!("{:.1} ms", v as f64 / 1000.0),
        _ => ms_words(v / 1_000),
    };
    StripWords {
        held: match held {
            Some(n) => format!("Seats held: {n} now"),
            None => "Seats held: not sampled".to_string(),
        },
        turns: if turns_total == 0 {
            "Turns: none this hour".to_string()
        } else {
            format!("Turns: {turns_total} this hour, at most {busiest} a minute")
        },
        store: match (p99s.last(), p99s.iter().max()) {
            (Some(now), Some(top)) => format!("Store p99: {} now, {} at worst", us(*now), us(*top)),
            _ => "Store p99: no call timed".to_string(),
        },
        turns_total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_strip_in_words_names_its_seats_now_its_turns_and_its_store_p99() {
        let m = |held: Option<u64>, turns: u64, p99: Option<u64>| crate::api::NodeMinute {
            minute: String::new(),
            seats_held: held,
            turns,
            store_p99_us: p99,
        };
        let w = strip_words(&[
            m(Some(3), 2, Some(400)),
            m(Some(5), 7, Some(2_500)),
            m(None, 0, Some(900)),
        ]);
        assert_eq!(w.held, "Seats held: 5 now");
        assert_eq!(w.turns, "Turns: 9 this hour, at most 7 a minute");
        assert_eq!(w.store, "Store p99: 900 µs now, 2.5 ms at worst");
        assert_eq!(w.turns_total, 9);
        let quiet = strip_words(&[m(None, 0, None)]);
        assert_eq!(quiet.held, "Seats held: not sampled");
        assert_eq!(quiet.turns, "Turns: none this hour");
        assert_eq!(quiet.store, "Store p99: no call timed");
    }

    #[test]
    fn the_inbox_in_words_says_the_last_sample_and_the_deepest_or_that_none_was_taken() {
        let m = |depth: Option<u64>, latest: Option<u64>| crate::api::InboxMinute {
            minute: String::new(),
            depth,
            latest,
        };
        assert_eq!(
            inbox_words(&[
                m(None, None),
                m(Some(4), Some(4)),
                m(Some(9), Some(1)),
                m(None, None)
            ]),
            "1 message waiting at the last sample, at most 9 messages in the hour."
        );
        assert_eq!(
            inbox_words(&[m(None, None), m(None, None)]),
            "not sampled in the last hour (no node held the seat)."
        );
    }

    #[test]
    fn a_duration_in_ms_reads_in_ms_then_seconds_then_minutes() {
        assert_eq!(ms_words(850), "850 ms");
        assert_eq!(ms_words(2_500), "2.5 s");
        assert_eq!(ms_words(75_000), "1 min 15 s");
    }

    #[test]
    fn bars_are_scaled_to_the_tallest_and_an_empty_hour_is_flat() {
        let b = bars(&[0, 2, 4], 30.0, 20.0);
        assert_eq!(b.len(), 3);
        assert_eq!((b[0].x, b[0].h), (0.0, 0.0));
        assert_eq!((b[1].x, b[1].y, b[1].h), (10.0, 10.0, 10.0));
        assert_eq!((b[2].y, b[2].h, b[2].w), (0.0, 20.0, 9.0));
        assert!(bars(&[0, 0], 10.0, 10.0).iter().all(|b| b.h == 0.0));
    }

    #[test]
    fn a_line_passes_only_through_the_minutes_that_have_a_value() {
        assert_eq!(
            line_points(&[None, Some(50), Some(100)], 30.0, 10.0),
            "15.0,5.0 25.0,0.0"
        );
        assert_eq!(line_points(&[None, None], 10.0, 10.0), "");
    }
}
