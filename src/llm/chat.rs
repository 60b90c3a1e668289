//! One call to a model: OpenAI's chat-completions protocol over the crate's one HTTP client
//! (rustls, the system's roots), or the next answer of a scripted model. The answer's text
//! and tool calls; everything else the server says is ignored.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use crate::config::llm::{ModelConfig, Provider, Turn};
use crate::events::DeltaKind;

/// The most of a model's answer that is read, in bytes.
pub const MAX_ANSWER_BYTES: usize = 8 * 1024 * 1024;
/// The most of a refusing server's answer quoted in the error.
const QUOTED: usize = 300;

/// A model as one listener calls it.
pub(super) struct Model {
    config: Arc<ModelConfig>,
    client: reqwest::Client,
    /// Calls at once (`max_concurrency`).
    gate: Semaphore,
    /// The next scripted answer.
    turn: AtomicUsize,
}

/// What the model answered.
#[derive(Debug, Default)]
pub(super) struct Answer {
    pub text: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    /// The tokens the server says the call took, if it says.
    pub usage: Option<Usage>,
}

/// Tokens of one call, as the server reports them (`usage`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Usage {
    pub input: u64,
    pub output: u64,
    pub cached: u64,
}

impl Usage {
    /// `usage` of a chat-completions answer or of a stream's last chunk.
    fn of(v: &Value) -> Option<Usage> {
        let u = v.get("usage").filter(|u| u.is_object())?;
        Some(Usage {
            input: u["prompt_tokens"].as_u64().unwrap_or(0),
            output: u["completion_tokens"].as_u64().unwrap_or(0),
            cached: u["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0),
        })
    }
}

#[derive(Debug, Clone)]
pub(super) struct ToolCall {
    pub id: String,
    pub name: String,
    /// JSON text, as the protocol carries it.
    pub arguments: String,
}

impl ToolCall {
    /// The assistant's turn that made these calls, as the next request repeats it.
    pub(super) fn turn(calls: &[ToolCall], text: Option<&str>) -> Value {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| {
                json!({
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                })
            })
            .collect();
        json!({"role": "assistant", "content": text, "tool_calls": calls})
    }
}

/// What one call asks besides the conversation.
pub(super) struct Ask<'a> {
    pub tools: &'a [Value],
    pub max_tokens: u32,
    pub temperature: Option<f64>,
    /// Streamed: each piece of text or reasoning is handed here as it comes.
    pub stream: Option<OnDelta<'a>>,
}

/// Where a streamed piece is handed.
pub(super) type OnDelta<'a> = &'a (dyn Fn(DeltaKind, &str) + Send + Sync);

