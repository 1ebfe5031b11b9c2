//! A real Prometheus server (Debian's `prometheus`) on a loopback port, scraping a small
//! exporter whose samples the test sets, for the tests that query Prometheus the way the
//! autoscaler and the chargeback report do; or serving a TSDB that `promtool tsdb
//! create-blocks-from openmetrics` filled with a backfill ([`backfill`],
//! [`Prometheus::on_tsdb`]).
//!
//! `Prometheus::start` returns `None` (after `skip::tool_missing`, which fails in CI) when
//! the binary is not installed. The server's data lives in a temporary directory; it is
//! killed when dropped.

#![allow(dead_code)]

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The exporter's page: OpenMetrics/Prometheus text the test rewrites at will.
#[derive(Clone, Default)]
pub struct Exporter {
    page: Arc<Mutex<String>>,
    pub addr: Option<SocketAddr>,
}

impl Exporter {
    /// Serves `/metrics` on a loopback port until the runtime ends.
    pub async fn start() -> Exporter {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let page: Arc<Mutex<String>> = Arc::default();
        let served = page.clone();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let page = served.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |_req| {
                        let body = page.lock().unwrap().clone();
                        async move {
                            hyper::Response::builder()
                                .header("content-type", "text/plain; version=0.0.4")
                                .body(Full::new(Bytes::from(body)))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                });
            }
        });
        Exporter {
            page,
            addr: Some(addr),
        }
    }

    /// A target served by someone else at `addr` (the page is not this exporter's).
    pub fn at(addr: SocketAddr) -> Exporter {
        Exporter {
            page: Arc::default(),
            addr: Some(addr),
        }
    }

    /// Replaces the page (Prometheus text format).
    pub fn set(&self, text: &str) {
        *self.page.lock().unwrap() = text.to_string();
    }
}

pub struct Prometheus {
    child: Child,
    pub url: String,
    _data: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Prometheus {
    /// Prometheus scraping `exporter` every second; ready when this returns.
    pub async fn start(exporter: &Exporter) -> Option<Prometheus> {
        let target = exporter.addr.expect("a started exporter");
        let config = format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             scrape_configs:\n- job_name: exporter\n  static_configs: [{{targets: ['{target}']}}]\n"
        );
        Self::spawn(&config, None).await
    }

    /// Prometheus scraping `target`'s `/metrics` every second with `honor_labels: true`
    /// (the node agent's series carry the workload's `namespace` and `pod`); ready when
    /// this returns.
    pub async fn scraping(target: SocketAddr) -> Option<Prometheus> {
        let config = format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             scrape_configs:\n- job_name: tessera-node\n  honor_labels: true\n  \
             static_configs: [{{targets: ['{target}']}}]\n"
        );
        Self::spawn(&config, None).await
    }

    /// Prometheus serving the TSDB at `tsdb` (blocks from [`backfill`]), scraping nothing;
    /// blocks are kept whatever their age. Ready when this returns.
    pub async fn on_tsdb(tsdb: &Path) -> Option<Prometheus> {
        Self::spawn("global: {scrape_interval: 1m}\n", Some(tsdb)).await
    }

    /// Prometheus with `config`, on `tsdb` (kept 100 years) or a fresh one in its data
    /// directory; `None` (after `skip::tool_missing`) when it is not installed.
    async fn spawn(config: &str, tsdb: Option<&Path>) -> Option<Prometheus> {
        if Command::new("prometheus")
            .arg("--version")
            .output()
            .is_err()
        {
            super::skip::tool_missing("prometheus", "apt-get install prometheus");
            return None;
        }
        let data = tempfile::tempdir().unwrap();
        let config_path = data.path().join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let port = free_port();
        let mut command = Command::new("prometheus");
        command.arg(format!("--config.file={}", config_path.display()));
        match tsdb {
            Some(tsdb) => command
                .arg(format!("--storage.tsdb.path={}", tsdb.display()))
                .arg("--storage.tsdb.retention.time=100y"),
            None => command.arg(format!(
                "--storage.tsdb.path={}",
                data.path().join("tsdb").display()
            )),
        };
        let child = command
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus starts");
        let p = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _data: data,
        };
        p.wait_ready().await;
        Some(p)
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let addr: SocketAddr = self.url.trim_start_matches("http://").parse().unwrap();
        loop {
            if let Ok(tcp) = tokio::net::TcpStream::connect(addr).await {
                if ready(tcp).await {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "prometheus did not become ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills the server (the address then refuses connections).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn ready(tcp: tokio::net::TcpStream) -> bool {
    let Ok((mut sender, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await
    else {
        return false;
    };
    tokio::spawn(conn);
    let req = hyper::Request::get("/-/ready")
        .header("host", "prometheus")
        .body(Full::new(Bytes::new()))
        .unwrap();
    matches!(sender.send_request(req).await, Ok(r) if r.status() == 200)
}

/// Writes the OpenMetrics text at `openmetrics` into TSDB blocks under `tsdb` with
/// `promtool tsdb create-blocks-from openmetrics`; `false` (after `skip::tool_missing`)
/// when promtool is not installed. Panics with promtool's output when it fails.
pub fn backfill(openmetrics: &Path, tsdb: &Path) -> bool {
    let out = match Command::new("promtool")
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(openmetrics)
        .arg(tsdb)
        .output()
    {
        Ok(out) => out,
        Err(_) => {
            super::skip::tool_missing("promtool", "apt-get install prometheus");
            return false;
        }
    };
    assert!(
        out.status.success(),
        "promtool failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    true
}

/// Evaluates the recording rules in `rules` over `[start, end]` (Unix seconds) against the
/// Prometheus at `url` and writes the results as TSDB blocks under `out`, with `promtool
/// tsdb create-blocks-from rules`; `false` (after `skip::tool_missing`) without promtool.
pub fn backfill_rules(rules: &Path, url: &str, start: i64, end: i64, out: &Path) -> bool {
    let run = Command::new("promtool")
        .args(["tsdb", "create-blocks-from", "rules", "--quiet"])
        .arg(format!("--url={url}"))
        .arg(format!("--start={start}"))
        .arg(format!("--end={end}"))
        .arg(format!("--output-dir={}", out.display()))
        .arg(rules)
        .output();
    let out = match run {
        Ok(out) => out,
        Err(_) => {
            super::skip::tool_missing("promtool", "apt-get install prometheus");
            return false;
        }
    };
    assert!(
        out.status.success(),
        "promtool failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    true
}
