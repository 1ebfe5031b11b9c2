//! The webhook's HTTPS shell: TLS (rustls) over a TCP listener, `POST /mutate` decoded
//! and answered by the pure [`super::webhook::review`], `POST /vgpu` by
//! [`super::vgpu_webhook::review`], `GET /healthz`; and the plain
//! HTTP probe server (`GET /livez`, `GET /readyz`, and the controller's `GET /metrics`).
//! The known WorkloadPriorityClasses come from a [`ClassSource`] (the API server in
//! production).
//!
//! The webhook must never be the outage, so every resource a client can hold is bounded
//! ([`Limits`]):
//!
//! ```text
//! accept ─err─► log, back off (5 ms doubling to 1 s), accept again; /livez fails
//!   │            only when accepting has failed for `accept_failure_grace`
//!   ▼
//! a slot free (max_connections)? ─no─► wait up to connection_wait (at most
//!   │                                   max_connections waiters) ─► else dropped
//!   ▼
//! TLS handshake ≤ handshake_timeout
//!   ▼
//! per connection, one watchdog:  waiting for a request's headers ≤ header_timeout
//!                                a request (body read + answer)  ≤ request_timeout
//!                                idle between requests           ≤ idle_timeout
//!   body ≤ max_body (413), and all bodies being read together ≤ max_body_in_flight
//!   (503 beyond), so memory stays bounded whatever the clients do.
//! ```

use super::claim_templates::{NoTemplates, TemplateSink};
use super::error::{Error, Result};
use super::metrics::ControllerMetrics;
use super::tls::CertResolver;
use super::vgpu_webhook::{self, VgpuOptions};
use super::webhook::{self, review, BadReview, Options, Review, Verdict};
use crate::retry::Backoff;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// Largest AdmissionReview accepted (the API server sends at most about 3 MiB objects).
const MAX_BODY: usize = 4 << 20;
/// Largest request head (start line and headers) buffered per connection.
const MAX_HEAD: usize = 64 << 10;

/// The bounds on what clients can hold (see the module documentation).
#[derive(Clone, Debug)]
pub struct Limits {
    /// A TLS handshake not finished by then is dropped.
    pub handshake_timeout: Duration,
    /// From a connection's start or a request's first byte to its complete headers.
    pub header_timeout: Duration,
    /// From a request's headers to its answer (reading the body included).
    pub request_timeout: Duration,
    /// A keep-alive connection with no request for this long is closed.
    pub idle_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
    /// How long a connection over `max_connections` waits for a slot before it is
    /// dropped (and at most `max_connections` wait).
    pub connection_wait: Duration,
    /// Largest request body (413 beyond).
    pub max_body: usize,
    /// Bytes of request bodies being read or decoded at once, all connections together
    /// (503 beyond): held from the body's first byte to the answer.
    pub max_body_in_flight: usize,
    /// Accepting that keeps failing this long fails the liveness probe.
    pub accept_failure_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // The API server calls with timeoutSeconds (5 s in webhook.yaml) and keeps
            // its connections idle up to 90 s.
            handshake_timeout: Duration::from_secs(5),
            header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            max_connections: 128,
            connection_wait: Duration::from_secs(1),
            max_body: MAX_BODY,
            max_body_in_flight: 32 << 20,
            accept_failure_grace: Duration::from_secs(60),
        }
    }
}

/// The known classes (name → value), or `None` when they cannot be listed now.
pub type Classes<'a> = Pin<Box<dyn Future<Output = Option<BTreeMap<String, i32>>> + Send + 'a>>;

/// Where the webhook learns the WorkloadPriorityClasses; `None`: unknown right now.
pub trait ClassSource: Send + Sync + 'static {
    fn classes(&self) -> Classes<'_>;
}

/// Classes listed from the API server on every request.
pub struct ApiClasses(pub kube::Client);

impl ClassSource for ApiClasses {
    fn classes(&self) -> Classes<'_> {
        Box::pin(async move {
            super::snapshot::list_priority_classes(&self.0)
                .await
                .map_err(|e| tracing::warn!(error = %e, "listing WorkloadPriorityClasses"))
                .ok()
                .map(|v| v.into_iter().map(|c| (c.metadata.name, c.value)).collect())
        })
    }
}

/// A fixed set of classes (tests, or a cluster without the CRDs).
pub struct StaticClasses(pub Option<BTreeMap<String, i32>>);

