mod support;
use std::time::{Duration, Instant};
use support::apiserver::ApiServer;
use support::dra_agent::{spawn_binary, NodeDirs, NODE};
use support::dra_kubelet::DraKubelet;
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scratch() {
    let api = ApiServer::start(NODE).await;
    let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
    let dirs = NodeDirs::under(tmp.path());
    let kubelet = DraKubelet::start(&dirs.kubelet_dir, NODE, api.client()).await;
    let bin = "/work/wt-drasvc/target/release/tessera";
    let mut child = spawn_binary(bin, &dirs, &api, "18xA100-80GB", "b");
    kubelet
        .wait_registered("gpu.tessera.io", 1, Duration::from_secs(10))
        .await;
    let sock = dirs.kubelet_dir.join("plugins/gpu.tessera.io/dra.sock");
    for _ in 0..3 {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        child.wait().unwrap();
        let t = Instant::now();
        child = spawn_binary(bin, &dirs, &api, "18xA100-80GB", "b");
        let mut attempts = 0;
        let mut first_connect = None;
        loop {
            attempts += 1;
            let c = tokio::net::UnixStream::connect(&sock).await;
            if c.is_ok() && first_connect.is_none() {
                first_connect = Some(t.elapsed());
            }
            if c.is_ok() {
                let t2 = Instant::now();
                let ch = tessera::grpc::connect_unix_with_authority(
                    &sock,
                    &sock.display().to_string(),
                    Duration::from_millis(100),
                )
                .await;
                let dial = t2.elapsed();
                if let Ok(ch) = ch {
                    let mut cl =
                        tessera::proto::dra::v1::dra_plugin_client::DraPluginClient::new(ch);
                    let t3 = Instant::now();
                    let r = cl
                        .node_prepare_resources(
                            tessera::proto::dra::v1::NodePrepareResourcesRequest { claims: vec![] },
                        )
                        .await;
                    eprintln!(
                        "attempt {attempts} connect@{:?} dial {:?} rpc {:?} ok={} total {:?}",
                        first_connect,
                        dial,
                        t3.elapsed(),
                        r.is_ok(),
                        t.elapsed()
                    );
                    if r.is_ok() {
                        break;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    child.kill().unwrap();
}
