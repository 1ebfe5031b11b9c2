//! 100 vGPU pods to one 8-GPU node at once through the scheduler extender, over real
//! HTTP against the API-server double: every pod filtered and bound concurrently (the
//! burst), against the same pods filtered and bound one after another (the baseline),
//! side by side on fresh clusters. A node lock (HAMi's) makes the burst N× a single bind;
//! without one the burst should cost at most what the serial run does (goal: ≤ 2×).
//!
//! Each round checks what the number is worth: every pod bound, its assignment recorded,
//! and no GPU over its memory, cores or slots in the recorded assignments.
//!
//! Run: `cargo bench --bench extender_burst` (`BENCH_ROUNDS=N`, default 10). Under
//! `cargo test --all-targets` it runs one round of 20 pods as a smoke test.

#[path = "../tests/support/apiserver.rs"]
mod apiserver;

use apiserver::ApiServer;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera::controller::extender::records::{
    AssignmentRecord, ASSIGNMENT_ANNOTATION, DEVICES_ANNOTATION, HEARTBEAT_ANNOTATION,
};
use tessera::controller::extender::{keep_books, serve, Books, BooksConfig, Extender};
use tessera::controller::webhook_server::Limits;
use tokio_util::sync::CancellationToken;

const GPUS: usize = 8;
const GPU_MIB: u64 = 81_920;
const SLOTS: u32 = 16;
/// Sizes cycled through; 100 pods use 420 of the node's 640 GiB and 550 of its 800 %
/// of cores, so all fit, but only if the binds do not lose or double-count room.
const SIZES: [(u64, u32); 4] = [(2_048, 5), (4_096, 5), (6_144, 5), (4_992, 7)];

struct Cluster {
    api: ApiServer,
    addr: SocketAddr,
    shutdown: CancellationToken,
}

async fn cluster(pods: usize) -> Cluster {
    let api = ApiServer::empty().await;
    api.list_across_namespaces();
    let devices: Vec<Value> = (0..GPUS)
        .map(|i| {
            json!({"uuid": format!("GPU-{i}"), "model": "NVIDIA A100-SXM4-80GB",
                "memoryMiB": GPU_MIB, "sms": 108, "slots": SLOTS, "numa": 0, "healthy": true})
        })
        .collect();
    api.put_object(
        "/api/v1/nodes",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "big", "annotations": {
            DEVICES_ANNOTATION: Value::Array(devices).to_string(),
            HEARTBEAT_ANNOTATION: k8s_openapi::jiff::Timestamp::now().to_string()}}}),
    );
    for i in 0..pods {
        api.put_object("/api/v1/namespaces/team/pods", pod(i));
    }
    let books = Arc::new(Books::new(BooksConfig::default()));
    let shutdown = CancellationToken::new();
    tokio::spawn(keep_books(api.client(), books.clone(), shutdown.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let addr = listener.local_addr().expect("its address");
    let extender = Arc::new(Extender {
        books: books.clone(),
        client: api.client(),
        limits: Limits::default(),
        metrics: Default::default(),
    });
    tokio::spawn(serve(listener, extender, shutdown.clone()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !books.synced() {
        assert!(Instant::now() < deadline, "the books never synced");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Cluster {
        api,
        addr,
        shutdown,
    }
}

fn pod(i: usize) -> Value {
    let (memory, cores) = SIZES[i % SIZES.len()];
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("p{i:03}"), "namespace": "team", "uid": format!("uid-{i}"),
                     "creationTimestamp": "2026-12-01T00:00:00Z"},
        "spec": {"schedulerName": "tessera-scheduler", "containers": [{"name": "main",
            "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1",
                "nvidia.com/gpumem": memory.to_string(),
                "nvidia.com/gpucores": cores.to_string()}}}]}})
}

async fn post(addr: SocketAddr, path: &str, body: String) -> Value {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("the extender accepts");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .expect("an HTTP/1 handshake");
    tokio::spawn(conn);
    let req = hyper::Request::post(path)
        .header("host", "extender")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("a request");
    let resp = sender.send_request(req).await.expect("an answer");
    let bytes = resp.into_body().collect().await.expect("a body").to_bytes();
    serde_json::from_slice(&bytes).expect("JSON")
}

