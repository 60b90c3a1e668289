//! `agentserver agents …` and `agentserver scripts …`: the API's agents, script versions and
//! deployments from the command line, for handler authors (README "For tenants"). Each
//! command is one request (two for `rollback`) and prints a line or two for people; `--json`
//! prints the server's answer instead.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::{ClientError, Remote};

#[derive(clap::Subcommand, Debug)]
pub enum AgentsCommand {
    /// Create a Lua agent from a JSON file of its fields (`name`, `description`, `fields`
    /// or `xsd`, `accepts`, `peers`, `config`, `limits`, …); `--script` gives its Lua.
    Create {
        spec: PathBuf,
        /// The script of version 1 (else `script` in the JSON file).
        #[arg(long)]
        script: Option<PathBuf>,
    },
    /// Remove an agent created through the API.
    Delete { name: String },
}

#[derive(clap::Subcommand, Debug)]
pub enum ScriptsCommand {
    /// Upload a new version of an agent's script (kept, not live until deployed).
    Push {
        name: String,
        script: PathBuf,
        /// A note on the version.
        #[arg(long, short)]
        message: Option<String>,
        /// New payload types: a JSON file of the DSL `fields`.
        #[arg(long)]
        fields: Option<PathBuf>,
        /// A new `config` block: a JSON file.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Test cases to keep with the version (a JSON list, as `scripts test` takes);
        /// a deploy runs them first.
        #[arg(long)]
        cases: Option<PathBuf>,
        /// Check the version and run its cases; keep nothing.
        #[arg(long)]
        dry_run: bool,
        /// The file is a `kind: llm` agent's system prompt, not a Lua script.
        #[arg(long)]
        prompt: bool,
    },
    /// Run test cases (a JSON list of `{payload, payload_type?, expect?}`) through a
    /// version, apart from the running organism; exit 1 if any fails.
    Test {
        name: String,
        version: u64,
        cases: PathBuf,
    },
    /// List an agent's versions, newest first; the live one is marked.
    List { name: String },
    /// Print one version's script.
    Show { name: String, version: u64 },
    /// Make a version live.
    Deploy {
        name: String,
        version: u64,
        /// Only if the running config is this revision.
        #[arg(long)]
        if_rev: Option<u64>,
        /// Deploy even if the version's kept test cases fail.
        #[arg(long)]
        force: bool,
    },
    /// Make the newest version older than the live one live again.
    Rollback { name: String },
    /// The agent's deployment history, newest first.
    History { name: String },
}

/// Why a command failed, and its exit code: 2 for what the user gave (a file that cannot be
/// read), 1 for what the server said or could not be reached.
pub struct Failed {
    pub code: u8,
    pub message: String,
    /// What still goes to stdout (a test report whose verdict is a failure).
    pub report: Option<String>,
}

impl From<ClientError> for Failed {
    fn from(e: ClientError) -> Self {
        let message = match &e {
            ClientError::Refused { status, body } => refusal(*status, body),
            _ => e.to_string(),
        };
        Failed {
            code: 1,
            message,
            report: None,
        }
    }
}

/// The server's error JSON as lines: `refused (422 invalid_agent): message`, then each
/// detail.
fn refusal(status: u16, body: &str) -> String {
    let Ok(v) = serde_json::from_str::<Value>(body) else {
        return format!("the server answered {status}: {body}");
    };
    let e = &v["error"];
    let mut text = format!(
        "refused ({status} {}): {}",
        e["code"].as_str().unwrap_or("?"),
        e["message"].as_str().unwrap_or(body)
    );
    for d in e["details"].as_array().into_iter().flatten() {
        text.push_str("\n  ");
        text.push_str(d.as_str().unwrap_or_default());
    }
    text
}

pub(super) fn read(path: &Path) -> Result<String, Failed> {
    std::fs::read_to_string(path).map_err(|e| Failed {
        code: 2,
        message: format!("cannot read {}: {e}", path.display()),
        report: None,
    })
}

fn read_json(path: &Path) -> Result<Value, Failed> {
    serde_json::from_str(&read(path)?).map_err(|e| Failed {
        code: 2,
        message: format!("{} is not JSON: {e}", path.display()),
        report: None,
    })
}

/// A cases file: a list of cases, or the test route's own body `{"cases": [...]}`.
fn read_cases(path: &Path) -> Result<Value, Failed> {
    match read_json(path)? {
        Value::Array(cases) => Ok(Value::Array(cases)),
        Value::Object(mut body) if body.len() == 1 && body.contains_key("cases") => {
            Ok(body.remove("cases").unwrap_or_default())
        }
        _ => Err(Failed {
            code: 2,
            message: format!(
                "{}: expected a list of cases, or {{\"cases\": [...]}}, each {{\"payload\": …, \"expect\"?: …}}",
                path.display()
            ),
            report: None,
        }),
    }
}