impl ClassSource for StaticClasses {
    fn classes(&self) -> Classes<'_> {
        Box::pin(async move { self.0.clone() })
    }
}

/// Where connections come from: a [`TcpListener`], or a test's source of errors.
pub trait Accept: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept(&mut self) -> impl Future<Output = io::Result<(Self::Io, SocketAddr)>> + Send;
}

impl Accept for TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept(&mut self) -> io::Result<(Self::Io, SocketAddr)> {
        TcpListener::accept(self).await
    }
}

/// What the probes report about the webhook listener, shared between it and the probe
/// server.
#[derive(Debug, Default)]
pub struct Health {
    /// The webhook is not served by this process: both probes only say it is up.
    disabled: bool,
    /// The accept loop is running.
    serving: AtomicBool,
    /// The accept loop has ended (returned, failed or panicked): /livez fails.
    ended: AtomicBool,
    /// Milliseconds since `start` of the first of the current run of accept errors
    /// (0: the last accept succeeded).
    failing_since: AtomicU64,
    accept_errors: AtomicU64,
    connections_dropped: AtomicU64,
    start: Option<Instant>,
    grace: Duration,
    cert: Option<Arc<CertResolver>>,
}

/// What one probe answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub ok: bool,
    pub reason: String,
}

impl Health {
    /// Health of a webhook serving the pair of `cert`; accepting that has failed for
    /// `grace` fails liveness.
    pub fn new(cert: Option<Arc<CertResolver>>, grace: Duration) -> Arc<Health> {
        Arc::new(Health {
            start: Some(Instant::now()),
            grace,
            cert,
            ..Health::default()
        })
    }

    /// Health of a process that does not serve the webhook (`--no-webhook`).
    pub fn disabled() -> Arc<Health> {
        Arc::new(Health {
            disabled: true,
            ..Health::default()
        })
    }

    fn now_ms(&self) -> u64 {
        self.start
            .map_or(0, |s| {
                s.elapsed().as_millis().try_into().unwrap_or(u64::MAX)
            })
            .max(1)
    }

    fn accept_ok(&self) {
        self.failing_since.store(0, Ordering::Relaxed);
    }

    fn accept_failed(&self) {
        self.accept_errors.fetch_add(1, Ordering::Relaxed);
        let now = self.now_ms();
        let _ = self
            .failing_since
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Accept errors seen so far.
    pub fn accept_errors(&self) -> u64 {
        self.accept_errors.load(Ordering::Relaxed)
    }

    /// Connections dropped for want of a slot.
    pub fn connections_dropped(&self) -> u64 {
        self.connections_dropped.load(Ordering::Relaxed)
    }

    /// `/livez`: the listener task is alive and not stuck failing.
    pub fn live(&self) -> Probe {
        let failing = self.failing_since.load(Ordering::Relaxed);
        let failing_for = Duration::from_millis(self.now_ms().saturating_sub(failing));
        let (ok, reason) = if self.disabled {
            (true, "webhook not served by this process")
        } else if self.ended.load(Ordering::Relaxed) {
            (false, "the webhook listener has ended")
        } else if failing != 0 && failing_for >= self.grace {
            (
                false,
                "the webhook listener has failed to accept connections",
            )
        } else {
            (true, "ok")
        };
        Probe {
            ok,
            reason: reason.into(),
        }
    }

    /// `/readyz`: the listener is accepting and a serving certificate is loaded.
    pub fn ready(&self) -> Probe {
        let (ok, reason) = if self.disabled {
            (true, "webhook not served by this process")
        } else if self.ended.load(Ordering::Relaxed) || !self.serving.load(Ordering::Relaxed) {
            (false, "the webhook listener is not running")
        } else if self.failing_since.load(Ordering::Relaxed) != 0 {
            (
                false,
                "the webhook listener is failing to accept connections",
            )
        } else if self.cert.as_ref().is_some_and(|c| !c.is_ready()) {
            (false, "no serving certificate yet")
        } else {
            (true, "ok")
        };
        Probe {
            ok,
            reason: reason.into(),
        }
    }
}

/// Marks the accept loop ended however it ends (return, error, panic, cancellation).
struct Serving(Arc<Health>);

impl Serving {
    fn start(health: Arc<Health>) -> Serving {
        health.serving.store(true, Ordering::Relaxed);
        Serving(health)
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.serving.store(false, Ordering::Relaxed);
        self.0.ended.store(true, Ordering::Relaxed);
    }
}

/// TLS settings from PEM files (`tls.crt` chain and `tls.key`, as cert-manager writes
/// them), loaded once; [`super::tls::ReloadingCert`] also follows rotations.
pub fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>> {
    super::tls::ReloadingCert::load(cert, key)?.server_config()
}

/// Everything the webhook server needs besides its connections.
pub struct Server {
    pub tls: Arc<rustls::ServerConfig>,
    pub classes: Arc<dyn ClassSource>,
    pub options: Options,
    /// What `POST /vgpu` does (the vGPU pod webhook).
    pub vgpu: VgpuOptions,
    /// Where its DRA mode creates ResourceClaimTemplates.
    pub templates: Arc<dyn TemplateSink>,
    pub limits: Limits,
    pub health: Arc<Health>,
}

/// Serves the webhook on `listener` until `shutdown` is cancelled, with the default
/// [`Limits`] and [`Options`].
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    classes: Arc<dyn ClassSource>,
    shutdown: CancellationToken,
) -> Result<()> {
    let limits = Limits::default();
    let health = Health::new(None, limits.accept_failure_grace);
    let server = Server {
        tls,
        classes,
        options: Options::default(),
        vgpu: VgpuOptions::default(),
        templates: Arc::new(NoTemplates),
        limits,
        health,
    };
    run(server, listener, shutdown).await
}

