//! The watch task against a scripted HTTP server: what it keeps, when it stops trusting a
//! quiet stream, and that failures and refusals never make it spin.

use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Node;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

use super::*;

/// What the scripted server sends for one request.
struct Reply {
    status: &'static str,
    body: String,
    /// Keep the connection open after the body (a watch that stays quiet).
    hold: bool,
}

type Script = Arc<dyn Fn(&str, usize) -> Reply + Send + Sync>;

/// A server answering request number `n` (from 0) with `script(request_line, n)`; returns a
/// client and the request lines it saw.
async fn scripted(script: Script) -> (kube::Client, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut buf = vec![0u8; 8192];
            let n = stream.read(&mut buf).await.unwrap_or(0);
            let request = String::from_utf8_lossy(&buf[..n]).to_string();
            let line = request.lines().next().unwrap_or_default().to_string();
            let number = {
                let mut log = log.lock().expect("log");
                log.push(line.clone());
                log.len() - 1
            };
            let reply = script(&line, number);
            // No Content-Length: the body runs until the connection closes, as a watch's does.
            let head = format!(
                "HTTP/1.1 {}\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n",
                reply.status
            );
            tokio::spawn(async move {
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(reply.body.as_bytes()).await;
                let _ = stream.flush().await;
                if reply.hold {
                    tokio::time::sleep(Duration::from_secs(600)).await;
                }
            });
        }
    });
    let url = format!("http://{addr}").parse().expect("url");
    let client = crate::kube_client::client_from(kube::Config::new(url), Duration::from_secs(5))
        .expect("client");
    (client, seen)
}

fn timing() -> Timing {
    Timing {
        window: Duration::from_millis(400),
        watch_timeout: Duration::from_secs(600),
        retry: Backoff::new(Duration::from_millis(100), Duration::from_millis(400)),
        refused_retry: Duration::from_secs(30),
        healthy_watch: Duration::from_secs(30),
    }
}

fn node_list(version: &str) -> String {
    serde_json::json!({
        "apiVersion": "v1", "kind": "NodeList",
        "metadata": {"resourceVersion": version},
        "items": [{"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": "n1", "resourceVersion": "5"}}],
    })
    .to_string()
}

fn event(kind: &str, name: &str, version: &str) -> String {
    let object = if kind == "BOOKMARK" {
        serde_json::json!({"apiVersion": "v1", "kind": "Node",
                           "metadata": {"resourceVersion": version}})
    } else {
        serde_json::json!({"apiVersion": "v1", "kind": "Node",
                           "metadata": {"name": name, "resourceVersion": version}})
    };
    format!("{}\n", serde_json::json!({"type": kind, "object": object}))
}

fn watch_of(client: &kube::Client) -> Watched<Node> {
    Watched::start(
        Source::objects(
            "node",
            Api::<Node>::all(client.clone()),
            "metadata.name=n1".into(),
        ),
        timing(),
    )
}

fn versions(cached: Cached<Node>) -> Option<Vec<(String, String)>> {
    match cached {
        Cached::Current(nodes) => Some(
            nodes
                .into_iter()
                .map(|(name, n)| (name, n.metadata.resource_version.unwrap_or_default()))
                .collect(),
        ),
        _ => None,
    }
}

/// Polls `f` every 20 ms for up to 3 s.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..150 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("never: {what}");
}

fn lines(seen: &Arc<Mutex<Vec<String>>>) -> Vec<String> {
    seen.lock().expect("log").clone()
}

