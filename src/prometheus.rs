//! A Prometheus HTTP API client for instant queries: `GET <serverAddress>/api/v1/query?
//! query=…[&time=…]`. [`PromClient::query_one`] expects one sample, as KEDA's prometheus
//! scaler uses it (the autoscaler's triggers); [`PromClient::query_vector`] returns every
//! series with its labels, evaluated at a given time (the chargeback report).
//!
//! ```text
//! query_one ─► GET /api/v1/query (timeout) ─► status 200/400/422/503 + JSON envelope
//!    └─ decode_instant: vector of 0 series → Empty · 1 → Value · more → SeveralSeries
//!                       scalar → Value · "NaN" / "+Inf" → Value (non-finite; the caller decides)
//!                       status "error" → Prometheus's own errorType and error
//! query_vector ─► same GET with time= ─► decode_vector: every series (labels, value)
//! ```
//!
//! Every failure is a [`QueryError`] that says what went wrong and where (the server
//! down, a timeout, a bad address, Prometheus refusing the PromQL with its own message,
//! several series where one was expected), never a zero that looks like a reading.
//! [`decode_instant`] is pure and tested on the API's documented shapes; the HTTP part is
//! tested against a real Prometheus (`tests/prometheus.rs`).

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// Largest response read (an instant query for one series is a few hundred bytes; a
/// chargeback report's vector of a few thousand series is well under a MiB each).
const MAX_RESPONSE: usize = 32 << 20;

/// A query that gave no usable answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QueryError {
    #[error("serverAddress {address:?} is not usable: {why}")]
    BadAddress { address: String, why: String },
    #[error("Prometheus at {address} is unreachable: {why}")]
    Unreachable { address: String, why: String },
    #[error("Prometheus at {address} did not answer within {after:?}")]
    Timeout { address: String, after: Duration },
    /// Prometheus answered with `status: error` (bad PromQL, a query timeout, …).
    #[error("Prometheus refused the query ({error_type}): {error}")]
    Refused { error_type: String, error: String },
    #[error("Prometheus answered HTTP {status} without an API error")]
    Http { status: u16 },
    #[error("the response is not the Prometheus API's JSON: {0}")]
    Decode(String),
    /// KEDA's rule: the query must select one series.
    #[error("the query returned {0} series; it must return one (aggregate it, e.g. with sum())")]
    SeveralSeries(usize),
    #[error("the query returned a {0}; an instant vector or a scalar is needed")]
    WrongType(String),
}

/// One instant query's answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sample {
    /// One value (possibly NaN or ±Inf, as Prometheus writes them).
    Value(f64),
    /// An empty vector: no series matched.
    Empty,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default)]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Data {
    result_type: String,
    result: serde_json::Value,
}

