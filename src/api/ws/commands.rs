//! A pump session's commands: `subscribe`, and the controls its principal's role and scope allow,
//! each answered by `ack` or `error`, the controls kept in the audit log.

use serde_json::{json, Map, Value};

use super::session::{subscribe_spec, Session};
use super::{Pump, WS_IDENTITY};
use crate::api::auth::{command_least, command_rule, unknown_thread, Need, On, Seen};
use crate::api::error::ApiError;
use crate::api::idempotency::inject;
use crate::api::inject::InjectBody;
use crate::api::inputs::{self, AnswerBody, DecisionBody, RejectBody};
use crate::api::rest::reload_blocking;
use crate::api::Endpoint;

/// Runs one pump command (its `request_id` and `cmd` taken out), keeping a control in the
/// audit log: the ack's extra fields.
pub(super) async fn execute(
    s: &mut Session<Pump>,
    cmd: &str,
    map: Map<String, Value>,
) -> Result<Map<String, Value>, ApiError> {
    let audited = audited_command(cmd, &map);
    let reply = run(s, cmd, map).await;
    if let Some(target) = audited {
        let p = &s.principal;
        let result = match &reply {
            Ok(_) => "ack".to_string(),
            Err(e) => e.status.as_u16().to_string(),
        };
        let row = crate::store::audit::AuditRow {
            ts: crate::time::Timestamp::now(),
            who: p.name.clone(),
            role: Some(p.role.to_string()),
            tenant: p.tenant.clone(),
            action: format!("ws {cmd}"),
            target: Some(target),
            result,
            remote: s.remote.map(|ip| ip.to_string()),
        };
        s.source.0.audit(row).await;
    }
    reply
}

