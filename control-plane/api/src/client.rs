//! A small client for the admin API, used by the responder commands, the
//! workers and the gateway. Operators' tools call the admin port over plain
//! HTTP/1.1 with a token (put a TLS-terminating proxy in front to expose
//! it); workers and gateways call the internal port, `https://`, with their
//! certificate as well as their token ([`Client::with_identity`]).

use crate::ErrorBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the control plane is and the operator token to call it with.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
pub struct Credentials {
    /// Base URL, e.g. `http://127.0.0.1:8788`.
    pub control_plane_url: String,
    /// Bearer token.
    pub operator_token: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("control_plane_url", &self.control_plane_url)
            .field("operator_token", &"<redacted>")
            .finish()
    }
}

/// Why credentials could not be found.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// Neither the environment nor the data directory has them.
    #[error(
        "no control plane credentials: set BULKHEAD_CONTROL_PLANE_URL and BULKHEAD_TOKEN, \
         or run `bulkhead up` so that {0} exists (or point --data-dir at its directory)"
    )]
    Missing(PathBuf),
    /// Only one of the two variables is set.
    #[error("set both BULKHEAD_CONTROL_PLANE_URL and BULKHEAD_TOKEN, not only {0}")]
    Half(&'static str),
    /// The file is there but unreadable.
    #[error("reading {path}: {message}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
}

impl Credentials {
    /// Credentials from the environment values when both are given, else
    /// from `credentials.json` in `data_dir`.
    pub fn resolve(
        env_url: Option<String>,
        env_token: Option<String>,
        data_dir: &Path,
    ) -> Result<Credentials, CredentialsError> {
        match (env_url, env_token) {
            (Some(control_plane_url), Some(operator_token)) => Ok(Credentials {
                control_plane_url,
                operator_token,
            }),
            (Some(_), None) => Err(CredentialsError::Half("BULKHEAD_CONTROL_PLANE_URL")),
            (None, Some(_)) => Err(CredentialsError::Half("BULKHEAD_TOKEN")),
            (None, None) => {
                let path = data_dir.join("credentials.json");
                let text = match std::fs::read_to_string(&path) {
                    Ok(t) => t,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        return Err(CredentialsError::Missing(path));
                    }
                    Err(e) => {
                        return Err(CredentialsError::Unreadable {
                            path,
                            message: e.to_string(),
                        });
                    }
                };
                serde_json::from_str(&text).map_err(|e| CredentialsError::Unreadable {
                    path,
                    message: e.to_string(),
                })
            }
        }
    }
}

/// Why an admin API call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The base URL is not `http://host:port[/prefix]`.
    #[error("`{0}` is not an http:// URL of the control plane")]
    BadUrl(String),
    /// A worker or gateway was given a URL that is not the internal port's.
    #[error(
        "`{0}` is not the control plane's internal port: workers and gateways call it at \
         https://HOST:PORT (its --internal-listen), with their certificate"
    )]
    NotInternal(String),
    /// No answer.
    #[error("cannot reach the control plane at {url}: {message}")]
    Unreachable {
        /// Base URL.
        url: String,
        /// What failed.
        message: String,
    },
    /// The control plane answered with an error.
    #[error("control plane refused ({status}): {message}")]
    Api {
        /// HTTP status.
        status: u16,
        /// Its error code.
        code: String,
        /// Its message.
        message: String,
    },
    /// The URL answered as a gateway (the tenant API) answers.
    #[error(
        "{0} answered like a Bulkhead gateway (the tenant API), not the control plane: \
         responder commands need the control plane's URL (`control_plane_url` in credentials.json)"
    )]
    NotControlPlane(String),
    /// The answer was not what the API promises.
    #[error("unexpected answer from the control plane: {0}")]
    Decode(String),
}

/// An admin API client bound to one control plane and token.
#[derive(Clone)]
pub struct Client {
    base: String,
    token: String,
    http: Transport,
    timeout: Duration,
}

/// Plain HTTP (operators) or mutual TLS (workers, gateways).
#[derive(Clone)]
enum Transport {
    Plain(HyperClient<HttpConnector, Full<Bytes>>),
    Tls(HyperClient<bulkhead_trust::connect::Connector, Full<Bytes>>),
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

/// What an admin call gives: the answer's JSON as `T`, or why not.
pub type Answer<T> = Result<T, ClientError>;

impl Client {
    /// A client for these credentials; calls time out after 30 s.
    pub fn new(credentials: &Credentials) -> Result<Client, ClientError> {
        let base = base_url(credentials, "http")
            .ok_or_else(|| ClientError::BadUrl(credentials.control_plane_url.clone()))?;
        let http = Transport::Plain(HyperClient::builder(TokioExecutor::new()).build_http());
        Ok(Client::over(base, credentials, http))
    }