/// A refusal about what `path` holds, said with the file's name.
fn about_file(path: &Path) -> impl Fn(ClientError) -> Failed + '_ {
    move |e| {
        let mut f = Failed::from(e);
        if f.message.starts_with("refused (400") || f.message.starts_with("refused (422") {
            f.message = format!("{}: {}", path.display(), f.message);
        }
        f
    }
}

/// The server's words for a JSON field, as this command's flag.
fn as_flags(f: Failed) -> Failed {
    Failed {
        message: f
            .message
            .replace("deploy with `force: true`", "deploy with --force")
            .replace("`if_rev`", "--if-rev"),
        ..f
    }
}

/// `v3` and what happened to the live version, for people.
fn change_line(v: &Value) -> String {
    let agent = v["agent"].as_str().unwrap_or("?");
    let rev = &v["reload"]["rev"];
    match (v["version"].as_u64(), v["from_version"].as_u64()) {
        (Some(to), Some(from)) => format!("{agent}: v{to} live (was v{from}); config rev {rev}"),
        (Some(to), None) => format!("{agent}: created, v{to} live; config rev {rev}"),
        (None, Some(from)) => format!("{agent}: deleted (was v{from}); config rev {rev}"),
        (None, None) => format!("{agent}: config rev {rev}"),
    }
}

/// A test report, one line per case and a total: `case 0: pass completed (1.2 ms, cpu 0.9
/// ms, 48 kB)`, then what
/// did not match.
fn report_text(r: &Value) -> String {
    let mut lines = Vec::new();
    for (i, c) in r["cases"].as_array().into_iter().flatten().enumerate() {
        let cost = match (c["cpu_ms"].as_f64(), c["memory_bytes"].as_u64()) {
            (Some(cpu), Some(bytes)) => format!(", cpu {cpu:.1} ms, {} kB", bytes / 1024),
            _ => String::new(),
        };
        lines.push(format!(
            "case {i}: {} {} ({:.1} ms{cost})",
            if c["pass"] == true { "pass" } else { "FAIL" },
            c["status"].as_str().unwrap_or("?"),
            c["elapsed_ms"].as_f64().unwrap_or(0.0)
        ));
        if let Some(e) = c["error"].as_str() {
            lines.push(format!("  error: {e}"));
        }
        for m in c["mismatches"].as_array().into_iter().flatten() {
            lines.push(format!("  {}", m.as_str().unwrap_or_default()));
        }
    }
    lines.push(format!("{} passed, {} failed", r["passed"], r["failed"]));
    lines.join("\n")
}

