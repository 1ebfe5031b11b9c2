//! Time as the controller's decisions take it: milliseconds since the Unix epoch, and
//! the RFC 3339 stamps the API server writes. A leaf: every pass module imports it,
//! it imports nothing of the controller.

use k8s_openapi::jiff::Timestamp;

/// Milliseconds since the Unix epoch.
pub type Millis = u64;

/// Parses an RFC 3339 stamp to milliseconds since the epoch.
pub fn millis(stamp: &str) -> Option<Millis> {
    stamp
        .parse::<Timestamp>()
        .ok()
        .map(|t| t.as_millisecond().max(0) as Millis)
}

/// Milliseconds since the epoch as an RFC 3339 stamp.
pub fn rfc3339(ms: Millis) -> String {
    Timestamp::from_millisecond(ms as i64)
        .unwrap_or(Timestamp::UNIX_EPOCH)
        .to_string()
}
