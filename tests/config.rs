//! Organism files: every problem is reported with the file, the listener and the key, and
//! `agentserver validate` exits 1 listing them all.

use std::ffi::OsStr;

use agentserver::config::{load_file, ConfigError, Known};

mod child;

/// What loading checks against: these native handler names and the Lua compiler.
fn known<'a>(handlers: &'a [&'a str]) -> Known<'a> {
    Known {
        handlers,
        check_script: agentserver::lua::check_syntax,
    }
}

const XSD: &str = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
  <xs:element name="A" type="xs:string"/><xs:element name="B" type="xs:string"/></xs:schema>"#;

fn write(yaml: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.xsd"), XSD).unwrap();
    std::fs::write(dir.path().join("broken.xsd"), "<xs:schema xmlns:xs=\"http://www.w3.org/2001/XMLSchema\"><xs:element name=\"A\" type=\"xs:nope\"/></xs:schema>").unwrap();
    let path = dir.path().join("o.yaml");
    std::fs::write(&path, yaml).unwrap();
    (dir, path)
}

fn errors(yaml: &str) -> Vec<ConfigError> {
    let (_dir, path) = write(yaml);
    load_file(&path, known(&["sink", "echo", "forward", "template"]))
        .unwrap_err()
        .0
}

fn has(errors: &[ConfigError], listener: Option<&str>, key: Option<&str>, text: &str) -> bool {
    errors.iter().any(|e| {
        e.listener.as_deref() == listener
            && e.key.as_deref() == key
            && e.message.contains(text)
            && e.file.ends_with("o.yaml")
    })
}

#[test]
fn every_problem_names_the_file_the_listener_and_the_key() {
    let errs = errors(
        r#"
organism: { name: t }
listeners:
  - { name: a, kind: native, handler: sink, schema: s.xsd, colour: red }
  - { name: b, kind: native, handler: sink, schema: s.xsd }
  - { name: c, description: bad peer, kind: native, handler: sink, schema: s.xsd, peers: [ghost] }
  - { name: d, description: agent, kind: native, handler: sink, schema: s.xsd, accepts: [A], agent: true }
  - { name: e, description: also A, kind: native, handler: sink, schema: s.xsd, accepts: [A] }
  - { name: f, description: broken xsd, kind: native, handler: sink, schema: broken.xsd }
  - { name: g, description: missing xsd, kind: native, handler: sink, schema: nowhere.xsd }
  - { name: h, description: no handler, kind: native, handler: nope, schema: s.xsd }
  - { name: i, description: narrowed wrong, kind: native, handler: sink, schema: s.xsd, accepts: [Z] }
  - { name: shouter, description: a name to mistype, kind: native, handler: sink, schema: s.xsd, accepts: [B] }
  - { name: j, description: typo, kind: native, handler: forward, schema: s.xsd, peers: [shoutr], config: { to: shuoter }, accepts: [B] }
"#,
    );
    // A name like a listener's is suggested; one like none (`ghost`) is not.
    assert!(
        has(
            &errs,
            Some("j"),
            Some("peers"),
            "`shoutr` names no listener (did you mean `shouter`?)"
        ),
        "{errs:#?}"
    );
    assert!(
        has(
            &errs,
            Some("j"),
            Some("config.to"),
            "`shuoter` names no listener (did you mean `shouter`?)"
        ),
        "{errs:#?}"
    );
    assert!(
        has(&errs, Some("a"), Some("colour"), "unknown field `colour`"),
        "{errs:#?}"
    );
    assert!(
        has(&errs, Some("b"), Some("description"), "required"),
        "{errs:#?}"
    );
    assert!(
        has(&errs, Some("c"), Some("peers"), "`ghost` names no listener"),
        "{errs:#?}"
    );
    assert!(
        has(
            &errs,
            Some("d"),
            Some("accepts"),
            "also accepted by b, c, e, h"
        ),
        "{errs:#?}"
    );
    assert!(
        has(&errs, Some("f"), Some("schema"), "does not compile"),
        "{errs:#?}"
    );
    assert!(
        has(&errs, Some("g"), Some("schema"), "file not found"),
        "{errs:#?}"
    );
    assert!(
        has(
            &errs,
            Some("h"),
            Some("handler"),
            "no native handler named `nope`"
        ),
        "{errs:#?}"
    );
    assert!(
        has(
            &errs,
            Some("i"),
            Some("accepts"),
            "`Z` is not a global element"
        ),
        "{errs:#?}"
    );
    let shown = errs
        .iter()
        .find(|e| e.listener.as_deref() == Some("c"))
        .unwrap()
        .to_string();
    assert!(
        shown.ends_with("o.yaml:6: listener `c`: key `peers`: `ghost` names no listener"),
        "{shown}"
    );
}

#[test]
fn top_level_and_section_mistakes_are_reported() {
    let errs = errors("organism: { name: t, colour: red }\nlimit: {}\nlisteners: []\n");
    assert!(has(&errs, None, Some("limit"), "unknown key"), "{errs:#?}");
    assert!(
        has(
            &errs,
            None,
            Some("organism.colour"),
            "unknown field `colour`"
        ),
        "{errs:#?}"
    );
    let errs = errors("not: [valid");
    assert!(errs[0].message.contains("not valid YAML"), "{errs:#?}");
    let errs =
        errors("organism: { name: t }\nlimits: { max_pending_messages: 0 }\nlisteners: []\n");
    assert!(
        has(
            &errs,
            None,
            Some("limits.max_pending_messages"),
            "greater than 0"
        ),
        "{errs:#?}"
    );
    let errs = errors(
        "organism: { name: t }\nlimits: { max_messages_per_thread: 4294967296 }\nlisteners: []\n",
    );
    assert!(
        has(
            &errs,
            None,
            Some("limits.max_messages_per_thread"),
            "at most 4294967295"
        ),
        "{errs:#?}"
    );
    let errs = errors("organism: { name: t, store: '' }\nlisteners: []\n");
    assert!(
        has(&errs, None, Some("organism.store"), "must not be empty"),
        "{errs:#?}"
    );
}

#[test]
fn validate_lists_every_problem_and_exits_1() {
    let (_dir, path) = write("organism: { name: t }\nlisteners:\n  - { name: a, kind: native, handler: sink, schema: s.xsd }\n  - { name: b, description: x, kind: native, handler: sink, schema: s.xsd, peers: [ghost] }\n");
    let out = child::run_to_exit([OsStr::new("validate"), path.as_os_str()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("listener `a`: key `description`"),
        "{stderr}"
    );
    assert!(stderr.contains("listener `b`: key `peers`"), "{stderr}");
    assert!(stderr.contains("2 problem(s)"), "{stderr}");
}

#[test]
fn validate_accepts_the_demo_organism() {
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/organisms/hello-world.yaml");
    let out = child::run_to_exit(["validate", demo]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn lua_listener_and_schema_dsl_mistakes_are_reported() {
    let (dir, path) = write(
        r#"
organism: { name: t }
listeners:
  - { name: a, description: missing script, kind: lua, script: nowhere.lua, schema: s.xsd }
  - { name: b, description: broken script, kind: lua, script: broken.lua, schema: s.xsd }
  - { name: c, description: handler too, kind: lua, script: ok.lua, handler: sink, schema: s.xsd }
  - { name: d, description: bad limits, kind: lua, script: ok.lua, schema: s.xsd, limits: { cpu: 5 } }
  - { name: e, description: both schemas, kind: lua, script: ok.lua, schema: s.xsd, fields: { X: { a: string } } }
  - { name: f, description: bad dsl, kind: lua, script: ok.lua, fields: { Y: { a: strng } } }
  - { name: g, description: native with a script, kind: native, handler: sink, schema: s.xsd, script: ok.lua }
  - { name: h, description: no script, kind: lua, schema: s.xsd }
"#,
    );
    std::fs::write(
        dir.path().join("broken.lua"),
        "function handle(p, m) return {",
    )
    .unwrap();
    std::fs::write(dir.path().join("ok.lua"), "function handle(p, m) end").unwrap();
    let errs = load_file(&path, known(&["sink"])).unwrap_err().0;
    for (listener, key, text) in [
        ("a", "script", "cannot read"),
        ("b", "script", "does not compile"),
        ("c", "handler", "runs its `script`"),
        ("d", "limits", "unknown field `cpu`"),
        ("e", "fields", "not both"),
        ("f", "fields", "`Y.a`: unknown type `strng`"),
        ("g", "script", "does not apply to a native listener"),
        ("h", "script", "required"),
    ] {
        assert!(
            has(&errs, Some(listener), Some(key), text),
            "{listener}/{key}: {errs:#?}"
        );
    }
}

#[test]
fn external_listener_mistakes_are_reported() {
    let (dir, path) = write(
        r#"
organism: { name: t }
listeners:
  - { name: a, description: no url, kind: external, schema: s.xsd }
  - { name: b, description: not http, kind: external, input_url: "ftp://x/in", schema: s.xsd }
  - { name: c, description: not a url, kind: external, input_url: "::", schema: s.xsd }
  - { name: d, description: unset token, kind: external, input_url: "http://127.0.0.1:9/in", token_env: AGENTSERVER_SURELY_UNSET_VAR, schema: s.xsd }
  - { name: e, description: bad reply timeout, kind: external, input_url: "http://127.0.0.1:9/in", reply_timeout: soon, schema: s.xsd }
  - { name: f, description: zero timeout, kind: external, input_url: "http://127.0.0.1:9/in", timeout_ms: 0, schema: s.xsd }
  - { name: g, description: native with a url, kind: native, handler: sink, input_url: "http://127.0.0.1:9/in", schema: s.xsd }
  - { name: h, description: fine, kind: external, input_url: "http://127.0.0.1:9/in", reply_timeout: 5m, schema: s.xsd }
"#,
    );
    std::fs::write(
        dir.path().join("s.xsd"),
        r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema"><xs:element name="N" type="xs:string"/></xs:schema>"#,
    )
    .unwrap();
    let errs = load_file(&path, known(&["sink"])).unwrap_err().0;
    for (listener, key, text) in [
        ("a", "input_url", "required"),
        ("b", "input_url", "must be an http:// or https:// URL"),
        ("c", "input_url", "not a URL"),
        (
            "d",
            "token_env",
            "`AGENTSERVER_SURELY_UNSET_VAR` is not set",
        ),
        ("e", "reply_timeout", "a duration like"),
        ("f", "timeout_ms", "at least 1"),
        ("g", "input_url", "does not apply to a native listener"),
    ] {
        assert!(
            has(&errs, Some(listener), Some(key), text),
            "{listener}.{key}: {errs:#?}"
        );
    }
    assert!(
        errs.iter().all(|e| e.listener.as_deref() != Some("h")),
        "{errs:#?}"
    );
}

#[test]
fn a_secret_written_in_the_file_is_an_error_naming_the_env_key_to_use() {
    let errs = errors(
        r#"
organism: { name: t }
listeners:
  - name: a
    description: x
    kind: native
    handler: sink
    schema: s.xsd
    config:
      passphrase: open-sesame
      db: { access_key: AKIA1 }
      headers: [{ X-Custom: "Bearer abc" }]
      max_tokens: 100
      style: plain
      password: 86753091
      api_token: true
"#,
    );
    assert!(
        has(
            &errs,
            Some("a"),
            Some("config.passphrase"),
            "`passphrase_env: VARIABLE`"
        ),
        "{errs:?}"
    );
    assert!(has(
        &errs,
        Some("a"),
        Some("config.db.access_key"),
        "environment variable"
    ));
    assert!(has(
        &errs,
        Some("a"),
        Some("config.headers[0].X-Custom"),
        "secret"
    ));
    // A literal that is not a string is a secret all the same.
    assert!(has(
        &errs,
        Some("a"),
        Some("config.password"),
        "`password_env: VARIABLE`"
    ));
    assert!(has(
        &errs,
        Some("a"),
        Some("config.api_token"),
        "`api_token_env: VARIABLE`"
    ));
    assert_eq!(errs.len(), 5, "{errs:?}");
}

#[test]
fn env_keys_in_a_handlers_config_give_it_the_value_or_an_error() {
    std::env::set_var("AGENTSERVER_CONFIG_TEST_KEY", "sk-live");
    let yaml = "organism: { name: t }\nlisteners:\n  - { name: a, description: x, kind: native, handler: sink, schema: s.xsd, config: { api_key_env: AGENTSERVER_CONFIG_TEST_KEY } }\n";
    let (_dir, path) = write(yaml);
    let config = load_file(&path, known(&["sink"])).unwrap();
    assert_eq!(config.listeners[0].config["api_key"], "sk-live");
    let errs = errors(&yaml.replace("AGENTSERVER_CONFIG_TEST_KEY", "AGENTSERVER_UNSET_9"));
    assert!(
        has(
            &errs,
            Some("a"),
            Some("config.api_key_env"),
            "`AGENTSERVER_UNSET_9` is not set"
        ),
        "{errs:?}"
    );
}

#[test]
fn allowed_origins_and_hosts_are_checked() {
    let errs = errors("organism: { name: t, allowed_origins: ['http://ok:3000', 'evil.com', 'http://x/path'], allowed_hosts: ['dash.example', 'a b'] }\nlisteners:\n  - { name: a, description: x, kind: native, handler: sink, schema: s.xsd }\n");
    assert!(
        has(&errs, None, Some("organism.allowed_origins"), "`evil.com`"),
        "{errs:?}"
    );
    assert!(has(
        &errs,
        None,
        Some("organism.allowed_origins"),
        "`http://x/path`"
    ));
    assert!(has(&errs, None, Some("organism.allowed_hosts"), "`a b`"));
    assert_eq!(errs.len(), 3, "{errs:?}");
}

#[test]
fn validate_warns_loudly_about_a_listen_address_beyond_loopback() {
    for (listen, auth, warned) in [
        ("0.0.0.0:8765", "", true),
        ("127.0.0.1:8765", "", false),
        ("[::1]:1", "", false),
        // With authentication, run serves it: nothing to warn about.
        (
            "0.0.0.0:8765",
            "auth: { methods: [keys], keys_file: k.yaml }\n",
            false,
        ),
    ] {
        let (_dir, path) = write(&format!("organism: {{ name: t, listen: '{listen}', store: memory }}\n{auth}listeners:\n  - {{ name: a, description: x, kind: native, handler: sink, schema: s.xsd }}\n"));
        let out = child::run_to_exit([OsStr::new("validate"), path.as_os_str()]);
        assert_eq!(out.status.code(), Some(0));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            stderr.contains("WARNING: the API listens on"),
            warned,
            "{listen}: {stderr}"
        );
    }
}

#[test]
fn a_mistake_in_one_listener_is_reported_once_with_its_line() {
    let errs = errors(
        "organism: { name: t }
listeners:
  - name: a
    description: first
    kind: native
    handler: forward
    schema: s.xsd
    config: { to: b }
  - name: b
    descripton: typo
    kind: native
    handler: sink
    schema: s.xsd
  - name: c
    description: third
    kind: nativ
    handler: sink
    schema: s.xsd
    peers: [b]
",
    );
    assert_eq!(errs.len(), 2, "{errs:#?}");
    assert!(
        has(&errs, Some("b"), Some("descripton"), "unknown field"),
        "{errs:#?}"
    );
    assert!(has(&errs, Some("c"), Some("kind"), "nativ"), "{errs:#?}");
    let line = |l: &str| {
        errs.iter()
            .find(|e| e.listener.as_deref() == Some(l))
            .unwrap()
            .line
    };
    assert_eq!(line("b"), Some(10));
    assert_eq!(line("c"), Some(16));
    assert!(
        errs[0].to_string().contains("o.yaml:10: listener `b`"),
        "{}",
        errs[0]
    );
}

/// The organisms the project ships (a user's own file beside them is not this test's).
const SHIPPED: [&str; 6] = [
    "approvals.yaml",
    "external-echo.yaml",
    "hello-workers.yaml",
    "hello-world.yaml",
    "lua-playground.yaml",
    "tenants.yaml",
];

#[test]
fn every_example_organism_validates() {
    let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/organisms"));
    let mut seen = 0;
    for name in SHIPPED {
        let path = dir.join(name);
        {
            // external-echo.yaml names its callback token's variable.
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentserver"))
                .arg("validate")
                .arg(&path)
                .env("ECHO_TOKEN", "example")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            seen += 1;
        }
    }
    assert_eq!(seen, SHIPPED.len());
}

#[test]
fn organism_nats_and_placement_are_checked() {
    // An external agent already runs elsewhere.
    let errs = errors(
        r#"
organism: { name: t, nats: { url: "nats://127.0.0.1:4222" } }
listeners:
  - { name: x, description: remote, kind: external, input_url: "http://127.0.0.1:9/in", schema: s.xsd, placement: workers }
"#,
    );
    assert!(
        has(
            &errs,
            Some("x"),
            Some("placement"),
            "is for `lua` and `native`"
        ),
        "{errs:?}"
    );

    // Placed without a NATS server to reach workers through.
    let errs = errors(
        r#"
organism: { name: t }
listeners:
  - { name: w, description: on workers, kind: native, handler: sink, schema: s.xsd, placement: workers }
"#,
    );
    assert!(
        has(&errs, Some("w"), Some("placement"), "needs `organism.nats`"),
        "{errs:?}"
    );

    // Every key of organism.nats, each wrong.
    let errs = errors(
        r#"
organism:
  name: t
  nats:
    url: "nats://user:secret@127.0.0.1:4222, http://elsewhere"
    stream_prefix: "has.dots"
    credentials_env: AGENTSERVER_TEST_UNSET_NATS_CREDENTIAL
    ack_wait_ms: 0
    deliver_timeout_ms: 0
    max_deliver: 0
    events_max_bytes: 10
    events_max_age: soon
listeners:
  - { name: w, description: on workers, kind: native, handler: sink, schema: s.xsd, placement: workers }
"#,
    );
    let url = Some("organism.nats.url");
    assert!(has(&errs, None, url, "holds a credential"), "{errs:?}");
    assert!(
        has(
            &errs,
            None,
            url,
            "`http://elsewhere` is not a URL like nats://"
        ),
        "{errs:?}"
    );
    assert!(
        has(
            &errs,
            None,
            Some("organism.nats.stream_prefix"),
            "letters, digits"
        ),
        "{errs:?}"
    );
    assert!(
        has(
            &errs,
            None,
            Some("organism.nats.credentials_env"),
            "`AGENTSERVER_TEST_UNSET_NATS_CREDENTIAL` is not set"
        ),
        "{errs:?}"
    );
    for key in [
        "organism.nats.ack_wait_ms",
        "organism.nats.deliver_timeout_ms",
        "organism.nats.max_deliver",
    ] {
        assert!(has(&errs, None, Some(key), "at least 1"), "{key}: {errs:?}");
    }
    assert!(
        has(
            &errs,
            None,
            Some("organism.nats.events_max_bytes"),
            "at least 1048576"
        ),
        "{errs:?}"
    );
    assert!(
        has(
            &errs,
            None,
            Some("organism.nats.events_max_age"),
            "`soon` is not a duration"
        ),
        "{errs:?}"
    );
}

/// `validate` refuses what `run` would: a native handler's own `config` (a template with no
/// `output`) and `organism.tls` files that hold no certificate, each with file, line and key.
#[test]
fn validate_checks_native_configs_and_tls_files_with_their_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("o.yaml");
    let run = |yaml: &str| {
        std::fs::write(&path, yaml).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentserver"))
            .arg("validate")
            .arg(&path)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let listener = "listeners:\n  - name: t\n    description: fills\n    kind: native\n    handler: template\n    fields: {Note: {text: string}}\n";
    let (code, said) = run(&format!(
        "organism: {{name: v, store: memory}}\n{listener}    config: {{to: t}}\n"
    ));
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains(
            "o.yaml:8: listener `t`: key `config`: the template handler needs `config.output`"
        ),
        "{said}"
    );
    std::fs::write(dir.path().join("cert.pem"), "").unwrap();
    std::fs::write(dir.path().join("key.pem"), "").unwrap();
    let (code, said) = run(&format!(
        "organism:\n  name: v\n  store: memory\n  tls: {{cert: cert.pem, key: key.pem}}\n{listener}    config: {{output: '<Note><text>{{text}}</text></Note>'}}\n"
    ));
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains("o.yaml:4: key `tls`: organism.tls.cert") && said.contains("no certificate"),
        "{said}"
    );
}

/// A value of the wrong type is named by its own line and key, in a user's words, and a
/// schema that does not load is reported once (not again as "not a global element").
#[test]
fn a_wrong_value_names_its_line_and_key_in_a_users_words() {
    let errs = errors(
        "organism:\n  name: t\n  listen: 8765\nlisteners:\n  - name: a\n    description: x\n    kind: native\n    handler: sink\n    schema: s.xsd\n    concurrency: two\n  - name: b\n    description: y\n    kind: native\n    handler: sink\n    schema: missing.xsd\n    accepts: [Z]\n",
    );
    let shown: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
    assert!(
        shown.iter().any(|e| e.ends_with(
            "o.yaml:3: key `organism.listen`: is the number 8765; it must be a string such as 127.0.0.1:8765 (quote it)"
        )),
        "{shown:#?}"
    );
    assert!(
        shown.iter().any(|e| e.ends_with(
            "o.yaml:10: listener `a`: key `concurrency`: is the text \"two\"; it must be a whole number"
        )),
        "{shown:#?}"
    );
    assert!(
        has(&errs, Some("b"), Some("schema"), "file not found"),
        "{shown:#?}"
    );
    assert!(
        !shown.iter().any(|e| e.contains("not a global element")),
        "{shown:#?}"
    );
}

/// An approval gate's mistakes, each named by its key and line.
#[test]
fn approval_gates_are_checked_key_by_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), XSD).unwrap();
    let gate = |approval: &str| {
        let path = dir.path().join("o.yaml");
        std::fs::write(
            &path,
            format!(
                "organism: {{name: g, store: memory}}\nlisteners:\n  - name: pay\n    description: d\n    kind: native\n    handler: sink\n    schema: t.xsd\n    accepts: [A]\n    approval: {approval}\n"
            ),
        )
        .unwrap();
        match agentserver::Organism::builder().load_config(&path) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    };
    assert_eq!(gate("{}"), "");
    assert_eq!(gate("{types: [A], timeout: 30m, on_timeout: approve}"), "");
    for (approval, key, says) in [
        (
            "{types: [B]}",
            "approval.types",
            "not a type this listener accepts",
        ),
        ("{timeout: 0}", "approval.timeout", "greater than 0"),
        ("{timeout: forever}", "approval.timeout", "a duration"),
        ("{timeout: 400d}", "approval.timeout", "at most 366d"),
        ("{allow: []}", "approval.allow", "at least one"),
        (
            "{approvers: {role: viewer}}",
            "approval.approvers.role",
            "operator",
        ),
        ("{from: []}", "approval.from", "holds nothing"),
        ("{notify: {url: x}}", "approval.notify.url", "not a URL"),
        (
            "{notify: {url: 'ftp://h/x'}}",
            "approval.notify.url",
            "http://",
        ),
        (
            "{notify: {url: 'http://h/x', secret_env: CONFIG_TEST_UNSET_VARIABLE}}",
            "approval.notify.secret_env",
            "CONFIG_TEST_UNSET_VARIABLE",
        ),
        (
            "{escalate_to: x}",
            "approval.escalate_to",
            "on_timeout: escalate",
        ),
        (
            "{on_timeout: escalate}",
            "approval.escalate_to",
            "needs `escalate_to`",
        ),
        (
            "{on_timeout: escalate, escalate_to: pay}",
            "approval.escalate_to",
            "not a `kind: human` listener",
        ),
        ("{on_timeout: later}", "approval", "later"),
    ] {
        let e = gate(approval);
        assert!(e.contains(key) && e.contains(says), "{approval}: {e}");
    }
}

