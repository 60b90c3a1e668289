//! A listener's approval gate (`approval:`): which of its messages wait for a person's
//! decision, who may decide, what they may do, and what happens when nobody does in time.
//! Plain data, checked here; the pump enforces it (`pump::inputs`).

use std::time::Duration;

use serde::Deserialize;

use super::{parse_age, Collector, ListenerSection, Role};
use crate::schema::Schema;
use crate::xml::PayloadType;

/// How long a held message waits for a decision when `timeout` is not given.
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// The longest `timeout` (a year): a timer further away is a mistake.
pub const MAX_APPROVAL_TIMEOUT: Duration = Duration::from_secs(366 * 24 * 3600);

/// What a person may do with a held message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    /// Let it through as it is.
    Approve,
    /// Refuse it: the message is `declined`.
    Reject,
    /// Let a corrected payload through instead (validated again); the original is
    /// `superseded`.
    Edit,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Approve => "approve",
            Decision::Reject => "reject",
            Decision::Edit => "edit",
        }
    }
}

/// What happens to a held message nobody decided within `timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnTimeout {
    /// It is declined (the input `expired`).
    #[default]
    Reject,
    /// It goes through (a soft gate).
    Approve,
    /// It stays held: no timer.
    Keep,
    /// Its input passes to `escalate_to`'s approvers (a `kind: human` listener's), with that
    /// listener's `reply_timeout`; past that, it is declined.
    Escalate,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ApprovalSection {
    types: Option<Vec<String>>,
    from: Option<Vec<String>>,
    approvers: Option<ApproversSection>,
    allow: Option<Vec<Decision>>,
    timeout: Option<yaml_serde::Value>,
    on_timeout: Option<OnTimeout>,
    prompt: Option<String>,
    notify: Option<NotifySection>,
    escalate_to: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NotifySection {
    url: String,
    secret_env: Option<String>,
}

/// Where a gate tells of each input it opens: `POST {input, links}` to `url`, signed with
/// the secret (`X-Agentserver-Signature: sha256=<HMAC-SHA256 of the body>`) when one is
/// given. `Debug` hides the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Notify {
    pub url: String,
    pub secret_env: Option<String>,
    pub secret: Option<String>,
}

impl std::fmt::Debug for Notify {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notify")
            .field("url", &super::display_url(&self.url))
            .field("secret_env", &self.secret_env)
            .field("secret", &self.secret.as_ref().map(|_| "<hidden>"))
            .finish()
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ApproversSection {
    role: Option<Role>,
    #[serde(default)]
    keys: Vec<String>,
    #[serde(default)]
    subjects: Vec<String>,
    #[serde(default)]
    distinct_from_sender: bool,
}

/// Who may decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approvers {
    /// The least role (default `operator`).
    pub role: Role,
    /// API key names (`alice` for `key:alice`); empty: any key.
    pub keys: Vec<String>,
    /// JWT subjects; empty: any. With both lists given, either may match.
    pub subjects: Vec<String>,
    /// The principal that injected the thread may not decide (four eyes).
    pub distinct_from_sender: bool,
}

/// A checked `approval:` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval {
    /// The payload types held; `None`: every type the listener accepts.
    pub types: Option<Vec<PayloadType>>,
    /// Only messages from these senders are held; `None`: from anyone.
    pub from: Option<Vec<String>>,
    pub approvers: Approvers,
    pub allow: Vec<Decision>,
    /// `None` with `on_timeout: keep`.
    pub timeout: Option<Duration>,
    pub on_timeout: OnTimeout,
    /// A line shown with the input, `{field}` filled from the payload's leaves.
    pub prompt: Option<String>,
    pub notify: Option<Notify>,
    /// For `on_timeout: escalate`: the `kind: human` listener whose approvers take over.
    pub escalate_to: Option<String>,
}

impl Approval {
    /// The gate `approval: {}` writes: every type, from anyone, an operator decides, every
    /// decision allowed, declined after [`DEFAULT_APPROVAL_TIMEOUT`].
    pub fn default_gate() -> Approval {
        Approval {
            types: None,
            from: None,
            approvers: approvers_of(None),
            allow: vec![Decision::Approve, Decision::Reject, Decision::Edit],
            timeout: Some(DEFAULT_APPROVAL_TIMEOUT),
            on_timeout: OnTimeout::Reject,
            prompt: None,
            notify: None,
            escalate_to: None,
        }
    }

