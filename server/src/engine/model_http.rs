//! Owns how a model agent reaches its endpoint: async-openai's client over
//! reqwest, its retrying executor kept, with every answer's body bounded
//! ([`RESPONSE_LIMIT`]). A model endpoint is the company's choosing and
//! untrusted: an answer larger than any chat completion is dropped before
//! it is held whole, and the turn fails saying so.

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::middleware::ReqwestService;
use async_openai::middleware::retry::OpenAIRetryLayer;

/// The most bytes a model endpoint's answer may have (4 MiB: a chat
/// completion's longest is a small fraction of it).
pub const RESPONSE_LIMIT: usize = 4 * 1024 * 1024;

/// An answer past the limit: it was dropped unread past `limit` bytes.
#[derive(Debug, thiserror::Error)]
#[error("the answer is larger than {limit} bytes")]
pub struct TooLarge {
    pub limit: usize,
}

/// A client for `config` whose answers are bounded by `limit` bytes.
pub fn client(config: OpenAIConfig, limit: usize) -> Client<OpenAIConfig> {
    let service = tower::ServiceBuilder::new()
        .layer(OpenAIRetryLayer::default())
        .and_then(move |r: openai_reqwest::Response| bounded(r, limit))
        .service(ReqwestService::new(openai_reqwest::Client::new()));
    Client::with_config(config).with_http_service(service)
}

/// `r` with its body read, at most `limit` bytes of it: the same answer
/// (status, headers, body) or [`TooLarge`] as soon as it is known to be.
async fn bounded(
    mut r: openai_reqwest::Response,
    limit: usize,
) -> Result<openai_reqwest::Response, OpenAIError> {
    let too_large = || OpenAIError::Boxed(Box::new(TooLarge { limit }));
    if r.content_length().is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = r.chunk().await.map_err(OpenAIError::Reqwest)? {
        if body.len() + chunk.len() > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    let mut kept = http::Response::builder()
        .status(r.status())
        .version(r.version());
    if let Some(headers) = kept.headers_mut() {
        headers.extend(r.headers().iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    kept.body(body)
        .map(openai_reqwest::Response::from)
        .map_err(|e| OpenAIError::InvalidArgument(format!("cannot keep the answer: {e}")))
}

/// The limit an error from [`client`] says was passed, if that is what it is.
pub fn too_large(e: &OpenAIError) -> Option<usize> {
    match e {
        OpenAIError::Boxed(b) => b.downcast_ref::<TooLarge>().map(|t| t.limit),
        _ => None,
    }
}