/// A `kind: human` listener's mistakes: a handler, a place on workers, a bad timeout; and
/// `approvers` on any other kind.
#[test]
fn human_listeners_are_checked_key_by_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), XSD).unwrap();
    let check = |listener: &str| {
        let path = dir.path().join("o.yaml");
        std::fs::write(
            &path,
            format!("organism: {{name: h, store: memory}}\nlisteners:\n  - {{name: r, description: d, schema: t.xsd, accepts: [A], {listener}}}\n"),
        )
        .unwrap();
        match agentserver::Organism::builder().load_config(&path) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    };
    assert_eq!(check("kind: human"), "");
    assert_eq!(
        check("kind: human, reply_timeout: 2h, approvers: {role: admin, keys: [alice]}"),
        ""
    );
    for (listener, key, says) in [
        ("kind: human, handler: sink", "handler", "a person"),
        (
            "kind: human, placement: workers",
            "placement",
            "cannot be placed on workers",
        ),
        (
            "kind: human, reply_timeout: never",
            "reply_timeout",
            "a duration",
        ),
        (
            "kind: human, approvers: {role: viewer}",
            "approvers.role",
            "operator",
        ),
        (
            "kind: human, script: x.lua",
            "script",
            "does not apply to a human listener",
        ),
        (
            "kind: native, handler: sink, approvers: {role: admin}",
            "approvers",
            "kind: human",
        ),
    ] {
        let e = check(listener);
        assert!(e.contains(key) && e.contains(says), "{listener}: {e}");
    }
}