    /// Whether a message of `payload_type` from `from` waits at this gate.
    pub fn holds(&self, payload_type: &PayloadType, from: &str) -> bool {
        self.types
            .as_ref()
            .is_none_or(|ts| ts.iter().any(|t| t == payload_type))
            && self
                .from
                .as_ref()
                .is_none_or(|fs| fs.iter().any(|f| f == from))
    }

    pub fn allows(&self, d: Decision) -> bool {
        self.allow.contains(&d)
    }
}

/// A `kind: human` listener's settings: who answers its questions, and how long one waits
/// (`reply_timeout`; past it the question's message fails).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Human {
    pub approvers: Approvers,
    pub reply_timeout: Duration,
}

/// How long a question to a person waits when `reply_timeout` is not given.
pub const DEFAULT_HUMAN_REPLY_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

fn approvers_of(a: Option<&ApproversSection>) -> Approvers {
    Approvers {
        role: a.and_then(|a| a.role).unwrap_or(Role::Operator),
        keys: a.map(|a| a.keys.clone()).unwrap_or_default(),
        subjects: a.map(|a| a.subjects.clone()).unwrap_or_default(),
        distinct_from_sender: a.is_some_and(|a| a.distinct_from_sender),
    }
}

/// An `escalate_to` names a `kind: human` listener of the organism (checked once every
/// listener is built).
pub(super) fn check_escalations(built: &[super::ListenerConfig], c: &mut Collector) {
    for l in built {
        let Some(to) = l.approval.as_ref().and_then(|a| a.escalate_to.as_deref()) else {
            continue;
        };
        if !built
            .iter()
            .any(|h| h.name.as_str() == to && h.human.is_some())
        {
            c.push(
                Some(l.name.as_str()),
                Some("approval.escalate_to"),
                format!("`{to}` is not a `kind: human` listener of this organism"),
            );
        }
    }
}

/// Checks a `kind: human` listener: its `approvers` and `reply_timeout`, and that nothing
/// only another kind takes is given. `None` for other kinds (whose `approvers` is refused).
pub(super) fn check_human(s: &ListenerSection, c: &mut Collector) -> Option<std::sync::Arc<Human>> {
    let l = Some(s.name.as_str());
    if s.kind != super::ListenerKind::Human {
        if s.approvers.is_some() {
            c.push(
                l,
                Some("approvers"),
                "is for `kind: human` listeners (a gate's approvers go in `approval.approvers`)",
            );
        }
        return None;
    }
    let before = c.errors.len();
    if s.placement == super::Placement::Workers {
        c.push(
            l,
            Some("placement"),
            "a person answers in the inbox: `kind: human` cannot be placed on workers",
        );
    }
    let reply_timeout = match &s.reply_timeout {
        None => Some(DEFAULT_HUMAN_REPLY_TIMEOUT),
        Some(yaml_serde::Value::Number(n)) => n.as_u64().map(Duration::from_secs),
        Some(yaml_serde::Value::String(t)) => parse_age(t),
        Some(_) => None,
    }
    .filter(|d| !d.is_zero() && *d <= MAX_APPROVAL_TIMEOUT);
    if reply_timeout.is_none() {
        c.push(
            l,
            Some("reply_timeout"),
            "must be seconds or a duration like 30m, 24h, 7d, greater than 0 and at most 366d",
        );
    }
    let approvers = approvers_of(s.approvers.as_ref());
    if approvers.role == Role::Viewer {
        c.push(
            l,
            Some("approvers.role"),
            "viewers only read: the least role that answers is operator",
        );
    }
    (c.errors.len() == before).then(|| {
        std::sync::Arc::new(Human {
            approvers,
            reply_timeout: reply_timeout.unwrap_or(DEFAULT_HUMAN_REPLY_TIMEOUT),
        })
    })
}

