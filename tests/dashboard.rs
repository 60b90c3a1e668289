//! The dashboard in a real headless Chromium against a real server on 127.0.0.1:0: what it
//! shows comes from the public API, its controls act through it, and it hides what the
//! credential's role may not do.

#[path = "browser/mod.rs"]
mod browser;
mod common;

use agentserver::access::Role;
use agentserver::api::{ApiOptions, ApiServer};
use agentserver::events::AgentState;
use agentserver::Organism;
use browser::Chromium;
use common::*;
use serde_json::json;

const LISTENERS: &str = "  - { name: a, description: forwards pings, kind: native, handler: forward, schema: t.xsd, accepts: [Ping], peers: [b], config: { to: b } }
  - { name: b, description: keeps pings, kind: native, handler: sink, schema: t.xsd, accepts: [Ping] }";

async fn serve(o: &Organism) -> (ApiServer, String) {
    let server = ApiServer::bind(o.clone(), "127.0.0.1:0", ApiOptions::default())
        .await
        .unwrap();
    let base = format!("http://{}", server.local_addr());
    (server, base)
}

/// Adds a listener (a YAML item) to the organism file in `dir`, for the next reload.
fn add_to_file(dir: &std::path::Path, item: &str) {
    let path = dir.join("organism.yaml");
    let yaml = std::fs::read_to_string(&path).unwrap() + item + "\n";
    std::fs::write(path, yaml).unwrap();
}

/// Waits until the page's stream is live.
async fn until_live(c: &mut Chromium) {
    c.wait(
        "$('connection-state').textContent === 'live'",
        "the stream to be live",
    )
    .await;
}

/// Keeps what the page looks like at the end of a test, as `target/tmp/<name>.png`.
async fn keep_screenshot(c: &mut Chromium, name: &str) {
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.png"));
    c.screenshot(&shot).await;
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000);
}

fn state_of(o: &Organism, name: &str) -> AgentState {
    o.agents()
        .into_iter()
        .find(|a| a.name == name)
        .unwrap()
        .state
}

/// The visible controls smaller than 24 × 24 px, as `tag#id text`.
const SMALL_TARGETS: &str = "[...document.querySelectorAll('button, input, select, summary')]
    .filter(e => e.offsetParent !== null)
    .filter(e => { const r = e.getBoundingClientRect(); return r.width < 24 || r.height < 24; })
    .map(e => `${e.tagName}#${e.id} ${e.textContent.slice(0, 30)}`)";