/// An XSD of the organism's file with a slow pattern loads (the operator's choice), but
/// `validate` warns of it once, naming every listener it serves; the shipped examples hold
/// none.
#[test]
fn validate_warns_of_a_slow_pattern_in_the_files_schemas() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("s.xsd"),
        r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
  <xs:element name="Note"><xs:simpleType><xs:restriction base="xs:string">
    <xs:pattern value="(\w+\s?){1,100}c"/>
  </xs:restriction></xs:simpleType></xs:element>
</xs:schema>"#,
    )
    .unwrap();
    let path = dir.path().join("o.yaml");
    std::fs::write(
        &path,
        "organism: {name: v, store: memory}\nlisteners:\n  - {name: a, description: one, kind: native, handler: sink, schema: s.xsd}\n  - {name: b, description: two, kind: native, handler: sink, schema: s.xsd}\n",
    )
    .unwrap();
    let validate = |path: &std::path::Path| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentserver"))
            .arg("validate")
            .arg(path)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, said) = validate(&path);
    assert_eq!(code, Some(0), "{said}");
    let warnings: Vec<&str> = said.lines().filter(|l| l.starts_with("WARNING")).collect();
    assert_eq!(warnings.len(), 1, "{said}");
    assert!(
        warnings[0].contains(r"s.xsd holds the pattern `(\w+\s?){1,100}c` (listeners a, b)"),
        "{said}"
    );
    let examples = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/organisms"));
    for name in ["hello-world.yaml", "tenants.yaml", "approvals.yaml"] {
        let (code, said) = validate(&examples.join(name));
        assert_eq!(code, Some(0), "{name}: {said}");
        assert!(!said.contains("WARNING"), "{name}: {said}");
    }
}

