//! The gateway in front of a real worker running the real model: a
//! control plane on a socket, `bulkhead serve` registering its measured
//! pool, and the gateway router (`oneshot`). Answers through every API
//! equal the worker's own, streaming included; an over-long prompt is the
//! right 4xx in each shape; a client that goes away mid-stream cancels, and
//! the worker's pages all come back.

mod support;

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use bulkhead_control_api::{
    Client, ConfigSpec, CreateModel, Credentials, KvBudget, Parallelism, Properties, Role,
    Timestamp, Visibility,
};
use bulkhead_control_plane::{AccountId, AppState as CpState, Db, Settings, app as cp_app, store};
use bulkhead_gateway::{AppState, Limiter, Limits, RoutingWatch, app};
use bulkhead_trust::Role as CertRole;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use support::Worker;
use tower::ServiceExt;

const SLUG: &str = "@cf/huggingfacetb/smollm2-135m-instruct";

struct Fixture {
    gw: Router,
    account: String,
    token: String,
    worker: Worker,
    /// The control plane's URL and a node token, to register more nodes.
    cp: String,
    node_token: String,
    sha256: String,
    /// A responder's token, to flip the model.
    responder: String,
}

async fn fixture() -> Fixture {
    let golden: Value = support::golden();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let path =
        std::env::temp_dir().join(format!("bulkhead-gwtest-{}-{nanos}.db", std::process::id()));
    let db = Db::connect(&Db::sqlite_url(&path)).await.expect("db");
    let settings = Settings {
        page_name: "Bulkhead".to_owned(),
        public_url: "http://status.test".to_owned(),
        node_ttl: Duration::from_secs(60),
        heartbeat_interval: Duration::from_secs(2),
        status_cache: Duration::ZERO,
        gateway_lease: Duration::from_secs(6),
        contexts: support::key_ring().verifying(),
    };
    // The control plane's internal port, with the test CA's identities.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let acceptor = support::identity(CertRole::ControlPlane)
        .acceptor(&[CertRole::Gateway, CertRole::Colocated])
        .expect("acceptor");
    let listener = bulkhead_trust::TlsListener::new(listener, acceptor).expect("listener");
    let url = format!("https://{}", listener.local_addr());
    let router = cp_app(CpState::new(db.clone(), settings));
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<bulkhead_trust::Peer>(),
        )
        .await
    });
    let now = Timestamp::now();
    let mut c = db.pool().acquire().await.expect("connection");
    let gateway_token = store::operators::create(&mut c, "edge", Role::Gateway, now)
        .await
        .expect("op")
        .token;
    let node_token = store::operators::create(&mut c, "fleet", Role::Node, now)
        .await
        .expect("op")
        .token;
    let responder = store::operators::create(&mut c, "rita", Role::Responder, now)
        .await
        .expect("op")
        .token;
    let account = store::accounts::create(&mut c, "alpha", now)
        .await
        .expect("account")
        .id;
    let id = AccountId::parse(&account).expect("id");
    let token = store::api_tokens::create(&mut c, &id, "t", now)
        .await
        .expect("token")
        .token;
    let m = store::models::create(
        &mut c,
        &CreateModel {
            slug: SLUG.parse().expect("slug"),
            task: "Text Generation".to_owned(),
            description: "SmolLM2 135M Instruct".to_owned(),
            visibility: Visibility::Public,
            config: None,
        },
        now,
    )
    .await
    .expect("model");
    let spec = ConfigSpec {
        properties: Properties {
            context_window: 1800,
            max_output: 1024,
        },
        weights_file: "SmolLM2-135M-Instruct.Q4_1.gguf".to_owned(),
        weights_sha256: golden["sha256"].as_str().expect("sha").to_owned(),
        quantization: "q4_1".to_owned(),
        page_size: 16,
        kv_budget: KvBudget {
            prefill_bytes: 64 << 20,
            decode_bytes: 64 << 20,
        },
        parallelism: Parallelism::default(),
        price: Default::default(),
    };
    let v = store::configs::add(&mut c, &m, &spec, "test", now)
        .await
        .expect("config");
    store::configs::activate(&mut c, &m, v, "test", "", now, Duration::from_secs(60))
        .await
        .expect("activate");
    drop(c);
    let node_token_for_test = node_token.clone();
    let worker = tokio::task::spawn_blocking({
        let url = url.clone();
        move || {
            Worker::start(&[
                "serve",
                "--http",
                "127.0.0.1:0",
                "--kv-budget-mib",
                "64",
                "--threads",
                "1",
                "--control-plane",
                &url,
                "--node-token",
                &node_token,
                "--node-name",
                "w0",
                // Not a test of the prefill deadline (control-plane tests
                // cover it): a loaded machine must not make w0 unroutable.
                "--prefill-deadline-secs",
                "3600",
            ])
        }
    })
    .await
    .expect("worker");
    let gateway = support::identity(CertRole::Gateway);
    let client = Client::with_identity(
        &Credentials {
            control_plane_url: url.clone(),
            operator_token: gateway_token,
        },
        &gateway,
    )
    .expect("client");
    let watch = RoutingWatch::start(client, "gw-test".to_owned());
    assert!(watch.ready(Duration::from_secs(10)).await);
    let limiter = Limiter::memory(Limits {
        requests_per_minute: 1000,
        tokens_per_minute: 10_000_000,
        concurrency: 8,
    });
    let upstream =
        bulkhead_gateway::Upstream::new(&gateway, support::key_ring()).expect("upstream");
    let gw = app(AppState::new(watch, None, limiter, upstream));
    let f = Fixture {
        gw,
        account,
        token,
        worker,
        cp: url,
        node_token: node_token_for_test,
        sha256: spec.weights_sha256.clone(),
        responder,
    };
    // The worker registered before announcing; wait until the table routes to it.
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, _) = f.complete("a", false).await;
        if status != 503 || Instant::now() > until {
            assert_eq!(status, 200, "the worker is routable");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    f
}

