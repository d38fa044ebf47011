//! The wall clock as people read it: RFC 3339 timestamps for audit rows,
//! pages and records. (Ownership never reads this clock: leases are judged
//! on the coordination store's own, `coord::StoreTime`.)

/// The wall clock as RFC 3339 (UTC, seconds).
pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}
