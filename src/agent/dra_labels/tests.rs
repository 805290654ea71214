//! Tests for the agent's slice reading (against a fake apiserver) and label filling.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

use super::*;
use crate::hardware::{Family, Vendor};

const TIMEOUT: Duration = Duration::from_millis(500);

/// A fake apiserver answering every request with `status` and `body`; returns a client and
/// the request lines it saw.
async fn fake_apiserver(
    status: &'static str,
    body: String,
) -> (kube::Client, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut buf = vec![0u8; 8192];
            let n = stream.read(&mut buf).await.unwrap_or(0);
            let request = String::from_utf8_lossy(&buf[..n]).to_string();
            if let Some(line) = request.lines().next() {
                log.lock().expect("log").push(line.to_string());
            }
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        }
    });
    let url = format!("http://{addr}").parse().expect("url");
    let client = crate::kube_client::client_from(kube::Config::new(url), TIMEOUT).expect("client");
    (client, seen)
}

fn slice_list() -> String {
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSliceList",
        "metadata": {"resourceVersion": "7"},
        "items": [{
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "n1-gpu.nvidia.com-abcde"},
            "spec": {
                "driver": "gpu.nvidia.com",
                "nodeName": "n1",
                "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
                "devices": [{
                    "name": "gpu-0",
                    "attributes": {
                        "type": {"string": "gpu"},
                        "uuid": {"string": "GPU-6513270e-269e-0d37-f2a7-4de452e6b438"},
                        "productName": {"string": "NVIDIA H100 80GB HBM3"},
                        "resource.kubernetes.io/pciBusID": {"string": "0000:1b:00.0"}
                    },
                    "capacity": {"memory": {"value": "81559Mi"}}
                }]
            }
        }]
    })
    .to_string()
}

#[tokio::test]
async fn the_own_nodes_slices_are_listed_with_a_field_selector_and_a_limit() {
    let (client, seen) = fake_apiserver("200 OK", slice_list()).await;
    let reader = SliceReader::new(client, "n1", TIMEOUT);
    let devices = reader.published(Cached::Unknown).await;
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].reference.device, "gpu-0");
    let lines = seen.lock().expect("log").clone();
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    assert!(
        line.starts_with("GET /apis/resource.k8s.io/v1/resourceslices?"),
        "{line}"
    );
    assert!(line.contains("fieldSelector=spec.nodeName%3Dn1"), "{line}");
    assert!(line.contains("limit=100"), "{line}");
}

#[tokio::test]
async fn a_current_or_refused_watch_is_used_without_a_request() {
    let (client, seen) = fake_apiserver("500 Internal Server Error", String::new()).await;
    let reader = SliceReader::new(client, "n1", TIMEOUT);
    let list: kube::api::ObjectList<ResourceSlice> =
        serde_json::from_str(&slice_list()).expect("list");
    let slices = list
        .items
        .into_iter()
        .map(|s| (s.metadata.name.clone().unwrap_or_default(), s))
        .collect();
    let devices = reader.published(Cached::Current(slices)).await;
    assert_eq!(devices.len(), 1);
    assert!(reader.published(Cached::Refused(404)).await.is_empty());
    assert_eq!(seen.lock().expect("log").len(), 0, "the API was not asked");
}

#[tokio::test]
async fn forbidden_or_missing_dra_is_skipped_quietly() {
    for (status, code) in [("403 Forbidden", 403), ("404 Not Found", 404)] {
        let body = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": if code == 403 { "Forbidden" } else { "NotFound" }, "code": code,
            "message": "resourceslices.resource.k8s.io is forbidden"
        })
        .to_string();
        let (client, _) = fake_apiserver(status, body).await;
        let reader = SliceReader::new(client, "n1", TIMEOUT);
        assert!(
            reader.published(Cached::Unknown).await.is_empty(),
            "{status}"
        );
    }
}