/// The waits after failed accepts: 5 ms, doubling up to 1 s.
pub fn accept_backoff() -> Backoff {
    Backoff::doubling(Duration::from_millis(5), Duration::from_secs(1))
}

/// The next connection of `source`, or `None` once `shutdown` is cancelled. An accept
/// error (EMFILE, ECONNABORTED, …) is logged, reported to `failed`, and retried after
/// `backoff` ([`accept_backoff`]), which starts over after a success.
pub async fn next_connection<A: Accept>(
    source: &mut A,
    backoff: &mut Backoff,
    shutdown: &CancellationToken,
    server: &str,
    mut failed: impl FnMut(),
) -> Option<(A::Io, SocketAddr)> {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return None,
            accepted = source.accept() => accepted,
        };
        match accepted {
            Ok(a) => {
                backoff.reset();
                return Some(a);
            }
            Err(e) => {
                failed();
                let delay = backoff.next_delay();
                tracing::warn!(error = %e, retry_in = ?delay, "{server} accept failed; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// Serves the webhook on the connections of `source` until `shutdown` is cancelled.
/// Accept errors (EMFILE, ECONNABORTED, …) are logged and retried with backoff; they
/// never end the loop.
pub async fn run<A: Accept>(
    server: Server,
    mut source: A,
    shutdown: CancellationToken,
) -> Result<()> {
    let _serving = Serving::start(server.health.clone());
    let shared = Arc::new(Shared {
        acceptor: TlsAcceptor::from(server.tls),
        classes: server.classes,
        options: server.options,
        vgpu: server.vgpu,
        templates: server.templates,
        body_budget: Semaphore::new(kib(server.limits.max_body_in_flight)),
        limits: server.limits,
    });
    let slots = ConnectionSlots::new(&shared.limits);
    let health = server.health;
    let mut backoff = accept_backoff();
    loop {
        let Some((io, peer)) =
            next_connection(&mut source, &mut backoff, &shutdown, "webhook", || {
                health.accept_failed()
            })
            .await
        else {
            return Ok(());
        };
        health.accept_ok();
        let Some(slot) = slots.admit() else {
            health.connections_dropped.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, "webhook: too many connections; dropped");
            continue;
        };
        let (shared, health, shutdown) = (shared.clone(), health.clone(), shutdown.clone());
        tokio::spawn(async move {
            let Some(slot) = slot.await else {
                health.connections_dropped.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%peer, "webhook: no free connection slot; dropped");
                return;
            };
            shared.connection(io, peer, shutdown).await;
            drop(slot);
        });
    }
}

/// The connection cap of a server: `max_connections` served at once; a connection over
/// it waits up to `connection_wait` for a slot (at most `max_connections` wait), so a
/// burst from one client (kube-scheduler binding 100 pods, the API server calling the
/// webhook for a rollout) is queued briefly instead of reset, while a flood stays bounded.
pub struct ConnectionSlots {
    slots: Arc<Semaphore>,
    waiting: Arc<Semaphore>,
    wait: Duration,
}

impl ConnectionSlots {
    pub fn new(limits: &Limits) -> Self {
        ConnectionSlots {
            slots: Arc::new(Semaphore::new(limits.max_connections)),
            waiting: Arc::new(Semaphore::new(limits.max_connections)),
            wait: limits.connection_wait,
        }
    }

    /// `None`: drop the connection now (too many are waiting already). Otherwise a
    /// future, to await off the accept loop, giving the slot to hold while serving, or
    /// `None` when none came free within the wait.
    pub fn admit(
        &self,
    ) -> Option<impl std::future::Future<Output = Option<OwnedSemaphorePermit>> + Send + 'static>
    {
        let now = self.slots.clone().try_acquire_owned().ok();
        let waiter = match now {
            Some(_) => None,
            None => Some(self.waiting.clone().try_acquire_owned().ok()?),
        };
        let (slots, wait) = (self.slots.clone(), self.wait);
        Some(async move {
            if now.is_some() {
                return now;
            }
            let slot = tokio::time::timeout(wait, slots.acquire_owned()).await;
            drop(waiter);
            slot.ok()?.ok()
        })
    }
}

/// A request body of at most `max` bytes, or the answer to give: 413 beyond `max`, 400
/// when it cannot be read.
pub(crate) async fn read_body(
    body: hyper::body::Incoming,
    max: usize,
) -> std::result::Result<Bytes, Response<Full<Bytes>>> {
    match Limited::new(body, max).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("body larger than {max} bytes"),
        )),
        Err(e) => Err(error(StatusCode::BAD_REQUEST, format!("reading body: {e}"))),
    }
}

