//! The node agent's probes, served beside `/metrics`:
//!
//! - `GET /livez`: 200 while the agent's main loop runs (it beats at least every
//!   [`BEAT_EVERY`]; no beat for [`LIVENESS_STALL`] is 503).
//! - `GET /readyz`: 200 when a good config is in force and every device-plugin server is
//!   registered with the kubelet, or when the node has no GPU (the agent idles there,
//!   advertising nothing); otherwise 503. The body is one line saying why.
//!
//! A node without a GPU answers ready so that a DaemonSet rolling out over mixed nodes is
//! not held up by pods that have nothing to do; its body says `no GPU on this node`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the agent's loop beats.
pub const BEAT_EVERY: Duration = Duration::from_secs(10);
/// `/livez` fails when the loop has not beaten for this long (a MIG reconfiguration holds
/// the loop for seconds, never minutes).
pub const LIVENESS_STALL: Duration = Duration::from_secs(180);

/// What `/readyz` and `/livez` answer; updated by the agent and the device-plugin
/// supervisor.
#[derive(Debug)]
pub struct Probes {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    config: ConfigState,
    /// GPUs on the node (`None` until the first inventory).
    gpus: Option<usize>,
    /// Device-plugin servers registered with the kubelet, of how many (`None`: the
    /// device-plugin path is off or has not started).
    plugins: Option<(usize, usize)>,
    beat: Instant,
}

#[derive(Debug, Clone)]
enum ConfigState {
    Starting,
    Good(String),
    Missing(String),
}

impl Default for Probes {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                config: ConfigState::Starting,
                gpus: None,
                plugins: None,
                beat: Instant::now(),
            }),
        }
    }
}

impl Probes {
    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        // A poisoned lock still holds plain data that is safe to read.
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut state)
    }

    /// A good config is in force.
    pub fn config_applied(&self, name: &str) {
        self.with(|s| s.config = ConfigState::Good(name.to_string()));
    }

    /// No good config is in force, and why (the first one was rejected).
    pub fn config_missing(&self, why: &str) {
        let why = why.lines().next().unwrap_or_default().to_string();
        self.with(|s| s.config = ConfigState::Missing(why));
    }

    /// The number of GPUs the node has.
    pub fn gpus(&self, count: usize) {
        self.with(|s| s.gpus = Some(count));
    }

    /// Device-plugin servers registered with the kubelet, of `total`.
    pub fn plugins(&self, registered: usize, total: usize) {
        self.with(|s| s.plugins = Some((registered, total)));
    }

    /// The device-plugin path stopped (or is off).
    pub fn plugins_stopped(&self) {
        self.with(|s| s.plugins = None);
    }

    /// The agent's loop is alive.
    pub fn beat(&self) {
        self.with(|s| s.beat = Instant::now());
    }

    /// `Ok` (with a one-line description) when alive, else why not.
    pub fn live(&self) -> Result<String, String> {
        let since = self.with(|s| s.beat.elapsed());
        if since > LIVENESS_STALL {
            Err(format!(
                "the agent's loop has not run for {} s",
                since.as_secs()
            ))
        } else {
            Ok("alive".to_string())
        }
    }

    /// `Ok` (with a one-line description) when ready, else why not.
    pub fn ready(&self) -> Result<String, String> {
        self.with(|s| {
            if s.gpus == Some(0) {
                return Ok("ready: no GPU on this node; nothing advertised".to_string());
            }
            let name = match &s.config {
                ConfigState::Starting => return Err("starting: no config applied yet".into()),
                ConfigState::Missing(why) => {
                    return Err(format!("not ready: no good config in force: {why}"))
                }
                ConfigState::Good(name) => name,
            };
            match s.plugins {
                Some((registered, total)) if registered < total => Err(format!(
                    "not ready: {} of {total} device-plugin servers not registered with the kubelet yet",
                    total - registered
                )),
                Some((_, total)) => Ok(format!(
                    "ready: config {name:?} in force; {total} device-plugin servers registered"
                )),
                None => Ok(format!("ready: config {name:?} in force")),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_with_a_good_config_and_registered_servers() {
        let p = Probes::default();
        assert!(p.ready().unwrap_err().contains("starting"));
        p.config_missing("config \"default\": tessera.gpus[0].mode: \"x\" is not one of\nmore");
        let why = p.ready().unwrap_err();
        assert!(
            why.contains("no good config") && why.contains("tessera.gpus[0].mode"),
            "{why}"
        );
        assert!(!why.contains('\n'));
        p.gpus(2);
        p.config_applied("default");
        p.plugins(1, 2);
        assert!(p.ready().unwrap_err().contains("1 of 2"));
        p.plugins(2, 2);
        assert!(p.ready().unwrap().contains("\"default\""));
        // Rejected later: the last good config stays in force, still ready.
        assert!(p.ready().is_ok());
    }

    #[test]
    fn no_gpu_is_ready_and_says_so() {
        let p = Probes::default();
        p.config_missing("whatever");
        p.gpus(0);
        assert!(p.ready().unwrap().contains("no GPU on this node"));
    }

    /// `GET path` on the metrics listener: the status code and the body.
    async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        let status = out[9..12].parse().unwrap();
        let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
        (status, body)
    }

    #[tokio::test]
    async fn served_on_the_metrics_listener() {
        let metrics = std::sync::Arc::new(crate::metrics::NodeMetrics::new());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cancel = tokio_util::sync::CancellationToken::new();
        let server = tokio::spawn(crate::metrics::serve(
            listener,
            metrics.clone(),
            cancel.clone(),
        ));
        assert_eq!(get(addr, "/livez").await, (200, "alive\n".to_string()));
        let (status, body) = get(addr, "/readyz").await;
        assert_eq!(status, 503, "{body}");
        assert!(body.starts_with("starting"), "{body}");
        metrics
            .probes
            .config_missing("config \"default\": version: \"v2\" is not supported");
        let (status, body) = get(addr, "/readyz").await;
        assert_eq!(status, 503);
        assert!(body.contains("version") && body.ends_with('\n') && body.lines().count() == 1);
        metrics.probes.config_applied("default");
        metrics.probes.plugins(1, 1);
        assert_eq!(get(addr, "/readyz").await.0, 200);
        assert_eq!(get(addr, "/metrics").await.0, 200);
        cancel.cancel();
        server.await.unwrap().unwrap();
    }

    #[test]
    fn live_while_the_loop_beats() {
        let p = Probes::default();
        assert!(p.live().is_ok());
        p.with(|s| s.beat = Instant::now() - LIVENESS_STALL - Duration::from_secs(1));
        assert!(p.live().unwrap_err().contains("has not run"));
        p.beat();
        assert!(p.live().is_ok());
    }
}