/// Rows of the message log that belong to `thread`.
fn rows_of(thread: &str) -> String {
    format!(
        "[...document.querySelectorAll('#messages tbody tr[data-id]')].filter(r => r.innerText.includes({})).length",
        json!(thread)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_organism_live_and_acts_through_the_api() {
    let (o, _d) = organism(Organism::builder(), LISTENERS);
    let (server, base) = serve(&o).await;
    let mut c = Chromium::launch().await;
    c.goto(&format!("{base}/")).await;
    until_live(&mut c).await;
    assert_eq!(c.text("#who-text").await, "no authentication · admin");
    assert_eq!(c.eval("$('loading').hidden").await, json!(true));
    // At a phone's width (412 px), the page reflows to it: nothing scrolls sideways.
    c.call(
        "Emulation.setDeviceMetricsOverride",
        json!({"width": 412, "height": 915, "deviceScaleFactor": 1, "mobile": true}),
    )
    .await;
    c.wait(
        "document.documentElement.scrollWidth <= window.innerWidth && window.innerWidth <= 412",
        "no horizontal overflow at 412 px",
    )
    .await;
    keep_screenshot(&mut c, "dashboard-phone").await;
    c.call("Emulation.clearDeviceMetricsOverride", json!({}))
        .await;
    // A clean load: no console error, no refused policy (Cytoscape's style is in app.css),
    // and the icon is found.
    assert_eq!(
        c.eval("!!document.querySelector('.__________cytoscape_container')")
            .await,
        json!(true)
    );
    assert!(
        c.errors.is_empty(),
        "console errors on a clean load: {:?}",
        c.errors
    );
    let found = c.axe_violations().await;
    assert!(found.is_empty(), "axe-core on the main view: {found:#?}");
    // And on every other tab (the agent panel and a thread are checked once open, below).
    for tab in ["threads", "inject", "organism", "messages"] {
        c.click(&format!("#tab-{tab}")).await;
        c.wait(
            &format!("!$('view-{tab}').hidden"),
            &format!("the {tab} tab"),
        )
        .await;
        let found = c.axe_violations().await;
        assert!(found.is_empty(), "axe-core on the {tab} tab: {found:#?}");
    }
    // Every listener as text beside the canvas, and on the canvas with its edge.
    assert_eq!(
        c.eval(
            "[...document.querySelectorAll('#agent-list [data-agent]')].map(b => b.dataset.agent)"
        )
        .await,
        json!(["a", "b"])
    );
    assert_eq!(c.eval("state.graph.nodes().length").await, json!(3));
    assert_eq!(
        c.eval("state.graph.getElementById('a→b').empty()").await,
        json!(false)
    );

    // What happens elsewhere shows as it happens, with each message's final status.
    let r = inject(&o, "a", &ping(7), None);
    settle(&o, &r.thread_id).await;
    c.wait(
        &format!("{} === 2", rows_of(&r.thread_id)),
        "the thread's two messages",
    )
    .await;
    c.wait(
        "[...document.querySelectorAll('#messages tbody .status')].every(s => s.textContent === 'delivered')",
        "their final status",
    )
    .await;
    // A thread id cut to its cell ends in an ellipsis and shows whole as its title.
    assert_eq!(
        c.eval("[...document.querySelectorAll('#messages tbody td > button.link')].every(b => b.title === b.textContent && getComputedStyle(b).textOverflow === 'ellipsis')").await,
        json!(true)
    );

    // The injector is a node of its own now, with its edge.
    c.wait(
        "!state.graph.getElementById('src:api→a').empty()",
        "the injector `api` and its edge",
    )
    .await;
    // Every control on the page, the log's links among them, is at least 24 × 24 px.
    assert_eq!(c.eval(SMALL_TARGETS).await, json!([]));

    // A row opens its thread, with that message open in it.
    c.eval("[...document.querySelectorAll('#messages tbody tr[data-id]')].pop().querySelector('button').click()")
        .await;
    c.wait(
        &format!("$('thread-title').textContent === 'Thread {}'", r.thread_id),
        "the row's thread",
    )
    .await;
    c.wait(
        "document.querySelectorAll('#thread-tree details[open]').length === 1",
        "its message open",
    )
    .await;
    let found = c.axe_violations().await;
    assert!(found.is_empty(), "axe-core on an open thread: {found:#?}");
    assert_eq!(c.eval(SMALL_TARGETS).await, json!([]));
    // Its address can be shared: a fresh load of it opens the same thread.
    assert_eq!(
        c.eval("location.hash").await,
        json!(format!("#/threads/{}", r.thread_id))
    );

    // Inject from a form made from the receiver's schema; the new thread opens.
    c.click("#tab-inject").await;
    c.fill("#inject-to", "a").await;
    let n = "#inject-fields input[data-path=\"n\"]";
    c.wait(
        &format!("document.querySelector({})", json!(n)),
        "the field n",
    )
    .await;
    c.fill(n, "42").await;
    c.submit("#inject-form").await;
    c.wait(
        &format!(
            "state.thread !== '{}' && $('thread-timeline').querySelectorAll('li').length === 2",
            r.thread_id
        ),
        "the new thread, opened, with both its messages",
    )
    .await;
    let thread = c.eval("state.thread").await;
    let messages = o.threads().messages(thread.as_str().unwrap()).unwrap();
    assert!(
        messages[0].payload_xml.contains("<n>42</n>"),
        "{messages:?}"
    );
    assert!(c
        .text("#thread-tree")
        .await
        .contains("api → a Ping [delivered]"));

    // A payload the schema refuses: the validator's words, shown.
    c.click("#tab-inject").await;
    c.eval("$('inject-raw').open = true").await;
    c.fill("#inject-xml", "<Ping><n>x</n></Ping>").await;
    c.submit("#inject-form").await;
    c.wait(
        "$('inject-result').innerText.includes('422') && $('inject-result').querySelectorAll('.validator li').length > 0",
        "the 422 and its validator messages",
    )
    .await;

    // An agent's panel pauses and resumes it.
    c.click("#agent-list [data-agent=\"b\"]").await;
    c.wait(
        "$('agent-facts').innerText.includes('keeps pings')",
        "b's panel",
    )
    .await;
    let found = c.axe_violations().await;
    assert!(found.is_empty(), "axe-core on an agent's panel: {found:#?}");
    assert_eq!(c.eval("location.hash").await, json!("#/agents/b"));
    // Handler times are rounded for people (two significant digits below a millisecond).
    assert_eq!(
        c.eval("[...$('agent-facts').querySelectorAll('dd')].slice(-2).every(d => /^(0|0\\.0*[1-9]\\d?|\\d+(\\.\\d)?)$/.test(d.textContent))").await,
        json!(true),
        "{}",
        c.text("#agent-facts").await
    );
    // Two agents chosen one after the other: the panel is the second's, whenever the
    // first's answers arrive.
    assert_eq!(
        c.eval(
            "(async () => {
               const first = selectAgent('a'); await selectAgent('b'); await first;
               return [$('agent-title').textContent, $('agent-facts').innerText.includes('keeps pings'),
                       $('agent-config').textContent.includes('sink'), $('agent-config').textContent.includes('forward')];
             })()"
        )
        .await,
        json!(["b", true, true, false])
    );
    c.click("[data-agent-act=\"pause\"]").await;
    c.wait(
        "document.querySelector('#agent-list [data-agent=\"b\"] .state').textContent === 'paused'",
        "b shown paused",
    )
    .await;
    assert_eq!(state_of(&o, "b"), AgentState::Paused);
    // Its queue grows while it is paused, and drains when it resumes.
    let held: Vec<_> = (0..3)
        .map(|n| inject(&o, "a", &ping(n), None).thread_id)
        .collect();
    c.wait(
        "document.querySelector('#agent-list [data-agent=\"b\"] .queue').textContent === 'queue 3'",
        "b's queue of 3",
    )
    .await;
    c.click("[data-agent-act=\"resume\"]").await;
    for t in &held {
        settle(&o, t).await;
    }
    c.wait(
        "document.querySelector('#agent-list [data-agent=\"b\"] .queue').textContent === 'queue 0'",
        "b's queue drained",
    )
    .await;
    // Every message lit its edge (or was counted when too many came at once).
    assert!(c.eval("state.flows").await.as_u64().unwrap() >= 10);
    c.wait(
        "document.querySelector('#agent-list [data-agent=\"b\"] .state').textContent === 'idle'",
        "b shown idle",
    )
    .await;

    // The organism's reload, confirmed, and its result.
    c.eval("window.confirm = () => true").await;
    c.click("[data-organism=\"reload\"]").await;
    c.wait(
        "$('reload-result').innerText.includes('unchanged: a, b')",
        "the reload's result",
    )
    .await;

    // The stream drops; what happened meanwhile comes with the resume (?since=), once.
    c.eval("state.ws.close()").await;
    let gap = inject(&o, "a", &ping(9), Some("gap"));
    settle(&o, &gap.thread_id).await;
    c.click("#tab-messages").await;
    c.wait(
        &format!("{} === 2", rows_of("gap")),
        "the messages sent while it was away",
    )
    .await;
    until_live(&mut c).await;
    assert_eq!(c.eval(&rows_of("gap")).await, json!(2));

    keep_screenshot(&mut c, "dashboard").await;
    // A thread's address, shared: a fresh load of it opens the same thread.
    c.goto("about:blank").await;
    c.goto(&format!("{base}/#/threads/{}", r.thread_id)).await;
    c.wait(
        &format!(
            "typeof $ === 'function' && $('thread-title').textContent === 'Thread {}'",
            r.thread_id
        ),
        "the thread, from its address",
    )
    .await;
    drop(c);
    o.stop().await;
    server.shutdown().await;
}

