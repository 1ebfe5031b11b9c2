//! Runs a chargeback report against a Prometheus server: both counters' increases over
//! every chunk of the window, concurrently, each answer checked before it is summed.
//!
//! ```text
//! run ─► for measure in [allocated, used], chunk in window.chunks():  (concurrent)
//!          query_vector(increase_query, time = chunk.to)
//!      ─► allocated empty in every chunk → NoData (never a table of zeros)
//!      ─► allocated empty in some chunks → those spans listed as missing
//!      ─► report::assemble (used missing for a row → shown as n/a)
//! ```

use super::metrics::{ALLOCATED, USED};
use super::report::{assemble, spans, totals, GroupBy, Reading, Report, Source, Window};
use crate::prometheus::{PromClient, QueryError};
use futures::future::try_join_all;

/// A report that could not be made, naming the part that is missing.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{measure} GPU-seconds for {chunk_from}..{chunk_to}: {source}")]
    Query {
        measure: &'static str,
        chunk_from: String,
        chunk_to: String,
        #[source]
        source: QueryError,
    },
    #[error(
        "{measure} GPU-seconds: Prometheus answered a non-finite value ({value}) for {labels}"
    )]
    NotFinite {
        measure: &'static str,
        value: f64,
        labels: String,
    },
    #[error("no {metric} samples between {from} and {to}: the node agents did not export chargeback counters then, or Prometheus no longer keeps that range")]
    NoData {
        metric: &'static str,
        from: String,
        to: String,
    },
}

/// The report for `window` grouped by `by`, from the Prometheus at `server`, reading
/// `source`.
pub async fn run(
    client: &PromClient,
    server: &str,
    window: &Window,
    by: &GroupBy,
    source: Source,
) -> Result<Report, ReadError> {
    let (allocated, used) = futures::try_join!(
        measure(client, server, window, by, source, "allocated", ALLOCATED),
        measure(client, server, window, by, source, "used", USED),
    )?;
    let missing: Vec<Window> = allocated
        .iter()
        .filter(|(_, readings)| readings.is_empty())
        .map(|(chunk, _)| *chunk)
        .collect();
    if missing.len() == allocated.len() {
        return Err(ReadError::NoData {
            metric: ALLOCATED,
            from: super::report::format_time(window.from),
            to: super::report::format_time(window.to),
        });
    }
    let flat = |m: Vec<(Window, Vec<Reading>)>| m.into_iter().flat_map(|(_, r)| r);
    Ok(assemble(
        window,
        by,
        totals(flat(allocated), by),
        &totals(flat(used), by),
        spans(&missing),
    ))
}

/// One counter's increase over every chunk of the window.
async fn measure(
    client: &PromClient,
    server: &str,
    window: &Window,
    by: &GroupBy,
    source: Source,
    measure: &'static str,
    metric: &str,
) -> Result<Vec<(Window, Vec<Reading>)>, ReadError> {
    let chunks = window.chunks().into_iter().map(|chunk| async move {
        let query = chunk.query(source, metric, by);
        let answer = client
            .query_vector(server, &query, chunk.to)
            .await
            .map_err(|source| ReadError::Query {
                measure,
                chunk_from: super::report::format_time(chunk.from),
                chunk_to: super::report::format_time(chunk.to),
                source,
            })?;
        let readings = answer
            .into_iter()
            .map(|s| {
                if s.value.is_finite() {
                    Ok(Reading {
                        labels: s.labels,
                        value: s.value,
                    })
                } else {
                    Err(ReadError::NotFinite {
                        measure,
                        value: s.value,
                        labels: format!("{:?}", s.labels),
                    })
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((chunk, readings))
    });
    try_join_all(chunks).await
}