impl Model {
    pub(super) fn new(config: Arc<ModelConfig>) -> Result<Model, String> {
        let client = crate::outbound::http_client()?
            .timeout(config.timeout)
            .connect_timeout(config.timeout.min(std::time::Duration::from_secs(5)))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("cannot make an HTTP client: {e}"))?;
        Ok(Model {
            gate: Semaphore::new(config.max_concurrency),
            config,
            client,
            turn: AtomicUsize::new(0),
        })
    }

    pub(super) fn name(&self) -> &str {
        &self.config.name
    }

    pub(super) fn config(&self) -> &Arc<ModelConfig> {
        &self.config
    }

    /// Sends `messages` (and the tools) and reads the answer.
    pub(super) async fn call(&self, messages: &[Value], ask: &Ask<'_>) -> Result<Answer, String> {
        let _permit = self
            .gate
            .acquire()
            .await
            .map_err(|_| "the model is closed".to_string())?;
        match &self.config.provider {
            Provider::Scripted { turns } => {
                let answer = self.scripted(turns);
                if let (Some(on), Some(text)) = (ask.stream, &answer.text) {
                    // In word-sized pieces, as a streaming server sends them.
                    for piece in text.split_inclusive(' ') {
                        on(DeltaKind::Text, piece);
                    }
                }
                Ok(answer)
            }
            Provider::OpenAi {
                base_url,
                model,
                api_key,
                ..
            } => {
                let mut body = json!({
                    "model": model,
                    "messages": messages,
                    "max_tokens": ask.max_tokens,
                });
                if !ask.tools.is_empty() {
                    body["tools"] = json!(ask.tools);
                }
                if let Some(t) = ask.temperature {
                    body["temperature"] = json!(t);
                }
                if ask.stream.is_some() {
                    body["stream"] = json!(true);
                    body["stream_options"] = json!({"include_usage": true});
                }
                let mut req = self
                    .client
                    .post(format!("{base_url}/chat/completions"))
                    .json(&body);
                if let Some(key) = api_key {
                    req = req.bearer_auth(key);
                }
                self.read(req.send().await, ask.stream).await
            }
        }
    }

    fn scripted(&self, turns: &[Turn]) -> Answer {
        let n = self.turn.fetch_add(1, Ordering::Relaxed);
        match turns.get(n % turns.len().max(1)) {
            Some(Turn::Text(t)) => Answer {
                text: Some(t.clone()),
                ..Answer::default()
            },
            Some(Turn::Tool { name, arguments }) => Answer {
                text: None,
                tool_calls: vec![ToolCall {
                    id: format!("scripted-{n}"),
                    name: name.clone(),
                    arguments: arguments.to_string(),
                }],
                usage: None,
            },
            None => Answer::default(),
        }
    }

    async fn read(
        &self,
        sent: Result<reqwest::Response, reqwest::Error>,
        stream: Option<OnDelta<'_>>,
    ) -> Result<Answer, String> {
        let name = &self.config.name;
        let timeout = || {
            format!(
                "model `{name}` did not answer within {} ms",
                self.config.timeout.as_millis()
            )
        };
        let resp = match sent {
            Ok(r) => r,
            Err(e) if e.is_timeout() => return Err(timeout()),
            Err(e) => return Err(format!("cannot reach model `{name}`: {}", without_url(&e))),
        };
        let status = resp.status();
        let mut bytes = Box::pin(chunks(resp, name, timeout()));
        if let Some(on) = stream.filter(|_| status.is_success()) {
            return streamed(name, bytes, on).await;
        }
        let mut body = Vec::new();
        while let Some(c) = bytes.next().await {
            body.extend_from_slice(&c?);
        }
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            let quoted: String = text.chars().take(QUOTED).collect();
            return Err(format!("model `{name}` answered {status}: {quoted}"));
        }
        let v: Value = serde_json::from_slice(&body)
            .map_err(|e| format!("model `{name}`'s answer is not JSON: {e}"))?;
        let message = &v["choices"][0]["message"];
        if !message.is_object() {
            return Err(format!(
                "model `{name}`'s answer has no `choices[0].message`"
            ));
        }
        let text = message["content"]
            .as_str()
            .filter(|t| !t.trim().is_empty())
            .map(str::to_string);
        let mut tool_calls = Vec::new();
        for (i, c) in message["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let f = &c["function"];
            let arguments = match &f["arguments"] {
                Value::String(s) => s.clone(),
                Value::Null => "{}".to_string(),
                other => other.to_string(),
            };
            tool_calls.push(ToolCall {
                id: c["id"]
                    .as_str()
                    .map_or_else(|| format!("call-{i}"), str::to_string),
                name: f["name"].as_str().unwrap_or_default().to_string(),
                arguments,
            });
        }
        Ok(Answer {
            text,
            tool_calls,
            usage: Usage::of(&v),
        })
    }
}

/// A client error's text without the URL (which may carry a key in its query).
fn without_url(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text.replace(url.as_str(), "the model's URL");
    }
    text
}