    /// A client of the internal port (`https://host:port`): it presents
    /// `identity` and accepts only the control plane's certificate.
    pub fn with_identity(
        credentials: &Credentials,
        identity: &bulkhead_trust::Identity,
    ) -> Result<Client, ClientError> {
        let base = base_url(credentials, "https")
            .ok_or_else(|| ClientError::NotInternal(credentials.control_plane_url.clone()))?;
        let connector = bulkhead_trust::connect::Connector::new(
            identity,
            &[bulkhead_trust::Role::ControlPlane],
        )
        .map_err(|e| ClientError::Unreachable {
            url: base.clone(),
            message: e.to_string(),
        })?;
        let http = Transport::Tls(HyperClient::builder(TokioExecutor::new()).build(connector));
        Ok(Client::over(base, credentials, http))
    }

    fn over(base: String, credentials: &Credentials, http: Transport) -> Client {
        Client {
            base,
            token: credentials.operator_token.clone(),
            http,
            timeout: Duration::from_secs(30),
        }
    }

    /// `GET path` (path starts with `/`).
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Answer<T> {
        self.call(Method::GET, path, None).await
    }

    /// `POST path` with a JSON body.
    pub async fn post<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> Answer<T> {
        self.send_json(Method::POST, path, body).await
    }

    /// `PUT path` with a JSON body.
    pub async fn put<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> Answer<T> {
        self.send_json(Method::PUT, path, body).await
    }

    async fn send_json<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: &B,
    ) -> Answer<T> {
        let body = serde_json::to_vec(body).map_err(|e| ClientError::Decode(e.to_string()))?;
        self.call(method, path, Some(body)).await
    }

    /// `DELETE path`.
    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> Answer<T> {
        self.call(Method::DELETE, path, None).await
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, ClientError> {
        let url = format!("{}{}", self.base, path);
        let mut req = Request::builder()
            .method(method)
            .uri(&url)
            .header("authorization", format!("Bearer {}", self.token));
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let mut req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|_| ClientError::BadUrl(url.clone()))?;
        // The control plane's span joins the caller's trace.
        bulkhead_telemetry::inject_headers(req.headers_mut());
        let unreachable = |message: String| ClientError::Unreachable {
            url: self.base.clone(),
            message,
        };
        let exchange = async {
            let resp = match &self.http {
                Transport::Plain(c) => c.request(req).await,
                Transport::Tls(c) => c.request(req).await,
            }
            .map_err(|e| unreachable(error_chain(&e)))?;
            let status = resp.status();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| unreachable(e.to_string()))?
                .to_bytes();
            Ok::<_, ClientError>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| unreachable(format!("no answer within {:?}", self.timeout)))??;
        if status.is_success() {
            return serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode(e.to_string()));
        }
        Err(api_error(&self.base, status, &bytes))
    }
}

/// The base URL of `credentials` without a trailing `/`, if it is
/// `SCHEME://host[:port][/prefix]`.
fn base_url(credentials: &Credentials, scheme: &str) -> Option<String> {
    let base = credentials
        .control_plane_url
        .trim_end_matches('/')
        .to_owned();
    let uri: Uri = base.parse().ok()?;
    (uri.scheme_str() == Some(scheme) && uri.host().is_some()).then_some(base)
}

fn api_error(base: &str, status: StatusCode, bytes: &[u8]) -> ClientError {
    // The gateway answers in OpenAI's (`error.type`) or Workers AI's
    // (`success`, `errors`) shape, never in the control plane's.
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(bytes)
        && (v["error"]["type"].is_string() || v["errors"].is_array())
    {
        return ClientError::NotControlPlane(base.to_owned());
    }
    match serde_json::from_slice::<ErrorBody>(bytes) {
        Ok(b) => ClientError::Api {
            status: status.as_u16(),
            code: b.error.code,
            message: b.error.message,
        },
        Err(_) => ClientError::Api {
            status: status.as_u16(),
            code: "http_error".to_owned(),
            message: status.canonical_reason().unwrap_or("error").to_owned(),
        },
    }
}

/// An error and its sources on one line, for a log (a refused TLS
/// handshake or a connection error says why only in a source).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}