#[tokio::test]
async fn a_hung_apiserver_costs_at_most_the_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let url = format!("http://{addr}").parse().expect("url");
    let client =
        crate::kube_client::client_from(kube::Config::new(url), TIMEOUT * 10).expect("client");
    let started = std::time::Instant::now();
    let reader = SliceReader::new(client, "n1", TIMEOUT);
    assert!(reader.published(Cached::Unknown).await.is_empty());
    assert!(started.elapsed() < TIMEOUT * 4, "{:?}", started.elapsed());
}

fn published(bus: Option<&str>, uuid: Option<&str>, unusable: Option<&str>) -> PublishedDevice {
    PublishedDevice {
        node: "n1".into(),
        reference: crate::dra::DeviceRef {
            driver: "gpu.nvidia.com".into(),
            pool: "n1".into(),
            device: "gpu-0".into(),
        },
        pci_bus_id: bus.map(str::to_string),
        uuid: uuid.map(str::to_string),
        product: Some("NVIDIA H100 80GB HBM3".into()),
        memory_bytes: Some(81559 << 20),
        numa_node: Some(1),
        memory_unknown: None,
        parent_bus_id: None,
        health: crate::hardware::HealthStatus::Unknown,
        domain: None,
        whole: true,
        vendor: Vendor::Nvidia,
        family: Family::Gpu,
        unusable: unusable.map(str::to_string),
        share: None,
        partition: None,
        notice: None,
    }
}

#[test]
fn labels_are_filled_where_detection_lacks_product_or_memory_and_dra_only_devices_count() {
    // Detection saw the PCI function but no vendor tool: no model, no memory.
    let mut report = Report::empty();
    report.devices.push(Device::new(
        "0000:1b:00.0",
        Vendor::Nvidia,
        Family::Gpu,
        "",
        "pci",
    ));
    let filled = fill_from_published(
        &report,
        &[
            published(Some("0000:1b:00.0"), None, None),
            published(Some("0000:43:00.0"), None, None),
            published(Some("0000:52:00.0"), None, Some("tainted x:NoSchedule")),
        ],
    );
    assert_eq!(
        filled.devices.len(),
        2,
        "matched once, one added, the tainted one not"
    );
    assert_eq!(filled.devices[0].model, "NVIDIA H100 80GB HBM3");
    assert_eq!(filled.devices[0].memory_bytes, Some(81559 << 20));
    assert_eq!(
        filled.devices[0].numa_node,
        Some(1),
        "the driver's NUMA node"
    );
    assert_eq!(filled.devices[1].backend, "dra");
    assert_eq!(filled.devices[1].numa_node, Some(1));
    let labels = crate::labels::labels_for(&filled).labels;
    assert!(
        labels.values().any(|v| v == "nvidia-h100-80gb-hbm3"),
        "{labels:?}"
    );
    // What detection knows is kept.
    let mut known = Report::empty();
    let mut device = Device::new(
        "0000:1b:00.0",
        Vendor::Nvidia,
        Family::Gpu,
        "NVIDIA H100 PCIe",
        "nvidia",
    );
    device.memory_bytes = Some(1);
    known.devices.push(device);
    let filled = fill_from_published(&known, &[published(None, None, None)]);
    assert_eq!(filled.devices[0].model, "NVIDIA H100 PCIe");
    assert_eq!(
        filled.devices.len(),
        2,
        "no bus id and no uuid: not the same device"
    );
}

#[test]
fn a_uuid_matches_when_bus_ids_are_missing() {
    let mut report = Report::empty();
    let mut device = Device::new("nvidia:0", Vendor::Nvidia, Family::Gpu, "", "nvidia");
    device.uuid = Some("GPU-ABC".into());
    report.devices.push(device);
    let filled = fill_from_published(&report, &[published(None, Some("gpu-abc"), None)]);
    assert_eq!(filled.devices.len(), 1);
    assert_eq!(filled.devices[0].model, "NVIDIA H100 80GB HBM3");
}