/// The answer's bytes as they come, at most [`MAX_ANSWER_BYTES`] of them; an error is the
/// message the call fails with (`timeout`, when it took too long), and ends the stream.
fn chunks(
    resp: reqwest::Response,
    name: &str,
    timeout: String,
) -> impl futures_util::Stream<Item = Result<bytes::Bytes, String>> {
    let (name, timeout): (Arc<str>, Arc<str>) = (Arc::from(name), Arc::from(timeout));
    futures_util::stream::unfold(Some((resp, 0usize)), move |state| {
        let (name, timeout) = (name.clone(), timeout.clone());
        async move {
            let (mut resp, read) = state?;
            let failed = match resp.chunk().await {
                Ok(Some(c)) if read + c.len() > MAX_ANSWER_BYTES => {
                    format!("model `{name}`'s answer is over {MAX_ANSWER_BYTES} bytes")
                }
                Ok(Some(c)) => {
                    let read = read + c.len();
                    return Some((Ok(c), Some((resp, read))));
                }
                Ok(None) => return None,
                Err(e) if e.is_timeout() => timeout.to_string(),
                Err(e) => format!("model `{name}`'s answer broke off: {}", without_url(&e)),
            };
            Some((Err(failed), None))
        }
    })
}

/// A streamed answer (Server-Sent Events of `chat.completion.chunk`s, read by
/// `eventsource-stream` from `bytes`): each piece of text and reasoning handed to `on` as it
/// comes, the tool calls gathered by their `index`.
async fn streamed(
    name: &str,
    bytes: impl futures_util::Stream<Item = Result<bytes::Bytes, String>>,
    on: OnDelta<'_>,
) -> Result<Answer, String> {
    use eventsource_stream::Eventsource;
    let mut events = Box::pin(bytes.eventsource());
    let mut text = String::new();
    let mut calls: Vec<ToolCall> = Vec::new();
    let mut usage = None;
    while let Some(ev) = events.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(eventsource_stream::EventStreamError::Transport(e)) => return Err(e),
            Err(eventsource_stream::EventStreamError::Utf8(e)) => {
                return Err(format!("model `{name}`'s stream is not UTF-8: {e}"))
            }
            Err(eventsource_stream::EventStreamError::Parser(e)) => {
                return Err(format!("model `{name}`'s stream does not read: {e}"))
            }
        };
        if ev.data.trim() == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(&ev.data)
            .map_err(|e| format!("model `{name}` streamed a chunk that is not JSON: {e}"))?;
        usage = Usage::of(&chunk).or(usage);
        let delta = &chunk["choices"][0]["delta"];
        for (key, kind) in [
            ("reasoning_content", DeltaKind::Thinking),
            ("reasoning", DeltaKind::Thinking),
            ("content", DeltaKind::Text),
        ] {
            if let Some(piece) = delta[key].as_str().filter(|p| !p.is_empty()) {
                if kind == DeltaKind::Text {
                    text.push_str(piece);
                }
                on(kind, piece);
            }
        }
        for c in delta["tool_calls"].as_array().into_iter().flatten() {
            let i = c["index"].as_u64().unwrap_or(0) as usize;
            if i >= 64 {
                continue;
            }
            while calls.len() <= i {
                calls.push(ToolCall {
                    id: format!("call-{}", calls.len()),
                    name: String::new(),
                    arguments: String::new(),
                });
            }
            let call = &mut calls[i];
            if let Some(id) = c["id"].as_str() {
                call.id = id.to_string();
            }
            if let Some(n) = c["function"]["name"].as_str() {
                call.name.push_str(n);
            }
            if let Some(a) = c["function"]["arguments"].as_str() {
                call.arguments.push_str(a);
            }
        }
    }
    for c in &mut calls {
        if c.arguments.is_empty() {
            c.arguments = "{}".to_string();
        }
    }
    Ok(Answer {
        text: Some(text).filter(|t| !t.trim().is_empty()),
        tool_calls: calls,
        usage,
    })
}