/// An organism with keys and a tenant's listener; a key for each of `who`.
fn with_keys(dir: &std::path::Path, who: &[(&str, Role, Option<&str>)]) -> (Organism, Vec<String>) {
    std::fs::write(dir.join("t.xsd"), TEST_XSD).unwrap();
    let path = dir.join("o.yaml");
    std::fs::write(
        &path,
        format!(
            "organism: {{ name: keyed, store: o.db }}\nauth: {{ methods: [keys] }}\nlisteners:\n{LISTENERS}\n  - {{ name: acme-a, description: acme's, kind: native, handler: sink, schema: t.xsd, accepts: [Ping], tenant: acme }}\n"
        ),
    )
    .unwrap();
    let config = Organism::builder().load_config(&path).unwrap();
    let mut keys = Vec::new();
    for (name, role, tenant) in who {
        let (key, row) = agentserver::access::new_key(name, *role, *tenant, None).unwrap();
        agentserver::access::KeySource::of(&config)
            .unwrap()
            .add(&row)
            .unwrap();
        keys.push(key);
    }
    (Organism::builder().load(&path).unwrap(), keys)
}

async fn sign_in(c: &mut Chromium, token: &str) {
    c.wait("!$('login').hidden", "the sign-in form").await;
    c.eval("$('login-error').textContent = ''").await;
    c.fill("#token", token).await;
    c.submit("#login-form").await;
}

/// Two injectors sending to the same agents stand apart, and an edge that would pass behind
/// a node (api → b, past a) is bent around it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injectors_stand_apart_and_no_edge_hides_behind_a_node() {
    let (o, _d) = organism(Organism::builder(), LISTENERS);
    let (server, base) = serve(&o).await;
    let mut c = Chromium::launch().await;
    c.goto(&format!("{base}/")).await;
    until_live(&mut c).await;
    for from in ["api", "ws"] {
        for to in ["a", "b"] {
            let r = o
                .inject(agentserver::InjectRequest {
                    from: from.into(),
                    to: to.into(),
                    payload_xml: ping(1),
                    thread_id: None,
                })
                .unwrap();
            settle(&o, &r.thread_id).await;
        }
    }
    c.wait(
        "['src:api→a', 'src:api→b', 'src:ws→a', 'src:ws→b'].every(id => !state.graph.getElementById(id).empty())",
        "both injectors and their edges",
    )
    .await;
    // Their boxes do not meet.
    let boxes = c
        .eval("['src:api', 'src:ws'].map(id => state.graph.getElementById(id).boundingBox({includeLabels: true}))")
        .await;
    assert_eq!(
        c.eval(
            "(() => { const [p, q] = ['src:api', 'src:ws'].map(id => state.graph.getElementById(id).boundingBox({includeLabels: true}));
               return p.x2 < q.x1 || q.x2 < p.x1 || p.y2 < q.y1 || q.y2 < p.y1; })()"
        )
        .await,
        json!(true),
        "{boxes}"
    );
    // Whatever edge runs past a node it does not join passes clear of it, where it is drawn.
    let hidden = c
        .eval(
            "state.graph.edges().filter(e => state.graph.nodes().some(n => {
               if (n.same(e.source()) || n.same(e.target())) return false;
               const m = e.midpoint(), p = n.position();
               return Math.hypot(m.x - p.x, m.y - p.y) < 20; })).map(e => e.id())",
        )
        .await;
    assert_eq!(hidden, json!([]));
    assert!(
        c.eval("state.graph.getElementById('src:api→b').data('bend')")
            .await
            .as_i64()
            .is_some_and(|b| b != 0),
        "api → b is bent around a"
    );
    keep_screenshot(&mut c, "dashboard-injectors").await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_keys_it_asks_for_one_and_shows_only_what_the_role_and_tenant_may_use() {
    let dir = tempfile::tempdir().unwrap();
    let (o, keys) = with_keys(
        dir.path(),
        &[
            ("watcher", Role::Viewer, None),
            ("acme-op", Role::Operator, Some("acme")),
        ],
    );
    let (server, base) = serve(&o).await;
    let mut c = Chromium::launch().await;
    c.goto(&format!("{base}/")).await;

    // Asked for a key, without a word of blame before one was given.
    c.wait("!$('login').hidden", "the sign-in form").await;
    let found = c.axe_violations().await;
    assert!(found.is_empty(), "axe-core on the sign-in form: {found:#?}");
    assert_eq!(c.text("#login-error").await, "");
    // The page knew to ask (the server marks it): no refused request, no console error.
    assert!(c.errors.is_empty(), "console errors: {:?}", c.errors);
    // A wrong key is refused and asked for again.
    sign_in(&mut c, "ask_not-a-key").await;
    c.wait("$('login-error').textContent.length > 0", "the refusal")
        .await;
    assert_eq!(c.eval("$('app').hidden").await, json!(true));

    // A viewer sees everything and may change nothing.
    sign_in(&mut c, &keys[0]).await;
    until_live(&mut c).await;
    assert_eq!(c.text("#who-text").await, "key:watcher · viewer");
    for hidden in [
        "organism-controls",
        "agent-controls",
        "tab-inject",
        "thread-kill",
    ] {
        assert_eq!(
            c.eval(&format!("$('{hidden}').hidden")).await,
            json!(true),
            "{hidden}"
        );
    }
    assert_eq!(
        c.eval("document.querySelectorAll('#agent-list [data-agent]').length")
            .await,
        json!(3)
    );
    // The key is the tab's: never in the address.
    assert!(!c
        .eval("location.href")
        .await
        .as_str()
        .unwrap()
        .contains("ask_"));
    assert_eq!(
        c.eval("sessionStorage.getItem('agentserver-token')").await,
        json!(keys[0])
    );

    // Signed out: no control is offered, not even the organism's.
    c.click("#sign-out").await;
    assert_eq!(
        c.eval("[...document.querySelectorAll('[data-need]')].every(e => e.hidden || e.closest('[hidden]'))").await,
        json!(true)
    );
    // An empty list of organism events says so.
    assert_eq!(
        c.eval("getComputedStyle($('organism-events'), '::before').content")
            .await,
        json!("\"No reloads, deployments or errors yet.\"")
    );
    // A tenant's operator sees its own agents, may inject, and not control the organism.
    sign_in(&mut c, &keys[1]).await;
    c.wait(
        "$('who-text').textContent.includes('acme-op') && $('connection-state').textContent === 'live'",
        "the tenant's stream",
    )
    .await;
    assert_eq!(
        c.text("#who-text").await,
        "key:acme-op · operator · tenant acme"
    );
    c.wait(
        "[...document.querySelectorAll('#agent-list [data-agent]')].map(b => b.dataset.agent).join() === 'acme-a'",
        "only the tenant's agent",
    )
    .await;
    assert_eq!(c.eval("$('organism-controls').hidden").await, json!(true));
    assert_eq!(c.eval("$('tab-inject').hidden").await, json!(false));
    keep_screenshot(&mut c, "dashboard-tenant").await;
    drop(c);
    o.stop().await;
    server.shutdown().await;
}