fn kib(bytes: usize) -> usize {
    bytes.div_ceil(1024).clamp(1, Semaphore::MAX_PERMITS)
}

/// What every connection of one server shares.
struct Shared {
    acceptor: TlsAcceptor,
    classes: Arc<dyn ClassSource>,
    options: Options,
    vgpu: VgpuOptions,
    templates: Arc<dyn TemplateSink>,
    limits: Limits,
    /// Permits in KiB of request bodies being read.
    body_budget: Semaphore,
}

impl Shared {
    async fn connection<I>(self: Arc<Self>, io: I, peer: SocketAddr, shutdown: CancellationToken)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let tls =
            match tokio::time::timeout(self.limits.handshake_timeout, self.acceptor.accept(io))
                .await
            {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
        let shared = self.clone();
        drive(tls, peer, self.limits.clone(), shutdown, move |req| {
            let shared = shared.clone();
            async move { shared.handle(req).await }
        })
        .await;
    }

    async fn handle(&self, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
        match (req.method().as_str(), req.uri().path()) {
            ("GET", "/healthz") => return reply(StatusCode::OK, b"{\"ok\":true}".to_vec()),
            ("POST", "/mutate" | "/vgpu") => {}
            _ => return error(StatusCode::NOT_FOUND, "not found".into()),
        }
        let vgpu_path = req.uri().path() == "/vgpu";
        let max = self.limits.max_body;
        let declared = req
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|n| n > max) {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("body larger than {max} bytes"),
            );
        }
        let want = u32::try_from(kib(declared.unwrap_or(max))).unwrap_or(u32::MAX);
        let Ok(_budget) = self.body_budget.try_acquire_many(want) else {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "too many request bodies being read; retry".into(),
            );
        };
        let body = match read_body(req.into_body(), max).await {
            Ok(b) => b,
            Err(answer) => return answer,
        };
        let parsed: serde_json::Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("body is not JSON: {e}")),
        };
        drop(body);
        let answer = if vgpu_path {
            self.vgpu_review(&parsed).await
        } else {
            let known = self.classes.classes().await;
            review(&parsed, known.as_ref(), self.options)
        };
        match answer.map(|r| webhook::to_json(&r)) {
            Ok(Ok(out)) => reply(StatusCode::OK, out.to_string().into_bytes()),
            Ok(Err(e)) => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("encoding the AdmissionReview: {e}"),
            ),
            Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
        }
    }
}

impl Shared {
    /// `POST /vgpu`: the pure decision, and in DRA mode the templates it refers to
    /// created first (none for a dry run); a template that cannot be made refuses the
    /// pod with the reason, so no pod is admitted referring to a template that is missing.
    async fn vgpu_review(
        &self,
        body: &serde_json::Value,
    ) -> std::result::Result<Review, BadReview> {
        let request = webhook::request(body)?;
        let plan = vgpu_webhook::plan(&request, &self.vgpu);
        let mut verdict = plan.verdict;
        if !plan.dry_run && matches!(verdict, Verdict::Allow(_)) {
            for t in &plan.templates {
                if let Err(reason) = self.templates.ensure(&plan.namespace, t).await {
                    verdict = Verdict::Deny(format!("Pod: {reason}"));
                    break;
                }
            }
        }
        Ok(webhook::respond(&request, verdict))
    }
}

