//! A small API-server double over real HTTP/1.1 on loopback: one Node (GET and WATCH with
//! a field selector, resourceVersion bumped on every change) and `events.k8s.io/v1`
//! Event creation. Models: 404 for unknown objects, watch streams that send the current
//! object's changes as newline-delimited `WatchEvent`s, and 201 Created echoing the Event.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::broadcast;

#[derive(Default)]
struct State {
    node_name: String,
    labels: BTreeMap<String, String>,
    resource_version: u64,
    events: Vec<Value>,
}

/// Handle to the running double.
#[derive(Clone)]
pub struct ApiServer {
    pub url: String,
    state: Arc<Mutex<State>>,
    changes: broadcast::Sender<Value>,
}

impl ApiServer {
    pub async fn start(node_name: &str) -> ApiServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (changes, _) = broadcast::channel(16);
        let server = ApiServer {
            url,
            state: Arc::new(Mutex::new(State {
                node_name: node_name.into(),
                resource_version: 1,
                ..Default::default()
            })),
            changes,
        };
        let s = server.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    break;
                };
                let s = s.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let s = s.clone();
                        async move { Ok::<_, Infallible>(s.handle(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        server
    }

    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url.parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }

    /// Set (or with None remove) a label on the node; watchers see a MODIFIED event.
    pub fn set_label(&self, key: &str, value: Option<&str>) {
        let node = {
            let mut st = self.state.lock().unwrap();
            match value {
                Some(v) => st.labels.insert(key.into(), v.into()),
                None => st.labels.remove(key),
            };
            st.resource_version += 1;
            node_json(&st)
        };
        let _ = self
            .changes
            .send(json!({"type": "MODIFIED", "object": node}));
    }

    pub fn events(&self) -> Vec<Value> {
        self.state.lock().unwrap().events.clone()
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<BoxBody<Bytes, Infallible>> {
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or("").to_string();
        let node_name = self.state.lock().unwrap().node_name.clone();
        match (req.method().as_str(), path.as_str()) {
            ("GET", p) if p == format!("/api/v1/nodes/{node_name}") => {
                let node = node_json(&self.state.lock().unwrap());
                json_response(StatusCode::OK, node)
            }
            ("GET", "/api/v1/nodes") if query.contains("watch=true") => {
                if !query.contains(&format!("metadata.name%3D{node_name}"))
                    && !query.contains(&format!("metadata.name={node_name}"))
                {
                    return json_response(StatusCode::BAD_REQUEST, status("field selector"));
                }
                let rx = self.changes.subscribe();
                let stream = futures::stream::unfold(rx, |mut rx| async move {
                    match rx.recv().await {
                        Ok(v) => {
                            let mut line = serde_json::to_vec(&v).unwrap();
                            line.push(b'\n');
                            Some((Ok::<_, Infallible>(Frame::data(Bytes::from(line))), rx))
                        }
                        Err(_) => None,
                    }
                });
                Response::builder()
                    .status(StatusCode::OK)
                    .header("content-type", "application/json")
                    .body(BodyExt::boxed(StreamBody::new(stream)))
                    .unwrap()
            }
            ("POST", "/apis/events.k8s.io/v1/namespaces/default/events") => {
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let mut event: Value = serde_json::from_slice(&body).unwrap();
                event["metadata"]["name"] = json!("generated-1");
                self.state.lock().unwrap().events.push(event.clone());
                json_response(StatusCode::CREATED, event)
            }
            _ => json_response(StatusCode::NOT_FOUND, status("not found")),
        }
    }
}

fn node_json(st: &State) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": st.node_name,
            "uid": "1f5c-node",
            "resourceVersion": st.resource_version.to_string(),
            "labels": st.labels,
        }
    })
}

fn status(message: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": message, "code": 404})
}

fn json_response(code: StatusCode, v: Value) -> Response<BoxBody<Bytes, Infallible>> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(BodyExt::boxed(Full::new(Bytes::from(
            serde_json::to_vec(&v).unwrap(),
        ))))
        .unwrap()
}