impl Fixture {
    fn request(&self, method: &str, path: &str, body: &Value) -> Request<Body> {
        Request::builder()
            .method(method)
            .uri(path)
            .header("authorization", format!("Bearer {}", self.token))
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .expect("request")
    }

    /// A three-token completion of `prompt`, streamed or not.
    async fn complete(&self, prompt: &str, stream: bool) -> (u16, String) {
        let body = json!({"model": SLUG, "prompt": prompt, "max_tokens": 3, "stream": stream});
        self.call("POST", "/v1/completions", body).await
    }

    /// A streamed chat answer of up to `max_tokens`, once it is a 200.
    async fn long_story(&self, max_tokens: u32) -> Body {
        let body = json!({"model": SLUG, "messages": [{"role": "user", "content": "Tell me a long story."}],
                          "max_tokens": max_tokens, "stream": true, "temperature": 0});
        let req = self.request("POST", "/v1/chat/completions", &body);
        let resp = self.gw.clone().oneshot(req).await.expect("router");
        assert_eq!(resp.status(), 200);
        resp.into_body()
    }

    async fn call(&self, method: &str, path: &str, body: Value) -> (u16, String) {
        let resp = self
            .gw
            .clone()
            .oneshot(self.request(method, path, &body))
            .await
            .expect("router");
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    fn run_path(&self) -> String {
        format!(
            "/client/v4/accounts/{}/ai/run/{}",
            self.account,
            SLUG.replace('/', "%2F")
        )
    }

    /// Registers a colocated node of this model at `address` (with an
    /// unscoped worker certificate) that reports its whole vast pool free:
    /// the picker's first choice. Returns once it is routable.
    async fn register_favoured(&self, name: &str, address: String) {
        let nodes = self.client(&self.node_token, CertRole::Colocated);
        let node = bulkhead_control_api::RegisterNode {
            name: name.to_owned(),
            role: bulkhead_control_api::NodeRole::Colocated,
            model: SLUG.parse().expect("slug"),
            address,
            transfer_address: None,
            kv_pool_tokens: 1 << 20,
            weights_sha256: self.sha256.clone(),
            quantization: "q4_1".to_owned(),
            page_size: 16,
            kv_budget_bytes: 64 << 20,
            parallelism: Parallelism::default(),
            prefill: Some(bulkhead_control_api::PrefillFigures {
                ns_per_token: 1,
                ns_per_pair: 1,
                deadline_ms: 60_000,
            }),
        };
        let status: bulkhead_control_api::NodeStatus = nodes
            .post("/admin/v1/nodes", &node)
            .await
            .expect("register");
        assert!(status.node.routable, "{:?}", status.node.unroutable_reason);
        let beat = bulkhead_control_api::Heartbeat {
            load: Some(bulkhead_control_api::NodeLoad {
                free_pages: 1 << 16,
                total_pages: 1 << 16,
                queue_depth: 0,
            }),
        };
        let _: bulkhead_control_api::NodeStatus = nodes
            .post(
                &format!("/admin/v1/nodes/{}/heartbeat", status.node.id),
                &beat,
            )
            .await
            .expect("heartbeat");
    }

    /// A control-plane client with `token`, presenting a `role` certificate.
    fn client(&self, token: &str, role: CertRole) -> Client {
        let creds = Credentials {
            control_plane_url: self.cp.clone(),
            operator_token: token.to_owned(),
        };
        Client::with_identity(&creds, &support::identity(role)).expect("client")
    }

    fn worker_addr(&self) -> String {
        self.worker.addr("http")
    }

    /// Flips the model as the responder; returns when the control plane
    /// acknowledges.
    async fn flip(&self, visibility: Visibility, end_streams: bool) {
        let client = self.client(&self.responder, CertRole::Gateway);
        let body = bulkhead_control_api::SetVisibility {
            visibility,
            reason: "stream cut test".to_owned(),
            end_streams,
        };
        let path = format!("/admin/v1/models/{}/visibility", SLUG.replace('/', "%2F"));
        let change: Value = client.post(&path, &body).await.expect("flip");
        assert!(
            change["propagation"]["applied"].as_u64() >= Some(1),
            "{change}"
        );
    }
}

/// The `data:` payloads of an SSE body.
fn events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

fn worker_text(addr: &str, body: &Value) -> String {
    let r = support::http(addr, "POST", "/v1/generate", Some(1), &body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    r.lines()
        .iter()
        .filter_map(|l| l["text"].as_str())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_through_every_api_equal_the_workers_own() {
    let f = fixture().await;
    let addr = f.worker_addr();
    let question = "What is the capital of France?";
    let direct = {
        let addr = addr.clone();
        tokio::task::spawn_blocking(move || {
            worker_text(&addr, &json!({"prompt": question, "max_tokens": 24}))
        })
        .await
        .expect("direct")
    };
    assert!(!direct.is_empty());

    // Workers AI, greedy, not streamed.
    let body = json!({"prompt": question, "max_tokens": 24, "temperature": 0});
    let (status, text) = f.call("POST", &f.run_path(), body.clone()).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(
        (v["success"].as_bool(), &v["errors"], &v["messages"]),
        (Some(true), &json!([]), &json!([]))
    );
    assert_eq!(v["result"]["response"], direct.as_str());
    let usage = &v["result"]["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(
            usage["prompt_tokens"].as_u64().unwrap_or(0)
                + usage["completion_tokens"].as_u64().unwrap_or(0)
        )
    );

    // Workers AI, streamed: the same text, a usage event, then [DONE]. Raw slashes in the path this time.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let raw_path = format!("/client/v4/accounts/{}/ai/run/{SLUG}", f.account);
    let (status, sse) = f.call("POST", &raw_path, streamed).await;
    assert_eq!(status, 200);
    let ev = events(&sse);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"), "{sse}");
    let parsed: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("event JSON"))
        .collect();
    let joined: String = parsed
        .iter()
        .filter_map(|e| e["response"].as_str())
        .collect();
    assert_eq!(joined, direct);
    assert_eq!(parsed.last().map(|e| &e["usage"]), Some(usage));

    // OpenAI chat, not streamed and streamed with usage.
    let chat = json!({"model": SLUG, "messages": [{"role": "user", "content": question}], "max_tokens": 24, "temperature": 0});
    let (status, text) = f.call("POST", "/v1/chat/completions", chat.clone()).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().is_some_and(|i| i.starts_with("chatcmpl-")));
    assert_eq!(v["model"], SLUG);
    assert_eq!(
        v["choices"][0]["message"],
        json!({"role": "assistant", "content": direct, "refusal": null})
    );
    assert!(["stop", "length"].contains(&v["choices"][0]["finish_reason"].as_str().unwrap_or("")));
    assert_eq!(&v["usage"], usage);
    // Not asked for, usage still rides on the last event.
    let mut s = chat.clone();
    s["stream"] = json!(true);
    let (status, sse) = f.call("POST", "/v1/chat/completions", s.clone()).await;
    assert_eq!(status, 200);
    let ev = events(&sse);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
    let end: Value = serde_json::from_str(&ev[ev.len() - 2]).expect("chunk");
    assert!(end["choices"][0]["finish_reason"].is_string(), "{end}");
    assert_eq!(&end["usage"], usage);
    s["stream_options"] = json!({"include_usage": true});
    let (status, sse) = f
        .call(
            "POST",
            &format!("/client/v4/accounts/{}/ai/v1/chat/completions", f.account),
            s,
        )
        .await;
    assert_eq!(status, 200);
    let ev = events(&sse);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("chunk"))
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, direct);
    let last = chunks.last().expect("usage chunk");
    assert_eq!((&last["choices"], &last["usage"]), (&json!([]), usage));
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["delta"], json!({}));
    assert!(finish["choices"][0]["finish_reason"].is_string());
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );

    // Completions take raw text.
    let (status, text) = f
        .call(
            "POST",
            "/v1/completions",
            json!({"model": SLUG, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    let raw = {
        let addr = addr.clone();
        tokio::task::spawn_blocking(move || {
            worker_text(
                &addr,
                &json!({"raw": "The capital of France is", "max_tokens": 8}),
            )
        })
        .await
        .expect("raw")
    };
    assert_eq!(v["choices"][0]["text"], raw.as_str());
    // Streamed without asking for usage: it rides on the finish chunk.
    let (status, sse) = f
        .call(
            "POST",
            "/v1/completions",
            json!({"model": SLUG, "prompt": "The capital of France is", "max_tokens": 8,
                   "temperature": 0, "stream": true}),
        )
        .await;
    assert_eq!(status, 200);
    let ev = events(&sse);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"), "{sse}");
    let end: Value = serde_json::from_str(&ev[ev.len() - 2]).expect("chunk");
    assert!(end["choices"][0]["finish_reason"].is_string(), "{end}");
    assert_eq!(end["usage"], v["usage"], "{end}");

    // A prompt longer than the worker's pool: the right 4xx in each shape, nothing allocated.
    let long = "word ".repeat(4000);
    let (status, text) = f
        .call(
            "POST",
            &f.run_path(),
            json!({"prompt": long, "max_tokens": 8}),
        )
        .await;
    assert_eq!(status, 413, "{text}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(v["errors"][0]["code"], 5021);
    assert_eq!(v["success"], false);
    // Workers AI's wording on its route...
    assert_eq!(
        v["errors"][0]["message"],
        "AiError: The estimated number of input and maximum output tokens exceeded this model's context window limit."
    );
    let (status, text) = f
        .call("POST", "/v1/chat/completions", json!({"model": SLUG, "messages": [{"role": "user", "content": long}], "max_tokens": 8}))
        .await;
    assert_eq!(status, 400, "{text}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert_eq!(v["error"]["param"], "messages");
    // ...and OpenAI's on OpenAI's, which client libraries match (LiteLLM's
    // context-window fallbacks look for "maximum context length"), with
    // the real counts.
    let message = v["error"]["message"].as_str().unwrap_or_default();
    let numbers: Vec<usize> = message
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    assert!(
        message.starts_with("This model's maximum context length is ")
            && message.contains(" in the messages, 8 in the completion). Please reduce the length of the messages or completion."),
        "{message}"
    );
    let [limit, requested, prompt, completion] = numbers[..] else {
        panic!("four numbers: {message}")
    };
    assert_eq!(completion, 8);
    assert_eq!(requested, prompt + completion, "{message}");
    assert!(prompt > 4000 && requested > limit, "{message}");
    let stats =
        tokio::task::spawn_blocking(move || support::wait_stats(&addr, support::at_baseline))
            .await
            .expect("stats");
    assert!(support::at_baseline(&stats), "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_ai_structured_output_answers_with_the_parsed_object() {
    let f = fixture().await;
    let schema = json!({"type": "object", "additionalProperties": false, "required": ["name", "age"],
        "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"}}});
    let body = json!({"prompt": "Describe a cat as JSON with its name and age.", "max_tokens": 64,
        "temperature": 0, "response_format": {"type": "json_schema", "json_schema": schema}});
    let (status, text) = f.call("POST", &f.run_path(), body).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    let cat = &v["result"]["response"];
    assert!(
        cat["name"].is_string() && cat["age"].is_i64(),
        "an object, not its text: {v}"
    );
    assert_eq!(cat.as_object().map(|o| o.len()), Some(2), "{v}");
    // Without a response format the same answer is text.
    let body = json!({"prompt": "Describe a cat as JSON with its name and age.", "max_tokens": 8});
    let (status, text) = f.call("POST", &f.run_path(), body).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert!(v["result"]["response"].is_string(), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_stream_cancels_and_every_page_returns() {
    let f = fixture().await;
    let addr = f.worker_addr();
    let mut body = f.long_story(1024).await;
    let mut seen = 0;
    while seen < 3 {
        match body.frame().await {
            Some(Ok(frame)) if frame.data_ref().is_some() => seen += 1,
            Some(Ok(_)) => {}
            other => panic!("stream ended early: {other:?}"),
        }
    }
    let during = {
        let addr = addr.clone();
        tokio::task::spawn_blocking(move || support::stats(&addr))
            .await
            .expect("stats")
    };
    assert!(
        during["pool"]["allocated_pages"].as_u64() > Some(0),
        "{during}"
    );
    let dropped = Instant::now();
    drop(body); // the client goes away
    let after =
        tokio::task::spawn_blocking(move || support::wait_stats(&addr, support::at_baseline))
            .await
            .expect("stats");
    assert!(support::at_baseline(&after), "{after}");
    // Cancelled, not run out: 1024 tokens take far longer than this.
    assert!(
        dropped.elapsed() < Duration::from_secs(3),
        "pages came back only after {:?}",
        dropped.elapsed()
    );
    // The request was cancelled, not run to its end.
    let (status, _) = f.call("GET", "/v1/models", Value::Null).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_cannot_be_reached_is_skipped_before_the_first_byte() {
    let f = fixture().await;
    // A registered, heartbeating node that hangs up on every connection,
    // reporting far more free pages than the real worker: the picker's
    // first choice until the gateway shuns it.
    let hangups = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let dead = listener.local_addr().expect("addr").to_string();
    let counted = std::sync::Arc::clone(&hangups);
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            drop(sock);
        }
    });
    // The whole registered pool (2^20 tokens in 16-token pages), free: far
    // more than the real worker has.
    f.register_favoured("ghost", dead).await;
    // Wait until this gateway's table routes to it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for stream in [false, true, false, true] {
        let (status, body) = f.complete("Hello", stream).await;
        assert_eq!(status, 200, "{body}");
        if stream {
            assert!(body.contains("[DONE]"), "{body}");
        }
    }
    assert!(
        hangups.load(std::sync::atomic::Ordering::Relaxed) >= 1,
        "the dead worker was tried first (and each request sent on)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_certificate_is_for_another_model_never_gets_a_request() {
    let f = fixture().await;
    // A worker of another model (its certificate is scoped to it) whose
    // address was registered for this model, with a vast free pool: the
    // picker's first choice. The gateway must refuse it in the handshake,
    // before a byte of any prompt reaches it.
    let other = "@cf/other/model";
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handshakes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let impostor = listener.local_addr().expect("addr").to_string();
    let acceptor = support::scoped_identity(CertRole::Colocated, other, None)
        .acceptor(&[CertRole::Gateway])
        .expect("acceptor");
    let (a, h) = (
        std::sync::Arc::clone(&accepted),
        std::sync::Arc::clone(&handshakes),
    );
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            a.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if acceptor.accept(sock).await.is_ok() {
                // Reached: whatever it reads would be a tenant's request.
                h.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    });
    // Registered with an unscoped worker certificate (which may register any
    // model): the control plane cannot tell; the gateway still can.
    f.register_favoured("impostor", impostor).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    for stream in [false, true] {
        let (status, body) = f.complete("my secret prompt", stream).await;
        assert_eq!(status, 200, "the real worker answers: {body}");
    }
    assert!(
        accepted.load(std::sync::atomic::Ordering::Relaxed) >= 1,
        "the impostor was tried first"
    );
    assert_eq!(
        handshakes.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "a handshake with a worker of another model completed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_flip_ends_streams_in_flight_before_it_is_acknowledged_unless_planned() {
    let f = fixture().await;
    for planned in [false, true] {
        let mut body = f.long_story(200).await;
        let mut text = String::new();
        while events(&text).len() < 3 {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Some(d) = frame.data_ref() {
                        text.push_str(&String::from_utf8_lossy(d));
                    }
                }
                other => panic!("stream ended early: {other:?}"),
            }
        }
        f.flip(Visibility::Private, !planned).await;
        // Acknowledged: an unplanned flip has already ended the stream, so
        // what is left is buffered and arrives at once.
        let rest = async {
            let mut rest = String::new();
            while let Some(frame) = body.frame().await {
                if let Some(d) = frame.expect("frame").data_ref() {
                    rest.push_str(&String::from_utf8_lossy(d));
                }
            }
            rest
        };
        let rest = if planned {
            rest.await
        } else {
            tokio::time::timeout(Duration::from_secs(2), rest)
                .await
                .expect("the stream had ended when the flip was acknowledged")
        };
        text.push_str(&rest);
        let evs = events(&text);
        let last = evs.last().expect("events");
        if planned {
            assert_eq!(
                last, "[DONE]",
                "a planned flip lets the stream finish: {text}"
            );
            assert!(!text.contains("model_withdrawn"), "{text}");
        } else {
            let v: Value = serde_json::from_str(last).expect("the last event is an error");
            assert_eq!(v["error"]["code"], "model_withdrawn", "{v}");
            assert!(!text.contains("[DONE]"), "{text}");
        }
        // Private now: new requests see no such model.
        let (status, _) = f.complete("a", false).await;
        assert_eq!(status, 404);
        f.flip(Visibility::Public, true).await;
    }
    let addr = f.worker_addr();
    let after =
        tokio::task::spawn_blocking(move || support::wait_stats(&addr, support::at_baseline))
            .await
            .expect("stats");
    assert!(support::at_baseline(&after), "{after}");
}