#[tokio::test]
async fn its_files_are_served_with_their_headers_and_can_be_turned_off() {
    let (o, _d) = organism(Organism::builder(), LISTENERS);
    let (server, base) = serve(&o).await;
    let http = http();
    let page = http.get(format!("{base}/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let icon = http
        .get(format!("{base}/favicon.ico"))
        .send()
        .await
        .unwrap();
    assert_eq!(icon.status(), 200);
    assert_eq!(icon.headers()["content-type"], "image/svg+xml");
    // Something is drawn before any script or stream runs: the layout says it connects.
    let html = http
        .get(format!("{base}/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        html.contains("<main id=\"loading\" aria-busy=\"true\">")
            && html.contains("Connecting to the organism"),
        "{html}"
    );
    let h = page.headers().clone();
    assert_eq!(h["content-type"], "text/html; charset=utf-8");
    assert_eq!(h["cache-control"], "no-cache");
    assert_eq!(h["x-content-type-options"], "nosniff");
    let csp = h["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    // Unchanged since the copy a browser holds: 304, no body.
    let again = http
        .get(format!("{base}/"))
        .header("if-none-match", h["etag"].clone())
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 304);
    let lib = http
        .get(format!("{base}/dashboard/vendor/cytoscape-3.34.4.min.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(lib.status(), 200);
    assert_eq!(lib.headers()["cache-control"], "public, max-age=86400");
    assert_eq!(
        lib.headers()["content-type"],
        "text/javascript; charset=utf-8"
    );
    let missing = http
        .get(format!("{base}/dashboard/nope.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let body: serde_json::Value = missing.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_found");
    // A page whose name was re-pointed at this server (DNS rebinding) gets nothing.
    let rebound = http
        .get(format!("{base}/"))
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), 421);
    let escape = http
        .get(format!("{base}/dashboard/..%2F..%2FCargo.toml"))
        .send()
        .await
        .unwrap();
    assert_eq!(escape.status(), 404);
    o.stop().await;
    server.shutdown().await;

    // `organism.dashboard: false`: no page; the API as before.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    let path = dir.path().join("o.yaml");
    std::fs::write(
        &path,
        format!("organism: {{ name: plain, store: memory, dashboard: false }}\nlisteners:\n{LISTENERS}\n"),
    )
    .unwrap();
    let o = Organism::builder().load(&path).unwrap();
    let (server, base) = serve(&o).await;
    assert_eq!(
        http.get(format!("{base}/")).send().await.unwrap().status(),
        404
    );
    assert_eq!(
        http.get(format!("{base}/api/v1/organism"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    o.stop().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_page_search_and_die_from_the_dashboard_and_a_restart_resyncs_it() {
    let (o, d) = organism(Organism::builder(), LISTENERS);
    let (server, base) = serve(&o).await;
    for n in 0..30 {
        let r = inject(&o, "a", &ping(n), Some(&format!("t{n:02}")));
        settle(&o, &r.thread_id).await;
    }
    let mut c = Chromium::launch().await;
    c.goto(&format!("{base}/")).await;
    until_live(&mut c).await;

    // 30 threads: two pages of 25, newest first.
    c.click("#tab-threads").await;
    c.wait("$('thread-list').children.length === 25", "the first page")
        .await;
    assert_eq!(c.text("#threads-page").await, "page 1 of 2 (30 threads)");
    assert!(c.text("#thread-list li").await.starts_with("t29 completed"));
    c.click("#threads-next").await;
    c.wait("$('thread-list').children.length === 5", "the second page")
        .await;
    // By id.
    c.fill("#thread-filters [name=id]", "t07").await;
    c.submit("#thread-filters").await;
    c.wait(
        "$('thread-title').textContent === 'Thread t07'",
        "t07 opened",
    )
    .await;
    assert!(c
        .text("#thread-facts")
        .await
        .starts_with("completed · 2 messages"));
    assert!(c
        .text("#thread-tree")
        .await
        .contains("a → b Ping [delivered]"));

    // A thread held at a paused agent, killed from its page.
    o.control().pause_listener("b").unwrap();
    let held = inject(&o, "a", &ping(99), Some("held"));
    c.fill("#thread-filters [name=id]", "held").await;
    c.submit("#thread-filters").await;
    c.wait(
        "$('thread-title').textContent === 'Thread held' && !$('thread-kill').disabled",
        "the active thread",
    )
    .await;
    c.eval("window.confirm = () => true").await;
    c.click("#thread-kill").await;
    c.wait(
        "$('thread-facts').textContent.startsWith('killed')",
        "killed",
    )
    .await;
    assert_eq!(
        o.threads().status(&held.thread_id),
        Some(agentserver::threads::ThreadStatus::Killed)
    );
    o.control().resume_listener("b").unwrap();

    // Frozen, the log counts what comes instead of showing it.
    c.click("#tab-messages").await;
    c.click("#freeze").await;
    let r = inject(&o, "a", &ping(100), Some("while-frozen"));
    settle(&o, &r.thread_id).await;
    c.wait(
        "$('frozen-count').textContent === '2 new while frozen'",
        "the count",
    )
    .await;
    assert_eq!(c.eval(&rows_of("while-frozen")).await, json!(0));
    // Resumed, it shows them.
    c.click("#freeze").await;
    c.wait(
        &format!("{} === 2", rows_of("while-frozen")),
        "the held rows",
    )
    .await;
    // A filter reads the log's pages from /messages.
    c.fill("#message-filters [name=thread]", "t03").await;
    c.wait(
        "document.querySelectorAll('#messages tbody tr[data-id]').length === 2 && $('messages').innerText.includes('t03')",
        "t03's messages only",
    )
    .await;
    c.fill("#message-filters [name=thread]", "").await;

    // A reload that adds a listener: it appears, on the canvas and in the list.
    add_to_file(d.path(), "  - { name: c, description: new, kind: native, handler: sink, schema: t.xsd, accepts: [Ping] }");
    o.reload(None).unwrap();
    c.wait(
        "document.querySelectorAll('#agent-list [data-agent]').length === 3 && !state.graph.getElementById('c').empty()",
        "the new listener",
    )
    .await;

    // A reload that cannot load: its problems are shown, the topology stays.
    add_to_file(d.path(), "  - { name: d, description: broken, kind: native, handler: no-such-handler, schema: t.xsd }");
    c.click("[data-organism=\"reload\"]").await;
    c.wait(
        "$('reload-result').innerText.includes('Reload refused') && $('reload-result').innerText.includes('no-such-handler')",
        "the reload's problems",
    )
    .await;
    assert_eq!(
        c.eval("document.querySelectorAll('#agent-list [data-agent]').length")
            .await,
        json!(3)
    );

    // The server restarts (a new organism, its events counted from the start again): the
    // dashboard resyncs onto it.
    let addr = server.local_addr();
    o.stop().await;
    server.shutdown().await;
    c.wait("$('connection-state').textContent !== 'live'", "the drop")
        .await;
    let (o2, _d2) = organism(Organism::builder(), LISTENERS);
    let server = ApiServer::bind(o2.clone(), &addr.to_string(), ApiOptions::default())
        .await
        .unwrap();
    c.wait(
        "$('connection-state').textContent === 'live' && document.querySelectorAll('#agent-list [data-agent]').length === 2",
        "live on the new server, its agents shown",
    )
    .await;
    keep_screenshot(&mut c, "dashboard-restarted").await;
    drop(c);
    o2.stop().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_listeners_under_a_thousand_messages_a_second_stay_bounded() {
    use browser::swarm;
    let (o, _d) = organism(Organism::builder(), &swarm::listeners());
    let (server, base) = serve(&o).await;
    let mut c = Chromium::launch().await;
    c.goto(&format!("{base}/")).await;
    c.wait(
        "$('connection-state').textContent === 'live' && document.querySelectorAll('#agent-list [data-agent]').length === 200",
        "all 200 listeners listed",
    )
    .await;
    c.eval(swarm::RECORD_FRAMES).await;
    let sent = swarm::drive(&o, 1000, std::time::Duration::from_secs(3)).await;
    c.wait(
        &format!("state.flows + state.folded >= {}", sent / 2),
        "the page to take the load in",
    )
    .await;
    let report = c.eval(swarm::FRAME_REPORT).await;
    eprintln!("200 listeners, {sent} messages in 3 s: {report}");
    // Bounded however much comes: the log keeps its newest 500 rows, every listener stays
    // listed, and the page kept drawing frames throughout.
    assert!(report["rows"].as_u64().unwrap() <= 500, "{report}");
    assert_eq!(report["agents"], 200, "{report}");
    assert!(report["frames"].as_u64().unwrap() > 10, "{report}");
    keep_screenshot(&mut c, "dashboard-200").await;
    drop(c);
    o.stop().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inject_form_follows_nested_optional_and_repeated_elements() {
    let (o, d) = organism(Organism::builder(), LISTENERS);
    std::fs::write(
        d.path().join("order.xsd"),
        r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
  <xs:complexType name="Customer"><xs:sequence>
    <xs:element name="name" type="xs:string"/>
    <xs:element name="email" type="xs:string" minOccurs="0"/>
  </xs:sequence></xs:complexType>
  <xs:element name="Order"><xs:complexType><xs:sequence>
    <xs:element name="customer" type="Customer"/>
    <xs:element name="item" type="xs:string" maxOccurs="unbounded"/>
    <xs:element name="qty" type="xs:int"/>
  </xs:sequence></xs:complexType></xs:element>
</xs:schema>"#,
    )
    .unwrap();
    add_to_file(d.path(), "  - { name: orders, description: takes orders, kind: native, handler: sink, schema: order.xsd, accepts: [Order] }");
    o.reload(None).unwrap();
    let (server, base) = serve(&o).await;
    let mut c = Chromium::launch().await;
    c.goto(&format!("{base}/")).await;
    until_live(&mut c).await;
    c.click("#tab-inject").await;
    c.fill("#inject-to", "orders").await;
    c.wait(
        "document.querySelector('#inject-fields input[data-path=\"customer.name\"]')",
        "the nested fields",
    )
    .await;
    assert_eq!(
        c.eval("[...document.querySelectorAll('#inject-fields [data-path]')].map(i => i.dataset.path + (i.required ? '!' : '') + (i.dataset.repeated ? '*' : ''))")
            .await,
        json!(["customer.name!", "customer.email", "item*", "qty!"])
    );
    // Two targets chosen one after the other, before the first's schema has come: the form
    // is the second's alone, whenever the first's answer arrives.
    assert_eq!(
        c.eval(
            "(async () => {
               const to = $('inject-to');
               to.value = 'a'; const first = injectTypes();
               to.value = 'orders'; await injectTypes(); await first;
               return [...document.querySelectorAll('#inject-fields [data-path]')].map(i => i.dataset.path);
             })()"
        )
        .await,
        json!(["customer.name", "customer.email", "item", "qty"])
    );
    c.fill("#inject-fields input[data-path=\"customer.name\"]", "Ada")
        .await;
    c.fill("#inject-fields input[data-path=\"item\"]", "tea, cake")
        .await;
    c.fill("#inject-fields input[data-path=\"qty\"]", "2").await;
    c.submit("#inject-form").await;
    c.wait(
        "state.thread && $('thread-timeline').children.length === 1",
        "the order's thread",
    )
    .await;
    let thread = c.eval("state.thread").await;
    let m = &o.threads().messages(thread.as_str().unwrap()).unwrap()[0];
    assert_eq!(
        m.payload_xml.as_str(),
        "<Order><customer><name>Ada</name></customer><item>tea</item><item>cake</item><qty>2</qty></Order>"
    );
    keep_screenshot(&mut c, "dashboard-inject").await;
    drop(c);
    o.stop().await;
    server.shutdown().await;
}

/// The Inbox as an operator uses it: a held message shows with its payload and the tab its
/// count; Approve from the page lets it through and the thread completes; a question is
/// answered from the page; axe finds nothing on the tab.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_approves_and_answers_from_the_page() {
    let (o, _d) = organism(
        Organism::builder(),
        "  - { name: a, description: forwards pings, kind: native, handler: forward, schema: t.xsd, accepts: [Ping], peers: [b], config: { to: b } }
  - { name: b, description: keeps pings, kind: native, handler: sink, schema: t.xsd, accepts: [Ping], approval: { prompt: 'Ping {n} to b' } }
  - { name: person, description: answers, kind: human, schema: t.xsd, accepts: [Pong], peers: [b] }",
    );
    let (server, base) = serve(&o).await;
    let mut c = Chromium::launch().await;
    c.goto(&format!("{base}/")).await;
    until_live(&mut c).await;
    let held = inject(&o, "a", &ping(7), None);
    c.wait(
        "$('tab-inbox').textContent === 'Inbox (1)'",
        "the inbox's count on its tab",
    )
    .await;
    c.click("#tab-inbox").await;
    c.wait(
        "document.querySelector('#inbox-list li.input-open')?.innerText.includes('Ping 7 to b')",
        "the held message with its prompt",
    )
    .await;
    assert!(c.axe_violations().await.is_empty(), "axe on the inbox");
    c.click("#inbox-list li.input-open button.approve").await;
    // The thread waits until the page's approval lands, then completes.
    wait_until_async("the approved thread completes", || {
        let done = o.threads().status(&held.thread_id)
            == Some(agentserver::threads::ThreadStatus::Completed);
        async move { done }
    })
    .await;
    c.wait(
        "$('tab-inbox').textContent === 'Inbox'",
        "the inbox empty again",
    )
    .await;

    let asked = inject(&o, "person", "<Pong><n>1</n></Pong>", None);
    c.wait(
        "document.querySelector('#inbox-list li.input-open textarea[aria-label^=\"Answer\"]')",
        "the question",
    )
    .await;
    c.eval("document.querySelector('#inbox-list li.input-open textarea[aria-label^=\"Answer\"]').value = '<Ping><n>2</n></Ping>'")
        .await;
    c.click("#inbox-list li.input-open button.answer").await;
    c.wait(
        "document.querySelector('#inbox-list li.input-open')?.innerText.includes('Ping 2 to b')",
        "the answer, held in turn at b's gate",
    )
    .await;
    let ms = messages(&o, &asked.thread_id);
    assert_eq!(ms.len(), 2, "{ms:?}");
    assert_eq!(
        (&*ms[1].from, ms[1].parent_id.as_deref()),
        ("person", Some(&*ms[0].id))
    );
    keep_screenshot(&mut c, "dashboard-inbox").await;
    drop(server);
}

/// A browser's own `EventSource`, with a stream token, reads a thread from its history on:
/// the snapshot, then a live message; the token does not open the stream twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_event_source_follows_a_thread_with_a_stream_token() {
    let dir = tempfile::tempdir().unwrap();
    let (o, keys) = with_keys(dir.path(), &[("watcher", Role::Viewer, None)]);
    let (server, base) = serve(&o).await;
    let first = inject(&o, "a", &ping(1), Some("followed"));
    settle(&o, &first.thread_id).await;
    let mut c = Chromium::launch().await;
    c.goto(&format!("{base}/healthz")).await;
    let url = c
        .eval(&format!(
            r#"(async () => {{
              const r = await fetch('/api/v1/stream-tokens', {{method: 'POST',
                headers: {{'Authorization': 'Bearer {key}', 'Content-Type': 'application/json'}},
                body: JSON.stringify({{thread_id: 'followed'}})}});
              const t = await r.json();
              window.got = [];
              window.es = new EventSource(t.url);
              es.addEventListener('thread_snapshot', e => {{
                const s = JSON.parse(e.data);
                got.push('snapshot ' + s.messages.map(m => m.to).join(','));
              }});
              es.addEventListener('message', e => got.push('message ' + JSON.parse(e.data).message.payload.n));
              return t.url;
            }})()"#,
            key = keys[0]
        ))
        .await;
    let url = url.as_str().unwrap().to_string();
    c.wait("got.length >= 1", "the snapshot").await;
    assert_eq!(c.eval("got[0]").await, "snapshot a,b");
    inject(&o, "a", &ping(2), Some("followed"));
    // Both live messages (api → a, then a → b), each once.
    c.wait(
        "got.filter(g => g === 'message 2').length >= 2",
        "the live messages",
    )
    .await;
    settle(&o, &first.thread_id).await;
    assert_eq!(
        c.eval("got.filter(g => g === 'message 2').length").await,
        2,
        "api → a and a → b, once each"
    );
    // The token was used: the same URL is refused, in the page too.
    let status = c.eval(&format!("fetch('{url}').then(r => r.status)")).await;
    assert_eq!(status, 401);
    c.eval("es.close()").await;
    server.shutdown().await;
}

/// The thread view follows the thread's event stream: a message comes in without a reload
/// of the page, and across a server restart (the same store) nothing is lost or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_thread_view_follows_its_stream_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    let path = dir.path().join("organism.yaml");
    std::fs::write(
        &path,
        format!("organism: {{ name: kept, store: o.db }}\nlisteners:\n{LISTENERS}\n"),
    )
    .unwrap();
    let o = Organism::builder().load(&path).unwrap();
    let (server, base) = serve(&o).await;
    let first = inject(&o, "a", &ping(1), Some("kept"));
    settle(&o, &first.thread_id).await;
    let mut c = Chromium::launch().await;
    c.goto(&format!("{base}/#/threads/kept")).await;
    let rows = "document.querySelectorAll('#thread-timeline > li').length";
    let distinct = "new Set([...document.querySelectorAll('#thread-timeline details')].map(d => d.dataset.message)).size";
    c.wait(&format!("{rows} === 2"), "the thread's history")
        .await;
    inject(&o, "a", &ping(2), Some("kept"));
    c.wait(
        &format!("{rows} === 4 && {distinct} === 4"),
        "the live messages",
    )
    .await;

    let addr = server.local_addr();
    o.stop().await;
    server.shutdown().await;
    drop(o);
    // The page's stream lets go of the first organism (and its store file) as its
    // connection closes.
    let reload = std::sync::Mutex::new(None);
    wait_until_async("the store file is free again", || {
        let loaded = Organism::builder().load(&path).ok();
        let free = loaded.is_some();
        *reload.lock().unwrap() = loaded;
        async move { free }
    })
    .await;
    let o = reload.into_inner().unwrap().unwrap();
    let server = ApiServer::bind(o.clone(), &addr.to_string(), ApiOptions::default())
        .await
        .unwrap();
    // The stream comes back on its own (resumed, or from a fresh snapshot): a message
    // after the restart shows, none twice.
    inject(&o, "a", &ping(3), Some("kept"));
    c.wait(
        &format!("{rows} === 6 && {distinct} === 6"),
        "every message once",
    )
    .await;
    assert!(c.text("#thread-facts").await.contains("6 messages"));
    drop(c);
    o.stop().await;
    server.shutdown().await;
}

/// A model whose answer streams while the page looks: the thread view shows the text as it
/// comes, then the message it ends in, and the streamed line goes.
#[tokio::test]
async fn the_thread_view_shows_a_models_answer_as_it_streams() {
    // An OpenAI-compatible server that streams two pieces, then waits to be let go.
    let (tx, rx) = tokio::sync::mpsc::channel::<String>(8);
    let rx = std::sync::Arc::new(tokio::sync::Mutex::new(Some(rx)));
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move || {
            let rx = rx.clone();
            async move {
                let rx = rx.lock().await.take().expect("one call");
                let chunks = futures_util::stream::unfold(rx, |mut rx| async move {
                    rx.recv().await.map(|c| (Ok::<_, std::io::Error>(c), rx))
                });
                (
                    [("content-type", "text/event-stream")],
                    axum::body::Body::from_stream(chunks),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let model = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let piece = |t: &str| {
        format!(
            "data: {}\n\n",
            json!({"choices": [{"index": 0, "delta": {"content": t}}]})
        )
    };

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    let path = dir.path().join("organism.yaml");
    std::fs::write(
        &path,
        format!(
            "organism: {{ name: streams, store: memory }}
models:
  m: {{ base_url: '{model}', model: fake, timeout_ms: 20000 }}
listeners:
  - {{ name: think, description: answers, kind: llm, model: m, system: s, schema: t.xsd, accepts: [Ping], stream: true, reply: {{ type: Answer, text_field: text }} }}
"
        ),
    )
    .unwrap();
    let o = Organism::builder().load(&path).unwrap();
    let (server, base) = serve(&o).await;
    let sent = inject(&o, "think", &ping(1), Some("streaming"));
    let mut c = Chromium::launch().await;
    c.goto(&format!("{base}/#/threads/streaming")).await;
    c.wait(
        "document.querySelectorAll('#thread-timeline details').length === 1",
        "the thread",
    )
    .await;
    tx.send(piece("It is ")).await.unwrap();
    tx.send(piece("almost ")).await.unwrap();
    c.wait(
        "document.querySelector('#thread-timeline .streamed')?.textContent === 'It is almost '",
        "the answer as it streams",
    )
    .await;
    keep_screenshot(&mut c, "dashboard-streaming").await;
    tx.send(piece("done.")).await.unwrap();
    tx.send("data: [DONE]\n\n".to_string()).await.unwrap();
    drop(tx);
    settle(&o, &sent.thread_id).await;
    c.wait(
        "document.querySelectorAll('#thread-timeline details').length === 2 \
         && !document.querySelector('#thread-timeline .streaming')",
        "the message it ends in, and no streamed line",
    )
    .await;
    assert!(c.text("#thread-timeline").await.contains("think → api"));
    drop(c);
    o.stop().await;
    server.shutdown().await;
}

#[tokio::test]
async fn the_usage_tab_shows_the_account_and_the_budgets() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    let path = dir.path().join("organism.yaml");
    std::fs::write(
        &path,
        "organism: { name: usage, store: usage.db }
tenants:
  acme: { tokens_per_day: 100000, tokens_per_month: 2000000 }
models:
  s: { provider: scripted, responses: [ { text: noted } ] }
listeners:
  - { name: think, description: answers, kind: llm, model: s, system: s, schema: t.xsd, accepts: [Ping], reply: { type: Answer, text_field: text }, tenant: acme }
",
    )
    .unwrap();
    let o = Organism::builder().load(&path).unwrap();
    let sent = inject(&o, "think", &ping(1), None);
    settle(&o, &sent.thread_id).await;
    let (server, base) = serve(&o).await;
    let mut c = Chromium::launch().await;
    c.goto(&format!("{base}/")).await;
    until_live(&mut c).await;
    c.click("#tab-usage").await;
    // The model's call (its row names the model); the listener's work may have its row too.
    let call = "[...document.querySelectorAll('#usage tbody tr')].find(r => r.cells[3].textContent === 's')";
    c.wait(
        &format!("!!{call} && document.querySelectorAll('#budgets tbody tr').length === 2"),
        "the model's call and both windows",
    )
    .await;
    let cells = c
        .eval(&format!(
            "[...{call}.cells].slice(1, 5).map(c => c.textContent)"
        ))
        .await;
    assert_eq!(cells, json!(["acme", "think", "s", "1"]));
    let windows = c.text("#budgets tbody").await;
    assert!(
        windows.contains("day") && windows.contains("month") && windows.contains("100,000"),
        "{windows}"
    );
    let found = c.axe_violations().await;
    assert!(found.is_empty(), "axe-core on the usage tab: {found:#?}");
    keep_screenshot(&mut c, "dashboard-usage").await;
    assert!(c.errors.is_empty(), "console errors: {:?}", c.errors);
    drop(c);
    o.stop().await;
    server.shutdown().await;
}

/// The threads tab as an operator uses it for time travel and batches: a label chip narrows
/// the list, the threads ticked are killed together once their count is typed (a wrong
/// count does nothing), "Fork from here" with an edited payload opens the fork, and what a
/// rewind superseded is greyed in the open thread.
#[tokio::test]
async fn the_threads_tab_forks_batches_by_label_and_greys_what_a_rewind_superseded() {
    let (o, _d) = organism(Organism::builder(), LISTENERS);
    let (server, base) = serve(&o).await;
    let labelled = |customer: &str, n: i64, thread: &str| {
        let labels = [("customer".to_string(), customer.to_string())].into();
        let req = agentserver::InjectRequest {
            from: "api".into(),
            to: "a".into(),
            payload_xml: ping(n),
            thread_id: Some(thread.into()),
        };
        o.inject_labelled(req, None, Some(&labels)).unwrap()
    };
    for (i, t) in ["acme-1", "acme-2", "acme-3"].iter().enumerate() {
        let r = labelled("acme", i as i64, t);
        settle(&o, &r.thread_id).await;
    }
    let keep = labelled("zeta", 7, "zeta-1");
    settle(&o, &keep.thread_id).await;

    let mut c = Chromium::launch().await;
    c.goto(&format!("{base}/")).await;
    until_live(&mut c).await;
    c.click("#tab-threads").await;
    c.wait("$('thread-list').children.length === 4", "four threads")
        .await;
    // A label chip: only acme's.
    c.fill("#thread-filters [name=label]", "customer:acme")
        .await;
    c.click("#label-add").await;
    c.wait(
        "$('thread-list').children.length === 3 && $('label-chips').textContent.includes('customer:acme')",
        "acme's threads and the chip",
    )
    .await;
    assert!(c.text("#thread-list").await.contains("customer:acme"));
    let found = c.axe_violations().await;
    assert!(found.is_empty(), "axe-core on the threads tab: {found:#?}");

    // Ticked, then a wrong count: nothing is done.
    c.click("#batch-all").await;
    c.eval("$('batch-action').value = 'kill'").await;
    c.click("#batch-apply").await;
    c.wait(
        "!$('batch-confirm').hidden && $('batch-count').textContent === '3'",
        "the confirmation",
    )
    .await;
    c.fill("#batch-typed", "2").await;
    c.click("#batch-go").await;
    c.wait(
        "$('batch-result').textContent === 'Type 3 to confirm.'",
        "refused",
    )
    .await;
    assert_eq!(
        o.threads().status("acme-1"),
        Some(agentserver::threads::ThreadStatus::Completed)
    );
    c.fill("#batch-typed", "3").await;
    c.click("#batch-go").await;
    c.wait(
        "$('batch-result').textContent.startsWith('kill: 3 of 3 done')",
        "killed",
    )
    .await;
    for t in ["acme-1", "acme-2", "acme-3"] {
        assert_eq!(
            o.threads().status(t),
            Some(agentserver::threads::ThreadStatus::Killed)
        );
    }
    assert_eq!(
        o.threads().status("zeta-1"),
        Some(agentserver::threads::ThreadStatus::Completed)
    );

    // Fork from the second message of zeta's thread, its payload edited.
    c.click("[data-chip='customer:acme']").await;
    c.fill("#thread-filters [name=id]", "zeta-1").await;
    c.submit("#thread-filters").await;
    c.wait(
        "document.querySelectorAll('#thread-tree [data-fork]').length === 2",
        "the fork buttons",
    )
    .await;
    let hop = messages(&o, "zeta-1")[1].id.to_string();
    c.eval("window.prompt = () => '<Ping><n>42</n></Ping>'")
        .await;
    c.click(&format!("#thread-tree [data-fork='{hop}']")).await;
    c.wait(
        "$('thread-facts').textContent.includes('forked from zeta-1') && $('thread-tree').textContent.includes('<n>42</n>')",
        "the fork opened, its edit shown",
    )
    .await;
    let fork = c.eval("state.thread").await;
    let fork = fork.as_str().unwrap().to_string();
    assert_eq!(
        settle(&o, &fork).await,
        agentserver::threads::ThreadStatus::Completed
    );
    assert!(messages(&o, &fork)
        .last()
        .unwrap()
        .payload_xml
        .contains("42"));

    // Rewound from outside, the open thread greys what it superseded.
    let first = messages(&o, &fork)[0].id.to_string();
    let req = agentserver::pump::RewindRequest {
        to: &first,
        ..Default::default()
    };
    o.rewind(&fork, &req).unwrap();
    c.wait(
        "document.querySelectorAll('#thread-timeline details.superseded').length === 1",
        "the superseded message greyed",
    )
    .await;
    let found = c.axe_violations().await;
    assert!(found.is_empty(), "axe-core on a rewound thread: {found:#?}");
    keep_screenshot(&mut c, "dashboard-fork-batch").await;
    drop(c);
    o.stop().await;
    server.shutdown().await;
}
