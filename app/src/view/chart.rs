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

#[cfg(test)]
mod tests {
    use super::*;

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
