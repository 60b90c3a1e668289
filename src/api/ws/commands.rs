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
        let names_agent = matches!(map.get("agent"), Some(Value::String(_)));
        let need = command_need(&cmd, names_agent);
        if !self.principal.may(need) {
            return Err(fail(crate::api::auth::forbidden(&self.principal, need)));
        }
        if self.principal.tenant.is_some() && command_organism_wide(&cmd, names_agent) {
            return Err(fail(crate::api::auth::tenant_forbidden()));
        }
        let scope = self.scope();
        if let Some(Value::String(a)) = map.get("agent") {
            if !scope.sees(a) {
                return Err(fail(
                    crate::pump::ControlError::UnknownListener(a.clone()).into(),
                ));
            }
        }
        let organism = self.state.inner.organism.clone();
        let mut out = Map::new();
        match (cmd.as_str(), self.ep) {
            ("subscribe", _) => {
                let spec = match map.remove("filter") {
                    Some(f) if map.is_empty() => f,
                    Some(_) => {
                        return Err(fail(ApiError::bad_request(
                            "give the filter either under `filter` or at the top level, not both",
                        )))
                    }
                    None => Value::Object(map),
                };
                let mut filter: Filter = serde_json::from_value(spec)
                    .map_err(|e| fail(ApiError::bad_request(format!("bad filter: {e}")).at("filter")))?;
                filter
                    .prepare(&organism.config().limits)
                    .map_err(|(m, at)| fail(ApiError::bad_request(m).at(at)))?;
                self.filter = filter;
                out.insert("filter".into(), json!(self.filter));
            }
            (_, Endpoint::Messages) => {
                return Err(fail(ApiError::bad_request(format!(
                    "`{cmd}` is not a command of /ws/messages (only `subscribe`); use /ws"
                ))
                .at("cmd")))
            }
            ("inject", _) => {
                let body: InjectBody = serde_json::from_value(Value::Object(map))
                    .map_err(|e| fail(ApiError::bad_request(format!("bad inject: {e}"))))?;
                self.state.limit_inject(&self.principal).map_err(fail)?;
                let seen = Seen {
                    principal: self.principal.clone(),
                    scope,
                };
                let receipt = inject(&organism, &seen, WS_IDENTITY, body).map_err(fail)?;
                out.insert("thread_id".into(), json!(receipt.thread_id));
                out.insert("message_id".into(), json!(receipt.message_id));
            }
            ("pause" | "resume", _) => {
                let pause = cmd == "pause";
                match map.get("agent") {
                    None | Some(Value::Null) => {
                        if pause {
                            organism.pause()
                        } else {
                            organism.resume()
                        }
                    }
                    Some(Value::String(a)) => {
                        let r = if pause {
                            organism.pause_listener(a)
                        } else {
                            organism.resume_listener(a)
                        };
                        r.map_err(|e| fail(e.into()))?;
                        out.insert("agent".into(), json!(a));
                    }
                    Some(_) => {
                        return Err(fail(ApiError::bad_request("`agent` must be a name").at("agent")))
                    }
                }
            }
            ("kill", _) => {
                let Some(Value::String(t)) = map.get("thread_id") else {
                    return Err(fail(
                        ApiError::bad_request("`kill` needs a `thread_id`").at("thread_id"),
                    ));
                };
                let visible = organism
                    .thread_info(t)
                    .map_err(|e| fail(e.into()))?
                    .is_some_and(|info| scope.sees_thread(&info.participants));
                if !visible {
                    return Err(fail(unknown_thread(t)));
                }
                organism.kill_thread(t).map_err(|e| fail(e.into()))?;
                out.insert("thread_id".into(), json!(t));
            }
            ("reload", _) => match map.get("agent") {
                Some(Value::String(a)) => {
                    let a = a.clone();
                    let o = organism.clone();
                    let r = tokio::task::spawn_blocking(move || o.reload_listener(&a))
                        .await
                        .map_err(|e| fail(ApiError::bad_request(e.to_string())))?;
                    r.map_err(|e| fail(e.into()))?;
                    out.insert("agent".into(), map.get("agent").cloned().unwrap_or(Value::Null));
                }
                None => {
                    let if_rev = match map.get("if_rev") {
                        None | Some(Value::Null) => None,
                        Some(v) => Some(v.as_u64().ok_or_else(|| {
                            fail(ApiError::bad_request("`if_rev` must be a revision number").at("if_rev"))
                        })?),
                    };
                    let report = reload_blocking(&organism, if_rev).await.map_err(fail)?;
                    if let Ok(Value::Object(fields)) = serde_json::to_value(report) {
                        out.extend(fields);
                    }
                }
                Some(_) => {
                    return Err(fail(ApiError::bad_request("`agent` must be a name").at("agent")))
                }
            },
            ("stop", _) => self.state.request_stop(),
            (other, _) => {
                return Err(fail(ApiError::bad_request(format!(
                    "unknown command `{other}` (known: subscribe, inject, pause, resume, kill, reload, stop)"
                ))
                .at("cmd")))
            }
        }
        Ok((request_id, cmd, out))
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
