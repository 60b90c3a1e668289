//! A session's commands: `subscribe`, and the controls its principal's role and scope allow,
//! each answered by `ack` or `error`, the controls kept in the audit log.

use super::*;

impl Session {
    pub(super) async fn command(&mut self, raw: &str) {
        let mut audited = None;
        let reply = match serde_json::from_str::<Value>(raw) {
            Ok(Value::Object(map)) => {
                audited = audited_command(&map);
                self.execute(map).await
            }
            Ok(_) | Err(_) => Err((
                Value::Null,
                String::new(),
                ApiError::bad_request("a command is a JSON object with a `cmd` field"),
            )),
        };
        if let Some((action, target)) = audited {
            let p = &self.principal;
            let result = match &reply {
                Ok(_) => "ack".to_string(),
                Err((_, _, e)) => e.status.as_u16().to_string(),
            };
            self.state
                .audit(crate::store::audit::AuditRow {
                    ts: crate::time::Timestamp::now(),
                    who: p.name.clone(),
                    role: Some(p.role.to_string()),
                    tenant: p.tenant.clone(),
                    action,
                    target: Some(target),
                    result,
                    remote: self.remote.map(|ip| ip.to_string()),
                })
                .await;
        }
        // Not the hub's latest: an answer never carries a `seq` ahead of the events this
        // connection has been offered, so a client resuming from the highest `seq` it saw
        // loses nothing.
        let seq = self.seen;
        let frame = match reply {
            Ok((request_id, cmd, mut fields)) => {
                let mut frame = json!({
                    "event": "ack",
                    "seq": seq,
                    "timestamp": Timestamp::now(),
                    "request_id": request_id,
                    "cmd": cmd,
                });
                if let Some(obj) = frame.as_object_mut() {
                    obj.append(&mut fields);
                }
                frame
            }
            Err((request_id, cmd, e)) => json!({
                "event": "error",
                "seq": seq,
                "timestamp": Timestamp::now(),
                "request_id": request_id,
                "cmd": cmd,
                "status": e.status.as_u16(),
                "code": e.body.code,
                "error": e.body.message,
                "details": e.body.details,
                "where": e.body.location,
            }),
        };
        self.control(frame);
    }

    /// Runs one command. Ok: the ack's extra fields. Err: the error, with the request id.
    /// The command is read into what it does first ([`Command`]); its rule in the one
    /// table (`auth::policy::TABLE`) is looked up by that, and the same value is executed.
    pub(super) async fn execute(
        &mut self,
        mut map: Map<String, Value>,
    ) -> Result<(Value, String, Map<String, Value>), (Value, String, ApiError)> {
        let request_id = map.remove("request_id").unwrap_or(Value::Null);
        let cmd = match map.remove("cmd") {
            Some(Value::String(c)) => c,
            _ => {
                return Err((
                    request_id,
                    String::new(),
                    ApiError::bad_request("a command needs a `cmd` string").at("cmd"),
                ))
            }
        };
        let fail = |e: ApiError| (request_id.clone(), cmd.clone(), e);
        if let Some(least) = command_least(&cmd).filter(|r| !self.principal.may(*r)) {
            return Err(fail(crate::api::auth::forbidden(&self.principal, least)));
        }
        let command = Command::read(&cmd, map).map_err(fail)?;
        let Some(rule) = command_rule(&cmd, command.on()) else {
            return Err(fail(unknown_command(&cmd)));
        };
        if let Need::Role(need) = rule.need {
            if !self.principal.may(need) {
                return Err(fail(crate::api::auth::forbidden(&self.principal, need)));
            }
        }
        if self.principal.tenant.is_some() && rule.organism_wide {
            return Err(fail(crate::api::auth::tenant_forbidden()));
        }
        let scope = self.scope();
        if let Some(a) = command.agent() {
            if !scope.sees(a) {
                return Err(fail(
                    crate::pump::ControlError::UnknownListener(a.to_string()).into(),
                ));
            }
        }
        if self.ep == Endpoint::Messages && !matches!(command, Command::Subscribe(_)) {
            return Err(fail(
                ApiError::bad_request(format!(
                    "`{cmd}` is not a command of /ws/messages (only `subscribe`); use /ws"
                ))
                .at("cmd"),
            ));
        }
        let organism = self.state.inner.organism.clone();
        let mut out = Map::new();
        match command {
            Command::Subscribe(spec) => {
                let mut filter: Filter = serde_json::from_value(spec).map_err(|e| {
                    fail(ApiError::bad_request(format!("bad filter: {e}")).at("filter"))
                })?;
                filter
                    .prepare(&organism.config().limits)
                    .map_err(|(m, at)| fail(ApiError::bad_request(m).at(at)))?;
                self.filter = filter;
                out.insert("filter".into(), json!(self.filter));
            }
            Command::Inject(body) => {
                self.state.limit_inject(&self.principal).map_err(fail)?;
                let seen = Seen {
                    principal: self.principal.clone(),
                    scope,
                };
                let receipt = inject(&organism, &seen, WS_IDENTITY, *body).map_err(fail)?;
                out.insert("thread_id".into(), json!(receipt.thread_id));
                out.insert("message_id".into(), json!(receipt.message_id));
            }
            Command::Pause(None) => organism.control().pause(),
            Command::Resume(None) => organism.control().resume(),
            Command::Pause(Some(a)) | Command::Resume(Some(a)) => {
                let r = if cmd == "pause" {
                    organism.control().pause_listener(&a)
                } else {
                    organism.control().resume_listener(&a)
                };
                r.map_err(|e| fail(e.into()))?;
                out.insert("agent".into(), json!(a));
            }
            Command::Kill(t) => {
                let visible = organism
                    .history()
                    .thread_info(&t)
                    .map_err(|e| fail(e.into()))?
                    .is_some_and(|info| scope.sees_thread(&info.participants));
                if !visible {
                    return Err(fail(unknown_thread(&t)));
                }
                organism
                    .control()
                    .kill_thread(&t)
                    .map_err(|e| fail(e.into()))?;
                out.insert("thread_id".into(), json!(t));
            }
            Command::ReloadAgent(a) => {
                let o = organism.clone();
                let name = a.clone();
                let r = tokio::task::spawn_blocking(move || o.control().reload_listener(&name))
                    .await
                    .map_err(|e| fail(ApiError::bad_request(e.to_string())))?;
                r.map_err(|e| fail(e.into()))?;
                out.insert("agent".into(), json!(a));
            }
            Command::Reload { if_rev } => {
                let report = reload_blocking(&organism, if_rev).await.map_err(fail)?;
                if let Ok(Value::Object(fields)) = serde_json::to_value(report) {
                    out.extend(fields);
                }
            }
            Command::Stop => self.state.request_stop(),
        }
        Ok((request_id, cmd, out))
    }
}