/// One line per item of a page (`{items, …}`).
fn item_lines(page: &Value, line: impl Fn(&Value) -> String) -> String {
    let lines: Vec<String> = page["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(line)
        .collect();
    lines.join("\n")
}

fn version_line(v: &Value) -> String {
    format!(
        "v{:<4} {:<5} {}  {:<16} {}  {}",
        v["version"],
        if v["live"] == true { "live" } else { "" },
        v["created"].as_str().unwrap_or(""),
        v["author"].as_str().unwrap_or("-"),
        v["sha256"].as_str().unwrap_or("").get(..12).unwrap_or(""),
        v["message"].as_str().unwrap_or("")
    )
}

pub(super) fn path_part(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Runs one `agents` command; what to print.
pub async fn agents(remote: &Remote, cmd: AgentsCommand, json: bool) -> Result<String, Failed> {
    let answer = match cmd {
        AgentsCommand::Create { spec, script } => {
            let mut body = read_json(&spec)?;
            if let Some(s) = script {
                body["script"] = Value::String(read(&s)?);
            }
            remote.call("POST", "/api/v1/agents", Some(body)).await?
        }
        AgentsCommand::Delete { name } => {
            let path = format!("/api/v1/agents/{}", path_part(&name));
            remote.call("DELETE", &path, None).await?
        }
    };
    Ok(if json {
        answer.to_string()
    } else {
        change_line(&answer)
    })
}

/// Runs one `scripts` command; what to print.
pub async fn scripts(remote: &Remote, cmd: ScriptsCommand, json: bool) -> Result<String, Failed> {
    match cmd {
        ScriptsCommand::Push {
            name,
            script,
            message,
            fields,
            config,
            cases,
            dry_run,
            prompt,
        } => {
            let key = if prompt { "system" } else { "script" };
            let mut body = json!({ key: read(&script)? });
            if let Some(c) = &cases {
                body["cases"] = read_cases(c)?;
            }
            if let Some(m) = message {
                body["message"] = m.into();
            }
            if let Some(f) = fields {
                body["fields"] = read_json(&f)?;
            }
            if let Some(c) = config {
                body["config"] = read_json(&c)?;
            }
            push(remote, &name, body, dry_run, json).await
        }
        ScriptsCommand::List { name } => {
            let v = remote
                .call("GET", &format!("{}/scripts?limit=1000", base(&name)), None)
                .await?;
            Ok(if json {
                v.to_string()
            } else {
                item_lines(&v, version_line)
            })
        }
        ScriptsCommand::Show { name, version } => {
            let v = remote
                .call("GET", &format!("{}/scripts/{version}", base(&name)), None)
                .await?;
            Ok(if json {
                v.to_string()
            } else {
                v["script"]
                    .as_str()
                    .unwrap_or_default()
                    .trim_end()
                    .to_string()
            })
        }
        ScriptsCommand::Test {
            name,
            version,
            cases,
        } => {
            let body = json!({"cases": read_cases(&cases)?});
            let path = format!("{}/scripts/{version}/test", base(&name));
            let v = remote
                .call("POST", &path, Some(body))
                .await
                .map_err(about_file(&cases))?;
            let text = if json { v.to_string() } else { report_text(&v) };
            let failed = v["failed"].as_u64().unwrap_or(0);
            if failed > 0 {
                // The report goes to stdout whatever the verdict; the exit code says it.
                return Err(Failed {
                    code: 1,
                    message: format!("{failed} case(s) of {} failed", cases.display()),
                    report: Some(text),
                });
            }
            Ok(text)
        }
        ScriptsCommand::Deploy {
            name,
            version,
            if_rev,
            force,
        } => {
            let body = json!({"version": version, "if_rev": if_rev, "force": force});
            let v = remote
                .call("POST", &format!("{}/deployments", base(&name)), Some(body))
                .await
                .map_err(|e| as_flags(e.into()))?;
            Ok(if json { v.to_string() } else { change_line(&v) })
        }
        ScriptsCommand::Rollback { name } => rollback(remote, &name, json).await,
        ScriptsCommand::History { name } => {
            let v = remote
                .call(
                    "GET",
                    &format!("{}/deployments?limit=1000", base(&name)),
                    None,
                )
                .await?;
            Ok(if json {
                v.to_string()
            } else {
                item_lines(&v, |d| {
                    format!(
                        "{}  {:<8} {} -> {}  {}",
                        d["time"].as_str().unwrap_or(""),
                        d["action"].as_str().unwrap_or(""),
                        d["from_version"]
                            .as_u64()
                            .map_or("-".into(), |v| format!("v{v}")),
                        d["version"]
                            .as_u64()
                            .map_or("-".into(), |v| format!("v{v}")),
                        d["author"].as_str().unwrap_or("-")
                    )
                })
            })
        }
    }
}

/// `/api/v1/agents/NAME`, the name as a path segment.
fn base(name: &str) -> String {
    format!("/api/v1/agents/{}", path_part(name))
}

/// `scripts push`: a new version kept (not live); with `--dry-run`, built and tested only.
async fn push(
    remote: &Remote,
    name: &str,
    body: Value,
    dry_run: bool,
    json: bool,
) -> Result<String, Failed> {
    if dry_run {
        let v = remote
            .call(
                "POST",
                &format!("{}/scripts?dry_run=true", base(name)),
                Some(body),
            )
            .await?;
        let report = &v["tests"];
        if json {
            return Ok(v.to_string());
        }
        let mut text = format!(
            "{name}: v{} would be kept (sha256 {}); nothing was kept",
            v["version"]["version"],
            v["version"]["sha256"]
                .as_str()
                .unwrap_or("")
                .get(..12)
                .unwrap_or("")
        );
        if !report.is_null() {
            text.push('\n');
            text.push_str(&report_text(report));
            let failed = report["failed"].as_u64().unwrap_or(0);
            if failed > 0 {
                return Err(Failed {
                    code: 1,
                    message: format!("{failed} of the version's cases failed"),
                    report: Some(text),
                });
            }
        }
        return Ok(text);
    }
    let v = remote
        .call("POST", &format!("{}/scripts", base(name)), Some(body))
        .await?;
    Ok(if json {
        v.to_string()
    } else {
        format!(
            "{name}: v{} kept (sha256 {}), not live; to deploy it: agentserver scripts deploy {name} {}",
            v["version"],
            v["sha256"].as_str().unwrap_or("").get(..12).unwrap_or(""),
            v["version"]
        )
    })
}

/// `scripts rollback`: the newest version older than the live one, deployed.
async fn rollback(remote: &Remote, name: &str, json: bool) -> Result<String, Failed> {
    let list = remote
        .call("GET", &format!("{}/scripts?limit=1000", base(name)), None)
        .await?;
    let items = list["items"].as_array().cloned().unwrap_or_default();
    let live = items
        .iter()
        .find(|v| v["live"] == true)
        .and_then(|v| v["version"].as_u64());
    let previous = items
        .iter()
        .filter_map(|v| v["version"].as_u64())
        .filter(|v| live.is_some_and(|l| *v < l))
        .max()
        .ok_or_else(|| Failed {
            code: 1,
            report: None,
            message: format!(
                "{name} has no version older than the live one (v{}) to roll back to",
                live.unwrap_or(0)
            ),
        })?;
    let body = json!({"version": previous});
    let v = remote
        .call("POST", &format!("{}/deployments", base(name)), Some(body))
        .await?;
    Ok(if json { v.to_string() } else { change_line(&v) })
}
