//! The native built-ins: enough for demos and tests.

use serde_json::Value;

use super::{Delivery, Handler, HandlerError, HandlerFuture, Output};
use crate::xml::escape_text;

/// Records the message (the log does that) and emits nothing.
pub struct Sink;

impl Handler for Sink {
    fn handle(&self, _delivery: Delivery) -> HandlerFuture {
        Box::pin(async { Ok(Vec::new()) })
    }
}

/// Replies the same payload to the sender.
pub struct Echo;

impl Handler for Echo {
    fn handle(&self, d: Delivery) -> HandlerFuture {
        let out = Output::to(d.meta.from.to_string(), d.payload.xml());
        Box::pin(async move { Ok(vec![out]) })
    }
}

/// Sends the payload on to `config.to`.
pub struct Forward {
    to: String,
}

impl Forward {
    pub fn from_config(config: &Value) -> Result<Self, String> {
        match config.get("to").and_then(Value::as_str) {
            Some(to) => Ok(Forward { to: to.to_string() }),
            None => Err("the forward handler needs `config.to`".into()),
        }
    }
}

impl Handler for Forward {
    fn handle(&self, d: Delivery) -> HandlerFuture {
        let out = Output::to(self.to.clone(), d.payload.xml());
        Box::pin(async move { Ok(vec![out]) })
    }
}

/// Fills an XML template from the payload and sends it on: `config.output` is the template,
/// `config.to` the optional target. `{name}` is the payload's top-level field `name`,
/// `{@from}` / `{@thread_id}` / `{@own_name}` come from the metadata, and `|upper` or `|lower`
/// after a name changes case (`{message|upper}`). Values are XML-escaped.
pub struct Template {
    output: String,
    to: Option<String>,
}

impl Template {
    pub fn from_config(config: &Value) -> Result<Self, String> {
        let output = config
            .get("output")
            .and_then(Value::as_str)
            .ok_or("the template handler needs `config.output`")?;
        Ok(Template {
            output: output.to_string(),
            to: config.get("to").and_then(Value::as_str).map(str::to_string),
        })
    }

    fn render(&self, d: &Delivery) -> Result<String, HandlerError> {
        let fields = d.payload.to_json();
        fill(
            &self.output,
            |v: &str| escape_text(v).into_owned(),
            |name| match name {
                "@from" => Some(d.meta.from.to_string()),
                "@thread_id" => Some(d.meta.thread_id.to_string()),
                "@own_name" => Some(d.meta.own_name.to_string()),
                field => field_text(&fields, field),
            },
        )
        .map_err(HandlerError)
    }
}

/// A top-level field of a payload's JSON view as text.
pub fn field_text(fields: &Value, name: &str) -> Option<String> {
    match fields.get(name)? {
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// Fills `{name}` and `{name|upper}` / `{name|lower}` in `template` with `value(name)`,
/// each written through `write` (XML-escaped for a payload, as is for a line of text). The
/// one template rule: the `template` handler's output and an approval gate's `prompt`.
pub fn fill<W: AsRef<str>>(
    template: &str,
    write: impl Fn(&str) -> W,
    value: impl Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(template.len() + 64);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after
            .find('}')
            .ok_or_else(|| "template has an unclosed `{`".to_string())?;
        let (name, filter) = match after[..close].split_once('|') {
            Some((n, f)) => (n.trim(), Some(f.trim())),
            None => (after[..close].trim(), None),
        };
        let found =
            value(name).ok_or_else(|| format!("template field `{name}` is not in the payload"))?;
        let found = match filter {
            Some("upper") => found.to_uppercase(),
            Some("lower") => found.to_lowercase(),
            None => found,
            Some(other) => return Err(format!("unknown template filter `{other}`")),
        };
        out.push_str(write(&found).as_ref());
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

impl Handler for Template {
    fn handle(&self, d: Delivery) -> HandlerFuture {
        let result = self.render(&d).map(|payload| {
            vec![Output {
                payload,
                to: self.to.clone(),
            }]
        });
        Box::pin(async move { result })
    }
}

/// The longest `delay` wait, in milliseconds.
pub const MAX_DELAY_MS: u64 = 60_000;

/// Waits `config.ms` milliseconds (at most [`MAX_DELAY_MS`]), then sends the payload on to
/// `config.to`, or back to the sender without one: a stand-in for an agent that waits on a
/// slow service, for demos, tests and load runs.
pub struct Delay {
    wait: std::time::Duration,
    to: Option<String>,
}

impl Delay {
    pub fn from_config(config: &Value) -> Result<Self, String> {
        let ms = config
            .get("ms")
            .and_then(Value::as_u64)
            .filter(|ms| *ms <= MAX_DELAY_MS)
            .ok_or_else(|| {
                format!("the delay handler needs `config.ms`, 0 to {MAX_DELAY_MS} milliseconds")
            })?;
        Ok(Delay {
            wait: std::time::Duration::from_millis(ms),
            to: config.get("to").and_then(Value::as_str).map(str::to_string),
        })
    }
}

impl Handler for Delay {
    fn handle(&self, d: Delivery) -> HandlerFuture {
        let to = self.to.clone().unwrap_or_else(|| d.meta.from.to_string());
        let out = Output::to(to, d.payload.xml());
        let wait = self.wait;
        Box::pin(async move {
            tokio::time::sleep(wait).await;
            Ok(vec![out])
        })
    }
}

/// The handler of a `kind: human` listener, which the pump never calls: each delivery to a
/// person opens a question in the inbox instead. Called anyway, it fails and says so.
pub struct Unanswerable;

impl Handler for Unanswerable {
    fn handle(&self, d: Delivery) -> HandlerFuture {
        let name = d.meta.own_name.to_string();
        Box::pin(async move {
            Err(HandlerError(format!(
                "`{name}` is answered by a person through the inbox, not by a handler"
            )))
        })
    }
}