fn unknown_command(cmd: &str) -> ApiError {
    ApiError::bad_request(format!(
        "unknown command `{cmd}` (known: subscribe, inject, pause, resume, kill, reload, stop)"
    ))
    .at("cmd")
}

/// A `/ws` command as what it does, read from its frame before anything is checked.
enum Command {
    Subscribe(Value),
    Inject(Box<InjectBody>),
    /// `None`: the organism.
    Pause(Option<String>),
    Resume(Option<String>),
    ReloadAgent(String),
    Reload {
        if_rev: Option<u64>,
    },
    Kill(String),
    Stop,
}

impl Command {
    fn read(cmd: &str, mut map: Map<String, Value>) -> Result<Command, ApiError> {
        let agent = |map: &Map<String, Value>| match map.get("agent") {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(a)) => Ok(Some(a.clone())),
            Some(_) => Err(ApiError::bad_request("`agent` must be a name").at("agent")),
        };
        Ok(match cmd {
            "subscribe" => Command::Subscribe(match map.remove("filter") {
                Some(f) if map.is_empty() => f,
                Some(_) => {
                    return Err(ApiError::bad_request(
                        "give the filter either under `filter` or at the top level, not both",
                    ))
                }
                None => Value::Object(map),
            }),
            "inject" => Command::Inject(Box::new(
                serde_json::from_value(Value::Object(map))
                    .map_err(|e| ApiError::bad_request(format!("bad inject: {e}")))?,
            )),
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
            "stop" => Command::Stop,
            _ => return Err(unknown_command(cmd)),
        })
    }

    /// What it acts on, by which its rule is found.
    fn on(&self) -> On {
        match self {
            Command::Subscribe(_) => On::Session,
            Command::Inject(_) | Command::ReloadAgent(_) => On::Agent,
            Command::Pause(a) | Command::Resume(a) if a.is_some() => On::Agent,
            Command::Kill(_) => On::Thread,
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

/// The audit entry's action and target of a `/ws` control command (`None` for `subscribe`,
/// `inject` and anything unknown).
fn audited_command(map: &Map<String, Value>) -> Option<(String, String)> {
    let cmd = map.get("cmd")?.as_str()?;
    if !matches!(cmd, "pause" | "resume" | "reload" | "kill" | "stop") {
        return None;
    }
    let named = |k: &str| map.get(k).and_then(Value::as_str).map(str::to_string);
    let target = named("agent")
        .or_else(|| named("thread_id"))
        .unwrap_or_else(|| "organism".into());
    Some((format!("ws {cmd}"), target))
}