pub(crate) fn reply(code: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = code;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

pub(crate) fn error(code: StatusCode, message: String) -> Response<Full<Bytes>> {
    let body = serde_json::json!({ "error": message });
    reply(code, body.to_string().into_bytes())
}

/// Where a connection is between requests, as its watchdog sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for (the rest of) a request's headers.
    Head,
    /// A request is being read or answered.
    Request,
    /// Between requests, nothing received.
    Idle,
}

/// The phase of one connection and since when.
struct Watch(Mutex<(Phase, Instant)>);

impl Watch {
    fn set(&self, phase: Phase) {
        if let Ok(mut w) = self.0.lock() {
            *w = (phase, Instant::now());
        }
    }

    /// Bytes arrived: an idle connection starts a request.
    fn received(&self) {
        if let Ok(mut w) = self.0.lock() {
            if w.0 == Phase::Idle {
                *w = (Phase::Head, Instant::now());
            }
        }
    }

    /// The phase that overran its limit, if any.
    fn overrun(&self, limits: &Limits) -> Option<Phase> {
        let (phase, since) = *self.0.lock().ok()?;
        let limit = match phase {
            Phase::Head => limits.header_timeout,
            Phase::Request => limits.request_timeout,
            Phase::Idle => limits.idle_timeout,
        };
        (since.elapsed() >= limit).then_some(phase)
    }
}

/// A connection's IO that tells its [`Watch`] when bytes arrive.
struct Watched<I> {
    io: I,
    watch: Arc<Watch>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.watch.received();
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Serves HTTP/1 requests on `io` with `handle` under the watchdog of `limits`.
pub(crate) async fn drive<I, F, Fut>(
    io: I,
    peer: SocketAddr,
    limits: Limits,
    shutdown: CancellationToken,
    handle: F,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn(Request<hyper::body::Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    // A client connects to send a request: the first one is held to the header timeout.
    let watch = Arc::new(Watch(Mutex::new((Phase::Head, Instant::now()))));
    let handle = Arc::new(handle);
    let svc = {
        let watch = watch.clone();
        hyper::service::service_fn(move |req| {
            let (watch, handle) = (watch.clone(), handle.clone());
            async move {
                watch.set(Phase::Request);
                let response = handle(req).await;
                watch.set(Phase::Idle);
                Ok::<_, Infallible>(response)
            }
        })
    };
    let io = Watched {
        io,
        watch: watch.clone(),
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .max_buf_size(MAX_HEAD)
        .serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    let tick = [
        limits.header_timeout,
        limits.request_timeout,
        limits.idle_timeout,
    ]
    .into_iter()
    .min()
    .unwrap_or(Duration::from_secs(1))
        / 4;
    let tick = tick.max(Duration::from_millis(10));
    let mut closing: Option<Instant> = None;
    loop {
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(e) = done {
                    tracing::debug!(%peer, error = %e, "webhook connection");
                }
                return;
            }
            _ = shutdown.cancelled(), if closing.is_none() => {
                conn.as_mut().graceful_shutdown();
                closing = Some(Instant::now());
            }
            _ = tokio::time::sleep(tick) => {
                if closing.is_some_and(|c| c.elapsed() >= limits.request_timeout) {
                    return;
                }
                match watch.overrun(&limits) {
                    None => {}
                    // Nothing in flight: a graceful close ends it at once.
                    Some(Phase::Idle) if closing.is_none() => {
                        conn.as_mut().graceful_shutdown();
                        closing = Some(Instant::now());
                    }
                    Some(Phase::Idle) => {}
                    Some(phase) => {
                        tracing::debug!(%peer, ?phase, "webhook connection timed out; dropped");
                        return;
                    }
                }
            }
        }
    }
}

/// Serves `GET /livez` and `GET /readyz` (plain HTTP) from `health` on `listener`
/// until `shutdown`; accept errors are retried as the webhook's are.
pub async fn serve_probes(
    listener: TcpListener,
    health: Arc<Health>,
    shutdown: CancellationToken,
) -> Result<()> {
    serve_probes_with(listener, health, None, shutdown).await
}

/// [`serve_probes`], and `GET /metrics` (OpenMetrics text) from `metrics` when set.
pub async fn serve_probes_with(
    mut listener: TcpListener,
    health: Arc<Health>,
    metrics: Option<Arc<ControllerMetrics>>,
    shutdown: CancellationToken,
) -> Result<()> {
    let limits = Limits {
        max_connections: 16,
        ..Limits::default()
    };
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut backoff = accept_backoff();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            accepted = Accept::accept(&mut listener) => accepted,
        };
        let (io, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "probe accept failed; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(backoff.next_delay()) => continue,
                }
            }
        };
        backoff.reset();
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let (health, limits, shutdown) = (health.clone(), limits.clone(), shutdown.clone());
        let metrics = metrics.clone();
        tokio::spawn(async move {
            drive(io, peer, limits, shutdown, move |req| {
                let (health, metrics) = (health.clone(), metrics.clone());
                async move { probe(&req, &health, metrics.as_deref()) }
            })
            .await;
            drop(slot);
        });
    }
}