/// The command is read into what it does first ([`Command`]); its rule in the one table
/// (`auth::policy::TABLE`) is looked up by that, and the same value is executed.
async fn run(
    s: &mut Session<Pump>,
    cmd: &str,
    map: Map<String, Value>,
) -> Result<Map<String, Value>, ApiError> {
    if let Some(least) = command_least(cmd).filter(|r| !s.principal.may(*r)) {
        return Err(crate::api::auth::forbidden(&s.principal, least));
    }
    let command = Command::read(cmd, map)?;
    let Some(rule) = command_rule(cmd, command.on()) else {
        return Err(unknown_command(cmd));
    };
    if let Need::Role(need) = rule.need {
        if !s.principal.may(need) {
            return Err(crate::api::auth::forbidden(&s.principal, need));
        }
    }
    if s.principal.tenant.is_some() && rule.organism_wide {
        return Err(crate::api::auth::tenant_forbidden());
    }
    let scope = s.scope();
    if let Some(a) = command.agent() {
        if !scope.sees(a) {
            return Err(crate::pump::ControlError::UnknownListener(a.to_string()).into());
        }
    }
    if s.ep == Endpoint::Messages && !matches!(command, Command::Subscribe(_)) {
        return Err(ApiError::bad_request(format!(
            "`{cmd}` is not a command of /ws/messages (only `subscribe`); use /ws"
        ))
        .at("cmd"));
    }
    let organism = s.source.0.inner.organism.clone();
    let mut out = Map::new();
    let seen = Seen {
        principal: s.principal.clone(),
        scope: scope.clone(),
    };
    match command {
        Command::Subscribe(spec) => return s.subscribe_with_history(spec, &scope).await,
        Command::Inject(body, key) => {
            s.source.0.limit_inject(&s.principal)?;
            let keys = &s.source.0.inner.keys;
            let once = inject(keys, &organism, &seen, WS_IDENTITY, *body, key.as_deref()).await?;
            out.insert("thread_id".into(), json!(once.receipt.thread_id));
            out.insert("message_id".into(), json!(once.receipt.message_id));
            if once.replayed {
                out.insert("replayed".into(), json!(true));
            }
        }
        Command::Pause(None) => organism.control().pause(),
        Command::Resume(None) => organism.control().resume(),
        Command::Pause(Some(a)) | Command::Resume(Some(a)) => {
            if cmd == "pause" {
                organism.control().pause_listener(&a)?;
            } else {
                organism.control().resume_listener(&a)?;
            }
            out.insert("agent".into(), json!(a));
        }
        Command::Kill(t) => {
            see_thread(&organism, &scope, &t)?;
            organism.control().kill_thread(&t)?;
            out.insert("thread_id".into(), json!(t));
        }
        Command::Abort(t, reason) => {
            see_thread(&organism, &scope, &t)?;
            inputs::abort(&organism, &seen, &t, reason, WS_IDENTITY)?;
            out.insert("thread_id".into(), json!(t));
        }
        Command::Retry(id, dry_run) => {
            out = fields(crate::api::retry::retry_one(&organism, &scope, &id, dry_run).await?);
        }
        Command::Fork(t, body) => {
            see_thread(&organism, &scope, &t)?;
            out = fields(
                crate::api::fork::fork(&organism, &scope, s.principal.tenant.as_deref(), &t, *body)
                    .await?,
            );
        }
        Command::Rewind(t, body) => {
            see_thread(&organism, &scope, &t)?;
            out = fields(crate::api::rewind::rewind(&organism, &scope, &t, *body).await?);
        }
        Command::Settings(t, patch) => {
            see_thread(&organism, &scope, &t)?;
            out = crate::api::settings::change_answered(&organism, &scope, &t, *patch)?;
        }
        Command::Approve(id, body) => {
            let row = inputs::approve(&organism, &seen, &id, *body).await?;
            out.insert("input_id".into(), json!(id));
            out.insert("status".into(), json!(row.status.as_str()));
            out.insert("result_message_id".into(), json!(row.result));
        }
        Command::Answer(id, body) => {
            let row = inputs::answer(&organism, &seen, &id, *body).await?;
            out.insert("input_id".into(), json!(id));
            out.insert("status".into(), json!(row.status.as_str()));
        }
        Command::Reject(id, reason) => {
            let row = inputs::reject(&organism, &seen, &id, reason).await?;
            out.insert("input_id".into(), json!(id));
            out.insert("status".into(), json!(row.status.as_str()));
        }
        Command::ReloadAgent(a) => {
            let o = organism.clone();
            let name = a.clone();
            crate::events::spawn_blocking(move || o.control().reload_listener(&name))
                .await
                .map_err(|e| ApiError::bad_request(e.to_string()))??;
            out.insert("agent".into(), json!(a));
        }
        Command::Reload { if_rev } => {
            out = fields(reload_blocking(&organism, if_rev).await?);
        }
        Command::Stop => s.source.0.request_stop(),
    }
    Ok(out)
}

/// Thread `t` exists and `scope` sees it; else the answer for a thread that does not.
fn see_thread(
    organism: &crate::Organism,
    scope: &crate::access::Scope,
    t: &str,
) -> Result<(), ApiError> {
    let visible = organism
        .history()
        .thread_info(t)?
        .is_some_and(|info| scope.sees_thread(&info.participants));
    if visible {
        Ok(())
    } else {
        Err(unknown_thread(t).at("thread_id"))
    }
}

/// A command's answer as its `ack`'s fields (the REST answer's).
fn fields(answer: impl serde::Serialize) -> Map<String, Value> {
    match serde_json::to_value(answer) {
        Ok(Value::Object(fields)) => fields,
        _ => Map::new(),
    }
}

fn unknown_command(cmd: &str) -> ApiError {
    ApiError::bad_request(format!(
        "unknown command `{cmd}` (known: subscribe, inject, pause, resume, kill, abort, settings, retry, fork, rewind, approve, reject, answer, reload, stop)"
    ))
    .at("cmd")
}

/// A field of a command that is text if given.
fn text(map: &Map<String, Value>, key: &str) -> Result<Option<String>, ApiError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(v)) => Ok(Some(v.clone())),
        Some(_) => Err(ApiError::bad_request(format!("`{key}` must be text")).at(key)),
    }
}