/// A gate's `notify`: an http(s) URL, and the secret of `secret_env` if named.
fn check_notify(n: &NotifySection, l: Option<&str>, c: &mut Collector) -> Notify {
    match reqwest::Url::parse(&n.url) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => {}
        Ok(_) => c.push(
            l,
            Some("approval.notify.url"),
            "must be an http:// or https:// URL",
        ),
        Err(e) => c.push(l, Some("approval.notify.url"), format!("is not a URL: {e}")),
    }
    let secret = n.secret_env.as_deref().and_then(|var| {
        super::check_sections::env_secret(
            var,
            l,
            "approval.notify.secret_env",
            "the notifications' signing secret",
            c,
        )
    });
    Notify {
        url: n.url.clone(),
        secret_env: n.secret_env.clone(),
        secret,
    }
}

/// Checks `s.approval` against the listener's accepted types and the organism's listener
/// names; every problem is collected with its key.
pub(super) fn check_approval(
    s: &ListenerSection,
    accepts: &[(PayloadType, std::sync::Arc<Schema>)],
    c: &mut Collector,
) -> Option<std::sync::Arc<Approval>> {
    let section = s.approval.as_ref()?;
    let l = Some(s.name.as_str());
    let before = c.errors.len();
    let types = section.types.as_ref().map(|ts| {
        ts.iter()
            .filter_map(|t| {
                let found = accepts.iter().find(|(p, _)| p.is_written_as(t));
                if found.is_none() {
                    c.push(
                        l,
                        Some("approval.types"),
                        format!("`{t}` is not a type this listener accepts"),
                    );
                }
                found.map(|(p, _)| p.clone())
            })
            .collect::<Vec<_>>()
    });
    if section.from.as_ref().is_some_and(Vec::is_empty) {
        c.push(
            l,
            Some("approval.from"),
            "an empty list holds nothing: leave it out to hold messages from anyone",
        );
    }
    let allow = section
        .allow
        .clone()
        .unwrap_or_else(|| vec![Decision::Approve, Decision::Reject, Decision::Edit]);
    if allow.is_empty() {
        c.push(
            l,
            Some("approval.allow"),
            "must allow at least one of approve, reject, edit",
        );
    }
    let on_timeout = section.on_timeout.unwrap_or_default();
    let timeout = match &section.timeout {
        None => Some(DEFAULT_APPROVAL_TIMEOUT),
        Some(yaml_serde::Value::Number(n)) => n.as_u64().map(Duration::from_secs),
        Some(yaml_serde::Value::String(t)) => parse_age(t),
        Some(_) => None,
    }
    .filter(|d| !d.is_zero() && *d <= MAX_APPROVAL_TIMEOUT);
    if timeout.is_none() {
        c.push(
            l,
            Some("approval.timeout"),
            "must be seconds (3600) or a duration like 30m, 24h, 7d, greater than 0 and at most 366d",
        );
    }
    let approvers = approvers_of(section.approvers.as_ref());
    match (on_timeout, &section.escalate_to) {
        (OnTimeout::Escalate, None) => c.push(
            l,
            Some("approval.escalate_to"),
            "`on_timeout: escalate` needs `escalate_to`: a `kind: human` listener whose approvers take over",
        ),
        (OnTimeout::Escalate, Some(_)) | (_, None) => {}
        (_, Some(_)) => c.push(
            l,
            Some("approval.escalate_to"),
            "is for `on_timeout: escalate`",
        ),
    }
    if approvers.role == Role::Viewer {
        c.push(
            l,
            Some("approval.approvers.role"),
            "viewers only read: the least role that decides is operator",
        );
    }
    let notify = section.notify.as_ref().map(|n| check_notify(n, l, c));
    if let Some(p) = &section.prompt {
        if p.len() > 4096 {
            c.push(l, Some("approval.prompt"), "must be at most 4096 bytes");
        }
    }
    (c.errors.len() == before).then(|| {
        std::sync::Arc::new(Approval {
            types,
            from: section.from.clone(),
            approvers,
            allow,
            timeout: (on_timeout != OnTimeout::Keep).then_some(timeout).flatten(),
            on_timeout,
            prompt: section.prompt.clone(),
            notify,
            escalate_to: section.escalate_to.clone(),
        })
    })
}