fn probe(
    req: &Request<hyper::body::Incoming>,
    health: &Health,
    metrics: Option<&ControllerMetrics>,
) -> Response<Full<Bytes>> {
    let answer = match (req.method().as_str(), req.uri().path(), metrics) {
        ("GET", "/livez", _) => health.live(),
        ("GET", "/readyz", _) => health.ready(),
        ("GET", "/metrics", Some(m)) => {
            let mut r = Response::new(Full::new(Bytes::from(m.encode())));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            return r;
        }
        _ => return error(StatusCode::NOT_FOUND, "not found".into()),
    };
    let code = if answer.ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut r = Response::new(Full::new(Bytes::from(format!("{}\n", answer.reason))));
    *r.status_mut() = code;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain"),
    );
    r
}

/// Binds `addr` for the probe server (errors name the flag).
pub async fn bind_probes(addr: &str) -> Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|source| Error::Io {
        what: format!("--probe-addr {addr}"),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use tokio::io::DuplexStream;
    use tokio::time::Instant as TokioInstant;

    /// Accepts that fail or succeed as scripted, then wait forever; records when each
    /// accept was called.
    struct Script {
        results: VecDeque<bool>,
        calls: Arc<Mutex<Vec<TokioInstant>>>,
    }

    impl Accept for Script {
        type Io = DuplexStream;
        async fn accept(&mut self) -> io::Result<(Self::Io, SocketAddr)> {
            self.calls.lock().unwrap().push(TokioInstant::now());
            match self.results.pop_front() {
                Some(true) => Ok((tokio::io::duplex(64).0, ([127, 0, 0, 1], 1).into())),
                Some(false) => Err(io::Error::other("too many open files")),
                None => std::future::pending().await,
            }
        }
    }

    fn script(results: &[bool]) -> (Script, Arc<Mutex<Vec<TokioInstant>>>) {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let source = Script {
            results: results.iter().copied().collect(),
            calls: calls.clone(),
        };
        (source, calls)
    }

    #[tokio::test(start_paused = true)]
    async fn failed_accepts_wait_doubling_and_start_over_after_a_connection() {
        let (mut source, calls) = script(&[false, false, false, true, false, true]);
        let mut backoff = accept_backoff();
        let shutdown = CancellationToken::new();
        let mut failed = 0;
        for _ in 0..2 {
            let got =
                next_connection(&mut source, &mut backoff, &shutdown, "test", || failed += 1).await;
            assert!(got.is_some());
        }
        assert_eq!(failed, 4);
        let calls = calls.lock().unwrap();
        let gaps: Vec<u128> = calls
            .windows(2)
            .map(|w| (w[1] - w[0]).as_millis())
            .collect();
        assert_eq!(gaps, [5, 10, 20, 0, 5], "the connection reset the backoff");
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_ends_a_retry_wait_at_once() {
        let (mut source, _calls) = script(&[false; 20]);
        let mut backoff = accept_backoff();
        // Already at the 1 s cap.
        for _ in 0..10 {
            backoff.next_delay();
        }
        let shutdown = CancellationToken::new();
        let cancel = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            cancel.cancel();
        });
        let start = TokioInstant::now();
        let got = next_connection(&mut source, &mut backoff, &shutdown, "test", || {}).await;
        assert!(got.is_none());
        assert_eq!(start.elapsed(), Duration::from_millis(1));
    }
}