/// A command on a thread: its `thread_id`, and the rest of its fields read as the REST
/// route's body `T`.
fn on_thread<T: serde::de::DeserializeOwned>(
    cmd: &str,
    mut map: Map<String, Value>,
) -> Result<(String, T), ApiError> {
    let t = text(&map, "thread_id")?.ok_or_else(|| {
        ApiError::bad_request(format!("`{cmd}` needs a `thread_id`")).at("thread_id")
    })?;
    map.remove("thread_id");
    let body = serde_json::from_value(Value::Object(map))
        .map_err(|e| ApiError::bad_request(format!("bad {cmd}: {e}")))?;
    Ok((t, body))
}

/// A command on an input: its `input_id`, and the rest of its fields read as the REST
/// route's body `T` (so both refuse the same fields).
fn on_input<T: serde::de::DeserializeOwned>(
    cmd: &str,
    mut map: Map<String, Value>,
) -> Result<(String, T), ApiError> {
    let id = text(&map, "input_id")?.ok_or_else(|| {
        ApiError::bad_request(format!("`{cmd}` needs an `input_id`")).at("input_id")
    })?;
    map.remove("input_id");
    let body = serde_json::from_value(Value::Object(map))
        .map_err(|e| ApiError::bad_request(format!("bad {cmd}: {e}")))?;
    Ok((id, body))
}

/// A `/ws` command as what it does, read from its frame before anything is checked.
enum Command {
    Subscribe(Value),
    /// The body, and its idempotency key.
    Inject(Box<InjectBody>, Option<String>),
    /// `None`: the organism.
    Pause(Option<String>),
    Resume(Option<String>),
    ReloadAgent(String),
    Reload {
        if_rev: Option<u64>,
    },
    Kill(String),
    /// A thread, and why.
    Abort(String, Option<String>),
    /// A message, and whether only to say what would run.
    Retry(String, bool),
    /// A thread, and the fork's body (the REST route's, the new thread's id as
    /// `new_thread_id`).
    Fork(String, Box<crate::api::fork::ForkBody>),
    /// A thread, and the rewind's body (the REST route's).
    Rewind(String, Box<crate::api::rewind::RewindBody>),
    /// A thread, and the change of its settings (the REST route's body).
    Settings(String, Box<crate::api::settings::ThreadPatch>),
    /// An input, and the decision's body.
    Approve(String, Box<DecisionBody>),
    /// An input, and why.
    Reject(String, Option<String>),
    /// A question, and its answer.
    Answer(String, Box<AnswerBody>),
    Stop,
}