/// What kube-scheduler does for one pod: filter on the node, then bind to it.
async fn schedule(addr: SocketAddr, i: usize) -> Result<(), String> {
    let p = pod(i);
    let filtered = post(
        addr,
        "/filter",
        json!({"pod": p, "nodenames": ["big"]}).to_string(),
    )
    .await;
    if filtered["nodenames"] != json!(["big"]) {
        return Err(format!("p{i:03} filtered out: {}", filtered["failedNodes"]));
    }
    let bound = post(
        addr,
        "/bind",
        json!({"podName": p["metadata"]["name"], "podNamespace": "team",
               "podUID": p["metadata"]["uid"], "node": "big"})
        .to_string(),
    )
    .await;
    match bound["error"].as_str() {
        Some(e) if !e.is_empty() => Err(format!("p{i:03} not bound: {e}")),
        _ => Ok(()),
    }
}

/// Memory, cores and slots used per GPU according to the pods' recorded assignments;
/// panics when a pod is unbound or unrecorded or a GPU is over capacity.
fn check(api: &ApiServer, pods: usize) {
    let mut used: BTreeMap<String, (u64, u32, u32)> = BTreeMap::new();
    let stored = api.objects("/api/v1/namespaces/team/pods");
    assert_eq!(stored.len(), pods);
    for p in &stored {
        let name = &p["metadata"]["name"];
        assert_eq!(p["spec"]["nodeName"], "big", "{name} is not bound");
        let text = p["metadata"]["annotations"][ASSIGNMENT_ANNOTATION]
            .as_str()
            .unwrap_or_else(|| panic!("{name} bound without its assignment"));
        let record: AssignmentRecord = serde_json::from_str(text).expect("a readable record");
        for container in &record.containers {
            for grant in &container.devices {
                let u = used.entry(grant.uuid.clone()).or_default();
                *u = (u.0 + grant.memory_mib, u.1 + grant.cores, u.2 + 1);
            }
        }
    }
    for (gpu, (memory, cores, slots)) in &used {
        assert!(
            *memory <= GPU_MIB && *cores <= 100 && *slots <= SLOTS,
            "{gpu} overcommitted: {memory} MiB, {cores} % cores, {slots} slots"
        );
    }
}

async fn one_by_one(pods: usize) -> Duration {
    let c = cluster(pods).await;
    let start = Instant::now();
    for i in 0..pods {
        if let Err(e) = schedule(c.addr, i).await {
            panic!("{e}");
        }
    }
    let took = start.elapsed();
    check(&c.api, pods);
    c.shutdown.cancel();
    took
}

async fn burst(pods: usize) -> Duration {
    let c = cluster(pods).await;
    let start = Instant::now();
    let tasks: Vec<_> = (0..pods)
        .map(|i| tokio::spawn(schedule(c.addr, i)))
        .collect();
    for t in tasks {
        if let Err(e) = t.await.expect("the task ran") {
            panic!("{e}");
        }
    }
    let took = start.elapsed();
    check(&c.api, pods);
    c.shutdown.cancel();
    took
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (pods, rounds) = if full {
        let rounds = std::env::var("BENCH_ROUNDS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(10);
        (100, rounds)
    } else {
        (20, 1)
    };
    let (mut serial, mut concurrent, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let s = one_by_one(pods).await;
        let b = burst(pods).await;
        ratios.push(b.as_secs_f64() / s.as_secs_f64());
        serial.push(s);
        concurrent.push(b);
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "{pods} pods to one {GPUS}-GPU node, {rounds} rounds, all bound, none over a GPU: \
         one by one median {:.1} ms, burst median {:.1} ms, burst/serial median {:.2}, worst {:.2}",
        median(serial).as_secs_f64() * 1e3,
        median(concurrent).as_secs_f64() * 1e3,
        ratios[ratios.len() / 2],
        ratios[ratios.len() - 1],
    );
}