/// A file the YAML reader would take minutes over (its time grows with the square of how
/// deep `[` and `{` nest: yaml/yaml-serde#1) is refused at once, naming the line; one too
/// large to be an organism is refused before it is read whole. Brackets are counted as bytes
/// (in strings too), against twice the depth a file can nest and still be read: a hundred
/// unmatched in a description are no reason to refuse a file.
#[test]
fn a_file_nested_too_deep_or_too_large_is_refused_at_once() {
    let deep = format!(
        "organism: {{name: d, listen: \"127.0.0.1:0\"}}\nlisteners:\n  - {}{}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let e = errors(&deep);
    assert!(
        has(
            &e,
            None,
            None,
            "`[` and `{` nest deeper than 256 levels at line 3"
        ),
        "{e:?}"
    );

    let (_dir, path) = write("organism: {name: big, listen: \"127.0.0.1:0\"}\nlisteners: []\n");
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(&format!("# {}\n", "x".repeat(4 << 20)));
    std::fs::write(&path, text).unwrap();
    let e = load_file(&path, known(&["sink"])).unwrap_err().0;
    assert!(
        e.iter().any(|e| e
            .message
            .contains("over 4 MiB, the most an organism file may hold")),
        "{e:?}"
    );

    let brackets = "[{".repeat(50);
    let ok = format!(
        "organism: {{name: b, listen: \"127.0.0.1:0\"}}\nlisteners:\n  - {{name: a, description: \"{brackets}\", kind: native, handler: sink, schema: s.xsd}}\n  - name: b\n    description: a plain scalar {brackets} too\n    kind: native\n    handler: sink\n    schema: s.xsd\n"
    );
    let (_dir, path) = write(&ok);
    let config = load_file(&path, known(&["sink"]));
    assert!(config.is_ok(), "{:?}", config.err());
}
