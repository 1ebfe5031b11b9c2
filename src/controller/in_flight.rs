//! Writes to distinct objects run a bounded number at a time ([`at_most`]): each waits
//! for its own round trip to the API server, so n of them take about n / limit round
//! trips instead of n. A leaf: the writers (`writes`, `workload_writer`) and the
//! reconciler use it.

use futures::stream::{FuturesUnordered, StreamExt};
use std::future::Future;

/// Runs `writes`, at most `limit` at a time, and gives their outcomes (in the order
/// they finish). For writes to distinct objects: each waits for its own round trip, so
/// n of them take about n / `limit` round trips instead of n.
pub(crate) async fn at_most<T, F: Future<Output = T>>(
    writes: impl IntoIterator<Item = F>,
    limit: usize,
) -> Vec<T> {
    let mut writes = writes.into_iter();
    let mut running = FuturesUnordered::new();
    let mut out = Vec::new();
    loop {
        while running.len() < limit.max(1) {
            match writes.next() {
                Some(w) => running.push(w),
                None => break,
            }
        }
        match running.next().await {
            Some(t) => out.push(t),
            None => return out,
        }
    }
}