/// `[<unix seconds>, "<value>"]`.
#[derive(Deserialize)]
struct Point(#[allow(dead_code)] f64, String);

#[derive(Deserialize)]
struct Series {
    value: Point,
}

#[derive(Deserialize)]
struct LabelledSeries {
    metric: BTreeMap<String, String>,
    value: Point,
}

/// One series of an instant vector: its labels (`__name__` included when Prometheus keeps
/// it) and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelledSample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

fn number(text: &str) -> Result<f64, QueryError> {
    // Go's strconv.FormatFloat writes NaN, +Inf, -Inf; Rust reads "inf" and "NaN".
    match text {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        _ => text
            .parse()
            .map_err(|_| QueryError::Decode(format!("{text:?} is not a sample value"))),
    }
}

/// The answer in an instant query's response body (any HTTP status: Prometheus puts
/// its errors in the same envelope).
pub fn decode_instant(status: u16, body: &[u8]) -> Result<Sample, QueryError> {
    let data = decode_envelope(status, body)?;
    match data.result_type.as_str() {
        "vector" => {
            let series: Vec<Series> = serde_json::from_value(data.result)
                .map_err(|e| QueryError::Decode(e.to_string()))?;
            match series.as_slice() {
                [] => Ok(Sample::Empty),
                [one] => number(&one.value.1).map(Sample::Value),
                many => Err(QueryError::SeveralSeries(many.len())),
            }
        }
        "scalar" => {
            let point: Point = serde_json::from_value(data.result)
                .map_err(|e| QueryError::Decode(e.to_string()))?;
            number(&point.1).map(Sample::Value)
        }
        other => Err(QueryError::WrongType(other.to_string())),
    }
}

/// Every series of an instant vector in a response body, in Prometheus's order; an empty
/// vector is an empty list (the caller decides whether that is an answer).
pub fn decode_vector(status: u16, body: &[u8]) -> Result<Vec<LabelledSample>, QueryError> {
    let data = decode_envelope(status, body)?;
    if data.result_type != "vector" {
        return Err(QueryError::WrongType(data.result_type));
    }
    let series: Vec<LabelledSeries> =
        serde_json::from_value(data.result).map_err(|e| QueryError::Decode(e.to_string()))?;
    series
        .into_iter()
        .map(|s| {
            Ok(LabelledSample {
                labels: s.metric,
                value: number(&s.value.1)?,
            })
        })
        .collect()
}

/// The `data` of a successful answer, or Prometheus's own error.
fn decode_envelope(status: u16, body: &[u8]) -> Result<Data, QueryError> {
    let envelope: Envelope = match serde_json::from_slice(body) {
        Ok(e) => e,
        Err(_) if status != 200 => return Err(QueryError::Http { status }),
        Err(e) => return Err(QueryError::Decode(e.to_string())),
    };
    if envelope.status != "success" {
        return Err(QueryError::Refused {
            error_type: envelope.error_type.unwrap_or_else(|| "unknown".into()),
            error: envelope.error.unwrap_or_default(),
        });
    }
    envelope
        .data
        .ok_or_else(|| QueryError::Decode("status success without data".into()))
}

/// An HTTP(S) client for instant queries; cheap to clone, one per process.
#[derive(Clone)]
pub struct PromClient {
    http: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
    timeout: Duration,
}

impl PromClient {
    /// A client whose queries give up after `timeout` (connect, send and read together).
    /// HTTPS servers are verified against the system's roots.
    pub fn new(timeout: Duration) -> std::io::Result<Self> {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()?
            .https_or_http()
            .enable_http1()
            .build();
        Ok(PromClient {
            http: Client::builder(TokioExecutor::new()).build(https),
            timeout,
        })
    }

    /// `query` evaluated now at `server` (its `serverAddress`: scheme, host, optional path
    /// prefix).
    pub async fn query_one(&self, server: &str, query: &str) -> Result<Sample, QueryError> {
        let uri = query_uri(server, query)?;
        let (status, body) = self.get(server, uri).await?;
        decode_instant(status, &body)
    }

    /// `query` evaluated at `at` (Unix seconds): every series of the instant vector.
    pub async fn query_vector(
        &self,
        server: &str,
        query: &str,
        at: i64,
    ) -> Result<Vec<LabelledSample>, QueryError> {
        let uri = query_uri_at(server, query, Some(at))?;
        let (status, body) = self.get(server, uri).await?;
        decode_vector(status, &body)
    }

    /// One GET within the timeout: the HTTP status and the body.
    async fn get(&self, server: &str, uri: hyper::Uri) -> Result<(u16, Bytes), QueryError> {
        let address = server.trim_end_matches('/').to_string();
        let call = async {
            let request = hyper::Request::get(uri)
                .header("accept", "application/json")
                .body(Full::new(Bytes::new()))
                .map_err(|e| QueryError::BadAddress {
                    address: address.clone(),
                    why: e.to_string(),
                })?;
            let response =
                self.http
                    .request(request)
                    .await
                    .map_err(|e| QueryError::Unreachable {
                        address: address.clone(),
                        why: error_chain(&e),
                    })?;
            let status = response.status().as_u16();
            let body = Limited::new(response.into_body(), MAX_RESPONSE)
                .collect()
                .await
                .map_err(|e| QueryError::Unreachable {
                    address: address.clone(),
                    why: format!("reading the answer: {e}"),
                })?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .unwrap_or(Err(QueryError::Timeout {
                address: address.clone(),
                after: self.timeout,
            }))
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// `<server>/api/v1/query?query=<encoded>`.
pub fn query_uri(server: &str, query: &str) -> Result<hyper::Uri, QueryError> {
    query_uri_at(server, query, None)
}

/// `<server>/api/v1/query?query=<encoded>[&time=<at>]`.
pub fn query_uri_at(server: &str, query: &str, at: Option<i64>) -> Result<hyper::Uri, QueryError> {
    let bad = |why: &str| QueryError::BadAddress {
        address: server.to_string(),
        why: why.to_string(),
    };
    let base = server.trim_end_matches('/');
    let parsed: hyper::Uri = base.parse().map_err(|_| bad("not a URL"))?;
    match parsed.scheme_str() {
        Some("http") | Some("https") => {}
        _ => return Err(bad("the scheme must be http or https")),
    }
    if parsed.host().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if parsed.query().is_some() {
        return Err(bad("a query string does not belong in serverAddress"));
    }
    let mut encoder = form_urlencoded::Serializer::new(String::new());
    encoder.append_pair("query", query);
    if let Some(at) = at {
        encoder.append_pair("time", &at.to_string());
    }
    let encoded = encoder.finish();
    format!("{base}/api/v1/query?{encoded}")
        .parse()
        .map_err(|_| bad("not a URL once the query path is added"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_shapes_decode_to_one_sample_or_a_clear_error() {
        let ok = |result_type: &str, result: &str| {
            format!(
                r#"{{"status":"success","data":{{"resultType":"{result_type}","result":{result}}}}}"#
            )
        };
        let cases: Vec<(u16, String, Result<Sample, QueryError>)> = vec![
            (200, ok("vector", r#"[{"metric":{},"value":[1700000000.1,"42.5"]}]"#), Ok(Sample::Value(42.5))),
            (200, ok("vector", "[]"), Ok(Sample::Empty)),
            (
                200,
                ok("vector", r#"[{"metric":{"a":"1"},"value":[1,"1"]},{"metric":{"a":"2"},"value":[1,"2"]}]"#),
                Err(QueryError::SeveralSeries(2)),
            ),
            (200, ok("scalar", r#"[1700000000,"7"]"#), Ok(Sample::Value(7.0))),
            (200, ok("vector", r#"[{"metric":{},"value":[1,"+Inf"]}]"#), Ok(Sample::Value(f64::INFINITY))),
            (200, ok("matrix", "[]"), Err(QueryError::WrongType("matrix".into()))),
            (
                400,
                r#"{"status":"error","errorType":"bad_data","error":"invalid parameter \"query\": 1:5: parse error: unexpected <EOF>"}"#.into(),
                Err(QueryError::Refused {
                    error_type: "bad_data".into(),
                    error: "invalid parameter \"query\": 1:5: parse error: unexpected <EOF>".into(),
                }),
            ),
            (502, "<html>bad gateway</html>".into(), Err(QueryError::Http { status: 502 })),
        ];
        for (status, body, want) in cases {
            assert_eq!(decode_instant(status, body.as_bytes()), want, "{body}");
        }
        let nan = decode_instant(
            200,
            ok("vector", r#"[{"metric":{},"value":[1,"NaN"]}]"#).as_bytes(),
        );
        assert!(matches!(nan, Ok(Sample::Value(v)) if v.is_nan()), "{nan:?}");
        assert!(matches!(
            decode_instant(200, b"{not json"),
            Err(QueryError::Decode(_))
        ));
    }

    #[test]
    fn a_vector_decodes_to_every_series_with_its_labels() {
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"namespace":"a","mode":"mig"},"value":[1700000000,"3600.5"]},
            {"metric":{},"value":[1700000000,"NaN"]}]}}"#;
        let got = decode_vector(200, body.as_bytes()).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].labels["namespace"], "a");
        assert_eq!(got[0].labels["mode"], "mig");
        assert_eq!(got[0].value, 3600.5);
        assert!(got[1].labels.is_empty() && got[1].value.is_nan());
        let empty = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        assert_eq!(decode_vector(200, empty.as_bytes()), Ok(vec![]));
        let scalar = r#"{"status":"success","data":{"resultType":"scalar","result":[1,"1"]}}"#;
        assert_eq!(
            decode_vector(200, scalar.as_bytes()),
            Err(QueryError::WrongType("scalar".into()))
        );
        let refused = r#"{"status":"error","errorType":"timeout","error":"query timed out"}"#;
        assert!(matches!(
            decode_vector(503, refused.as_bytes()),
            Err(QueryError::Refused { error_type, .. }) if error_type == "timeout"
        ));
        let at = query_uri_at("http://p:9090", "up", Some(1_700_000_000)).unwrap();
        assert_eq!(at.query(), Some("query=up&time=1700000000"));
    }

    #[test]
    fn server_addresses_are_checked_and_the_query_encoded() {
        let uri = query_uri(
            "http://prometheus.monitoring:9090/",
            r#"sum(rate(x{a="b"}[1m]))"#,
        )
        .unwrap();
        assert_eq!(
            uri.to_string(),
            "http://prometheus.monitoring:9090/api/v1/query?query=sum%28rate%28x%7Ba%3D%22b%22%7D%5B1m%5D%29%29"
        );
        let prefixed = query_uri("https://thanos.example/prom", "up").unwrap();
        assert_eq!(prefixed.path(), "/prom/api/v1/query");
        for bad in [
            "prometheus:9090",
            "ftp://p:21",
            "http://",
            "http://p:9090/?x=1",
            "not a url",
        ] {
            assert!(
                matches!(query_uri(bad, "up"), Err(QueryError::BadAddress { .. })),
                "{bad}"
            );
        }
    }
}