impl Command {
    fn read(cmd: &str, map: Map<String, Value>) -> Result<Command, ApiError> {
        let agent = |map: &Map<String, Value>| match map.get("agent") {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(a)) => Ok(Some(a.clone())),
            Some(_) => Err(ApiError::bad_request("`agent` must be a name").at("agent")),
        };
        Ok(match cmd {
            "subscribe" => Command::Subscribe(subscribe_spec(map)?),
            "inject" => {
                let mut map = map;
                let key = match map.remove("idempotency_key") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(k)) => Some(k),
                    Some(_) => {
                        return Err(ApiError::bad_request("`idempotency_key` must be a string")
                            .at("idempotency_key"))
                    }
                };
                let body = serde_json::from_value(Value::Object(map))
                    .map_err(|e| ApiError::bad_request(format!("bad inject: {e}")))?;
                Command::Inject(Box::new(body), key)
            }
            "pause" => Command::Pause(agent(&map)?),
            "resume" => Command::Resume(agent(&map)?),
            "reload" => match agent(&map)? {
                Some(a) => Command::ReloadAgent(a),
                None => Command::Reload {
                    if_rev: match map.get("if_rev") {
                        None | Some(Value::Null) => None,
                        Some(v) => Some(v.as_u64().ok_or_else(|| {
                            ApiError::bad_request("`if_rev` must be a revision number").at("if_rev")
                        })?),
                    },
                },
            },
            "kill" => match map.get("thread_id") {
                Some(Value::String(t)) => Command::Kill(t.clone()),
                _ => {
                    return Err(ApiError::bad_request("`kill` needs a `thread_id`").at("thread_id"))
                }
            },
            "abort" => Command::Abort(
                text(&map, "thread_id")?.ok_or_else(|| {
                    ApiError::bad_request("`abort` needs a `thread_id`").at("thread_id")
                })?,
                text(&map, "reason")?,
            ),
            "retry" => Command::Retry(
                text(&map, "message_id")?.ok_or_else(|| {
                    ApiError::bad_request("`retry` needs a `message_id`").at("message_id")
                })?,
                match map.get("dry_run") {
                    None | Some(Value::Null) => false,
                    Some(Value::Bool(b)) => *b,
                    Some(_) => {
                        return Err(
                            ApiError::bad_request("`dry_run` is true or false").at("dry_run")
                        )
                    }
                },
            ),
            "fork" => {
                let mut map = map;
                let t = text(&map, "thread_id")?.ok_or_else(|| {
                    ApiError::bad_request("`fork` needs a `thread_id`").at("thread_id")
                })?;
                map.remove("thread_id");
                if let Some(new) = map.remove("new_thread_id") {
                    map.insert("thread_id".into(), new);
                }
                let body = serde_json::from_value(Value::Object(map))
                    .map_err(|e| ApiError::bad_request(format!("bad fork: {e}")))?;
                Command::Fork(t, Box::new(body))
            }
            "rewind" => {
                let (t, body) = on_thread(cmd, map)?;
                Command::Rewind(t, Box::new(body))
            }
            "settings" => {
                let mut map = map;
                let t = text(&map, "thread_id")?.ok_or_else(|| {
                    ApiError::bad_request("`settings` needs a `thread_id`").at("thread_id")
                })?;
                map.remove("thread_id");
                let patch = serde_json::from_value(Value::Object(map))
                    .map_err(|e| ApiError::bad_request(format!("bad settings: {e}")))?;
                Command::Settings(t, Box::new(patch))
            }
            "answer" => {
                let (id, body) = on_input::<AnswerBody>(cmd, map)?;
                Command::Answer(id, Box::new(body))
            }
            "approve" => {
                let (id, body) = on_input::<DecisionBody>(cmd, map)?;
                Command::Approve(id, Box::new(body))
            }
            "reject" => {
                // The REST route's body: a `reason` only.
                let (id, body) = on_input::<RejectBody>(cmd, map)?;
                Command::Reject(id, body.reason)
            }
            "stop" => Command::Stop,
            _ => return Err(unknown_command(cmd)),
        })
    }

    /// What it acts on, by which its rule is found.
    fn on(&self) -> On {
        match self {
            Command::Subscribe(_) => On::Session,
            Command::Inject(..) | Command::ReloadAgent(_) => On::Agent,
            Command::Pause(a) | Command::Resume(a) if a.is_some() => On::Agent,
            Command::Kill(_)
            | Command::Abort(..)
            | Command::Settings(..)
            | Command::Fork(..)
            | Command::Rewind(..) => On::Thread,
            Command::Approve(..) | Command::Reject(..) | Command::Answer(..) => On::Input,
            Command::Retry(..) => On::Message,
            Command::Pause(_) | Command::Resume(_) | Command::Reload { .. } | Command::Stop => {
                On::Organism
            }
        }
    }

    /// The listener it names, which a tenant's session must see.
    fn agent(&self) -> Option<&str> {
        match self {
            Command::Pause(Some(a)) | Command::Resume(Some(a)) | Command::ReloadAgent(a) => Some(a),
            _ => None,
        }
    }
}

/// The audit entry's target of a `/ws` control command (`None` for `subscribe`, `inject`
/// and anything unknown).
fn audited_command(cmd: &str, map: &Map<String, Value>) -> Option<String> {
    if !matches!(
        cmd,
        "pause"
            | "resume"
            | "reload"
            | "kill"
            | "abort"
            | "settings"
            | "retry"
            | "fork"
            | "rewind"
            | "approve"
            | "reject"
            | "answer"
            | "stop"
    ) {
        return None;
    }
    let named = |k: &str| map.get(k).and_then(Value::as_str).map(str::to_string);
    Some(
        named("agent")
            .or_else(|| named("thread_id"))
            .or_else(|| named("input_id"))
            .or_else(|| named("message_id"))
            .unwrap_or_else(|| "organism".into()),
    )
}