#[tokio::test]
async fn the_cache_follows_list_and_events_and_distrusts_a_quiet_stream() {
    let script: Script = Arc::new(|line: &str, n| {
        if !line.contains("watch=true") {
            return Reply {
                status: "200 OK",
                body: node_list("10"),
                hold: false,
            };
        }
        if n == 1 {
            // The first watch: a change and a bookmark, then silence.
            Reply {
                status: "200 OK",
                body: event("MODIFIED", "n1", "11") + &event("BOOKMARK", "", "12"),
                hold: true,
            }
        } else {
            // Every later watch stays silent.
            Reply {
                status: "200 OK",
                body: String::new(),
                hold: true,
            }
        }
    });
    let (client, seen) = scripted(script).await;
    let watched = watch_of(&client);
    eventually("the change is cached", || {
        versions(watched.view()) == Some(vec![("n1".into(), "11".into())])
    })
    .await;
    let stats = watched.stats();
    assert_eq!((stats.lists, stats.events, stats.bookmarks), (1, 1, 1));
    // No event and no bookmark for longer than the window: not trusted any more, and the
    // stream is replaced by a watch from the bookmark's version.
    eventually("the quiet cache is distrusted", || {
        watched.view() == Cached::Unknown
    })
    .await;
    eventually("a new watch from the last version", || {
        lines(&seen)
            .iter()
            .any(|l| l.contains("watch=true") && l.contains("resourceVersion=12"))
    })
    .await;
    let first = lines(&seen);
    assert!(
        first[0].contains("fieldSelector=metadata.name%3Dn1"),
        "{first:?}"
    );
    assert!(!first[0].contains("watch=true"), "{first:?}");
    assert!(first[1].contains("allowWatchBookmarks=true"), "{first:?}");
    let timeout: u64 = first[1]
        .split(['&', ' '])
        .find_map(|p| p.strip_prefix("timeoutSeconds="))
        .and_then(|t| t.parse().ok())
        .expect("a watch timeout");
    assert!((300..=600).contains(&timeout), "{timeout}");
}

#[tokio::test]
async fn a_failing_apiserver_is_retried_with_backoff_never_in_a_loop() {
    let script: Script = Arc::new(|_: &str, _| Reply {
        status: "500 Internal Server Error",
        body:
            r#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":500,"message":"down"}"#
                .into(),
        hold: false,
    });
    let (client, seen) = scripted(script).await;
    let watched = watch_of(&client);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(watched.view(), Cached::Unknown);
    // Waits of 50-100, 100-200, 200-400, then 200-400 ms (equal jitter): with every wait at
    // its floor, tries at 0, 50, 150, 350, 550 ... 1350 ms, so at most 9 in 1.5 s (7 at the
    // average waits; a CI run saw 8). A loop would make hundreds.
    let tries = lines(&seen).len();
    assert!((2..=9).contains(&tries), "{tries} requests");
    assert!(watched.stats().failures >= 2);
}

#[tokio::test]
async fn a_watch_ended_at_once_waits_before_the_next() {
    let script: Script = Arc::new(|line: &str, _| Reply {
        status: "200 OK",
        body: if line.contains("watch=true") {
            String::new()
        } else {
            node_list("10")
        },
        hold: false,
    });
    let (client, seen) = scripted(script).await;
    let started = std::time::Instant::now();
    let _watched = watch_of(&client);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let watches = lines(&seen)
        .iter()
        .filter(|l| l.contains("watch=true"))
        .count();
    // Each wait is at least half its step (50, 100, then 200 ms): the most watches the time
    // that really passed allows (a loaded machine oversleeps the 1.5 s). Without the waits
    // there would be hundreds.
    let elapsed = started.elapsed();
    let (mut most, mut at) = (1, Duration::ZERO);
    for shortest in [50u64, 100].into_iter().chain(std::iter::repeat(200)) {
        at += Duration::from_millis(shortest);
        if at > elapsed {
            break;
        }
        most += 1;
    }
    assert!(
        (2..=most).contains(&watches),
        "{watches} watches in {elapsed:?} (at most {most})"
    );
}

#[tokio::test]
async fn a_gone_version_lists_again_and_a_refusal_is_remembered() {
    let script: Script = Arc::new(|line: &str, n| {
        if line.contains("watch=true") {
            return Reply {
                status: "200 OK",
                body: r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","code":410,"reason":"Expired","message":"too old"}}"#.to_string() + "\n",
                hold: true,
            };
        }
        if n == 0 {
            Reply {
                status: "200 OK",
                body: node_list("10"),
                hold: false,
            }
        } else {
            Reply {
                status: "404 Not Found",
                body: r#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":404,"reason":"NotFound","message":"gone"}"#.into(),
                hold: false,
            }
        }
    });
    let (client, seen) = scripted(script).await;
    let watched = watch_of(&client);
    eventually("the second list's refusal", || {
        watched.view() == Cached::Refused(404)
    })
    .await;
    // The refusal holds until the next list is due (30 s here): no more requests meanwhile.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(watched.view(), Cached::Refused(404));
    let seen = lines(&seen);
    assert_eq!(seen.len(), 3, "list, watch (410), list (404): {seen:?}");
}
