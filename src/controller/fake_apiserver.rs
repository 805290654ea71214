//! An in-process fake apiserver for the controller's fast test tier: a `kube::Client` whose
//! requests are answered by a task over `tower_test::mock`, so a reconcile's writes can be
//! checked in milliseconds. The real-apiserver tier (`tests/cluster_controller.rs`) remains
//! the proof that those writes mean what we think; this tier pins down *which* writes a
//! reconcile makes, in which shape, and what it does when one is refused.
//!
//! The fake keeps objects by path and answers like an apiserver would, closely enough for
//! the controller and the agent: `GET` returns the object; `PATCH` merges an apply or merge
//! patch into it (or applies a JSON patch), bumps its `resourceVersion` and returns the
//! result; a server-side apply to a missing object creates it; `DELETE` removes it; `POST`
//! (Events) echoes the body. Every request is recorded, and a request can be refused with a
//! status code.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// `GET`, `PATCH`, `POST`...
    pub method: String,
    /// The URL path.
    pub path: String,
    /// The URL query (`fieldManager=...&force=true`).
    pub query: String,
    /// The `Content-Type` header.
    pub content_type: String,
    /// The body, as JSON (`Null` when empty or not JSON).
    pub body: Value,
}

/// A request the fake refuses: method, a path suffix, and the status code.
type Refusal = (String, String, StatusCode);

#[derive(Default)]
struct Inner {
    objects: std::collections::BTreeMap<String, Value>,
    /// The last `resourceVersion` handed out; every write takes the next one.
    version: u64,
    recorded: Vec<Recorded>,
    refusals: Vec<Refusal>,
}

/// The fake: seed objects, refuse requests, read what was sent.
#[derive(Clone, Default)]
pub struct FakeApiserver(Arc<Mutex<Inner>>);

impl FakeApiserver {
    /// A client talking to a new fake, and the fake.
    pub fn start() -> (Client, Self) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let fake = Self::default();
        let serving = fake.clone();
        tokio::spawn(async move {
            while let Some((request, send)) = handle.next_request().await {
                send.send_response(serving.answer(request).await);
            }
        });
        (Client::new(service, "default"), fake)
    }

    /// Stores `object` at `path` (its URL without `/status`).
    pub fn insert(&self, path: &str, object: Value) {
        self.lock().objects.insert(path.to_string(), object);
    }

    /// The object stored at `path`.
    pub fn object(&self, path: &str) -> Option<Value> {
        self.lock().objects.get(path).cloned()
    }

    /// Answers `method` requests whose path ends with `suffix` with `code` from now on.
    pub fn refuse(&self, method: &str, suffix: &str, code: StatusCode) {
        let refusal = (method.to_string(), suffix.to_string(), code);
        self.lock().refusals.push(refusal);
    }

    /// Answers everything normally again.
    pub fn stop_refusing(&self) {
        self.lock().refusals.clear();
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.lock().recorded.clone()
    }

    /// The `PATCH` requests so far: the controller's writes.
    pub fn patches(&self) -> Vec<Recorded> {
        let all = self.requests();
        all.into_iter().filter(|r| r.method == "PATCH").collect()
    }

    /// Forgets the requests so far.
    pub fn clear(&self) {
        self.lock().recorded.clear();
    }

    /// Waits (at most 5 s) until `count` Events were posted, for Events published in the
    /// background; returns those posted.
    pub async fn events(&self, count: usize) -> Vec<Recorded> {
        let posted = || -> Vec<Recorded> {
            let all = self.requests();
            all.into_iter()
                .filter(|r| r.method == "POST" && r.path.ends_with("/events"))
                .collect()
        };
        for _ in 0..500 {
            if posted().len() >= count {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        posted()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A test that panicked while holding the lock fails anyway; keep reading.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn answer(&self, request: Request<Body>) -> Response<Body> {
        let (parts, body) = request.into_parts();
        let bytes = body
            .collect()
            .await
            .map(|b| b.to_bytes().to_vec())
            .unwrap_or_default();
        let recorded = Recorded {
            method: parts.method.to_string(),
            path: parts.uri.path().to_string(),
            query: parts.uri.query().unwrap_or_default().to_string(),
            content_type: parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string(),
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        };
        let mut inner = self.lock();
        inner.recorded.push(recorded.clone());
        let refused = inner
            .refusals
            .iter()
            .find(|(method, suffix, _)| {
                *method == recorded.method && recorded.path.ends_with(suffix)
            })
            .map(|(_, _, code)| *code);
        if let Some(code) = refused {
            return failure(code, "refused by the fake apiserver");
        }
        let object_path = recorded.path.trim_end_matches("/status").to_string();
        match recorded.method.as_str() {
            "POST" => reply(StatusCode::CREATED, &recorded.body),
            "GET" => match inner.objects.get(&object_path) {
                Some(object) => reply(StatusCode::OK, object),
                None => failure(StatusCode::NOT_FOUND, "not found"),
            },
            "DELETE" => match inner.objects.remove(&object_path) {
                Some(object) => reply(StatusCode::OK, &object),
                None => failure(StatusCode::NOT_FOUND, "not found"),
            },
            "PATCH" => {
                let is_apply = recorded.content_type.starts_with("application/apply-patch");
                let creates = is_apply
                    && !recorded.path.ends_with("/status")
                    && !inner.objects.contains_key(&object_path);
                if creates {
                    inner.objects.insert(object_path.clone(), json!({}));
                }
                inner.version += 1;
                let version = inner.version.to_string();
                let Some(object) = inner.objects.get_mut(&object_path) else {
                    return failure(StatusCode::NOT_FOUND, "not found");
                };
                if recorded.content_type.starts_with("application/json-patch") {
                    let applied = serde_json::from_value::<json_patch::Patch>(recorded.body)
                        .map_err(|e| e.to_string())
                        .and_then(|patch| {
                            json_patch::patch(object, &patch).map_err(|e| e.to_string())
                        });
                    if let Err(why) = applied {
                        return failure(StatusCode::UNPROCESSABLE_ENTITY, &why);
                    }
                } else {
                    json_patch::merge(object, &recorded.body);
                }
                if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
                    metadata.insert("resourceVersion".into(), Value::String(version));
                }
                reply(StatusCode::OK, object)
            }
            _ => failure(StatusCode::METHOD_NOT_ALLOWED, "not supported by the fake"),
        }
    }
}

fn reply(code: StatusCode, body: &Value) -> Response<Body> {
    let mut response = Response::new(Body::from(body.to_string().into_bytes()));
    *response.status_mut() = code;
    response
}

fn failure(code: StatusCode, message: &str) -> Response<Body> {
    let status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        // The apiserver's reasons are CamelCase (`NotFound`), which `get_opt` looks for.
        "reason": code.canonical_reason().unwrap_or("Unknown").replace(' ', ""),
        "code": code.as_u16(),
    });
    reply(code, &status)
}
