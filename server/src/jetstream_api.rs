//! What a NATS server says of its JetStream API: the level (`api.level` in
//! the `$JS.API.INFO` answer) that the coordination store and the mail
//! queue gate every newer server feature on — never the version string.
//! It owns nothing but that one question and the reading of its answer.

use std::time::Duration;

use bytes::Bytes;

/// The JetStream API's subject prefix: the node's JetStream contexts are
/// made with `jetstream::new` (no domain, no custom prefix).
pub const API_PREFIX: &str = "$JS.API";

/// Pure: the JetStream API level a `$JS.API.INFO` answer states
/// (`api.level`; 0 when it states none, as servers before 2.11 do).
pub fn api_level_in(info: &serde_json::Value) -> u32 {
    info.pointer("/api/level")
        .and_then(serde_json::Value::as_u64)
        .map_or(0, |l| u32::try_from(l).unwrap_or(u32::MAX))
}

/// The server's JetStream API level, asked of `$JS.API.INFO`. 0 when the
/// answer cannot be had within `timeout` or read (every newer feature off).
pub async fn api_level(client: &async_nats::Client, timeout: Duration) -> u32 {
    match tokio::time::timeout(timeout, client.request("$JS.API.INFO", Bytes::new())).await {
        Ok(Ok(m)) => serde_json::from_slice(&m.payload)
            .map(|v| api_level_in(&v))
            .unwrap_or(0),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_level_is_read_from_the_info_answer_and_0_where_it_states_none() {
        let level = |j: &str| api_level_in(&serde_json::from_str(j).unwrap_or_default());
        // 2.15.1's answer (abridged), 2.9.10's (no level), a garbled one.
        assert_eq!(
            level(
                r#"{"type":"io.nats.jetstream.api.v1.account_info_response","api":{"level":2,"total":7,"errors":0}}"#
            ),
            2
        );
        assert_eq!(level(r#"{"api":{"total":7,"errors":0}}"#), 0);
        assert_eq!(level(r#"{"api":{"level":"two"}}"#), 0);
    }
}
