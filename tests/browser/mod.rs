//! Headless Chromium for the dashboard's tests, driven over the DevTools protocol on a real
//! WebSocket: open a page, evaluate JavaScript in it, wait for a condition, take a
//! screenshot. `scripts/test` installs Chromium when it is missing.

use std::time::{Duration, Instant};

#[allow(dead_code)]
pub mod swarm;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_tungstenite::tungstenite::Message;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub struct Chromium {
    /// One browser at a time in a test binary: several starting at once on two cores made
    /// each slow enough to miss the server's deadlines.
    _turn: tokio::sync::MutexGuard<'static, ()>,
    child: tokio::process::Child,
    socket: Socket,
    next: u64,
    _profile: tempfile::TempDir,
    /// The page's console errors, refused policies and uncaught exceptions so far (read as
    /// they arrive among the answers to commands).
    pub errors: Vec<String>,
}

/// The axe-core release the accessibility checks run (fetched by `scripts/test`).
pub const AXE_VERSION: &str = "4.10.2";

/// How long a condition may take to hold.
pub const PATIENCE: Duration = Duration::from_secs(20);

impl Chromium {
    /// Starts a headless Chromium (a fresh profile, no network of its own) and attaches to
    /// its first page.
    pub async fn launch() -> Chromium {
        static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        let turn = TURN.lock().await;
        let profile = tempfile::tempdir().unwrap();
        let binary = ["chromium", "chromium-browser", "google-chrome"]
            .into_iter()
            .find(|b| {
                std::process::Command::new("sh")
                    .args(["-c", &format!("command -v {b}")])
                    .output()
                    .is_ok_and(|o| o.status.success())
            })
            .expect("Chromium is not installed: `bash scripts/test` installs it");
        let mut child = tokio::process::Command::new(binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                "--window-size=1400,900",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            // Its singleton socket's directory (made in the temp dir, removed only by a
            // browser that exits cleanly) goes in the profile, removed with it.
            .env("TMPDIR", profile.path())
            .arg("about:blank")
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            // Its own process group: dropped, the browser and every process it started are
            // stopped together, before its profile is removed.
            .process_group(0)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let browser = tokio::time::timeout(PATIENCE, async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(url) = line.strip_prefix("DevTools listening on ") {
                    return url.trim().to_string();
                }
            }
            panic!("Chromium ended before it listened");
        })
        .await
        .expect("Chromium did not start");
        // Keep reading its stderr so that it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let port = browser
            .trim_start_matches("ws://127.0.0.1:")
            .split('/')
            .next()
            .unwrap()
            .to_string();
        let targets: Value = agentserver::outbound::http_client()
            .unwrap()
            .build()
            .unwrap()
            .get(format!("http://127.0.0.1:{port}/json/list"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let page = targets
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "page")
            .expect("a page")["webSocketDebuggerUrl"]
            .as_str()
            .unwrap()
            .to_string();
        let (socket, _) = tokio_tungstenite::connect_async(page).await.unwrap();
        let mut c = Chromium {
            _turn: turn,
            child,
            socket,
            next: 0,
            _profile: profile,
            errors: Vec::new(),
        };
        c.call("Page.enable", json!({})).await;
        c.call("Runtime.enable", json!({})).await;
        c.call("Log.enable", json!({})).await;
        c
    }

    /// One DevTools command; its result.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        let text = json!({"id": id, "method": method, "params": params}).to_string();
        self.socket.send(Message::text(text)).await.unwrap();
        let errors = &mut self.errors;
        let socket = &mut self.socket;
        let answer = tokio::time::timeout(PATIENCE, async {
            loop {
                let m = socket.next().await.expect("DevTools closed").unwrap();
                let Message::Text(t) = m else { continue };
                let v: Value = serde_json::from_str(&t).unwrap();
                if v["id"] == id {
                    return v;
                }
                match v["method"].as_str() {
                    Some("Log.entryAdded") if v["params"]["entry"]["level"] == "error" => {
                        let e = &v["params"]["entry"];
                        errors.push(format!("{} ({})", e["text"], e["url"]));
                    }
                    Some("Runtime.exceptionThrown") => {
                        errors.push(v["params"]["exceptionDetails"].to_string());
                    }
                    Some("Runtime.consoleAPICalled") if v["params"]["type"] == "error" => {
                        errors.push(v["params"]["args"].to_string());
                    }
                    _ => {}
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{method}: no answer"));
        assert!(answer.get("error").is_none(), "{method}: {answer}");
        answer["result"].clone()
    }

    pub async fn goto(&mut self, url: &str) {
        self.call("Page.navigate", json!({"url": url})).await;
        self.wait("document.readyState === 'complete'", "the page loads")
            .await;
    }

    /// Evaluates `js` in the page (awaiting a promise); its value.
    pub async fn eval(&mut self, js: &str) -> Value {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({"expression": js, "awaitPromise": true, "returnByValue": true}),
            )
            .await;
        if let Some(e) = r.get("exceptionDetails") {
            panic!("`{js}` threw: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Waits until `js` is true in the page.
    pub async fn wait(&mut self, js: &str, what: &str) {
        let started = Instant::now();
        loop {
            if self.eval(&format!("!!({js})")).await == json!(true) {
                return;
            }
            if started.elapsed() > PATIENCE {
                let body = self.eval("document.body.innerText").await;
                panic!("waited {PATIENCE:?} for {what} (`{js}`); the page shows:\n{body}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The text of the element `selector` selects.
    pub async fn text(&mut self, selector: &str) -> String {
        let js = format!(
            "(document.querySelector({}) || {{}}).innerText || ''",
            json!(selector)
        );
        self.eval(&js)
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    pub async fn click(&mut self, selector: &str) {
        let js = format!("document.querySelector({}).click()", json!(selector));
        self.eval(&js).await;
    }

    /// Submits a form as its submit button would (its `submit` handler runs).
    pub async fn submit(&mut self, selector: &str) {
        let js = format!(
            "document.querySelector({}).requestSubmit()",
            json!(selector)
        );
        self.eval(&js).await;
    }

    /// Sets a form control's value as a user typing it would (an `input` and a `change`
    /// event).
    pub async fn fill(&mut self, selector: &str, value: &str) {
        let js = format!(
            "(() => {{ const e = document.querySelector({}); e.value = {}; \
             e.dispatchEvent(new Event('input', {{bubbles: true}})); \
             e.dispatchEvent(new Event('change', {{bubbles: true}})); }})()",
            json!(selector),
            json!(value)
        );
        self.eval(&js).await;
    }

    /// A PNG of the page as it is now.
    /// axe-core's violations on the page as it is now: `id (impact): where` for each node.
    /// axe-core is the file `scripts/test` fetches (`target/axe/axe-VERSION.min.js`), run
    /// through DevTools (so the page's CSP does not apply to it).
    pub async fn axe_violations(&mut self) -> Vec<String> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target/axe")
            .join(format!("axe-{AXE_VERSION}.min.js"));
        let source = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "axe-core is not at {} ({e}): run scripts/test, which fetches it",
                path.display()
            )
        });
        if self.eval("typeof axe === 'undefined'").await == json!(true) {
            let r = self
                .call(
                    "Runtime.evaluate",
                    json!({"expression": source, "returnByValue": true}),
                )
                .await;
            assert!(r.get("exceptionDetails").is_none(), "axe-core: {r}");
        }
        let found = self
            .eval(
                "axe.run(document, {resultTypes: ['violations'], rules: {'target-size': {enabled: true}}}).then(r => r.violations.flatMap(v => \
                 v.nodes.map(n => `${v.id} (${v.impact}): ${n.target.join(' ')}: ${n.failureSummary}`)))",
            )
            .await;
        found
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .collect()
    }

    pub async fn screenshot(&mut self, path: &std::path::Path) {
        use base64::Engine;
        let r = self
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().unwrap())
            .unwrap();
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Chromium {
    /// Stops the browser's whole process group and waits (up to 5 s) until the browser has
    /// exited, so that none of its processes writes in the profile after it is removed
    /// (which left a directory behind in the system's temp dir at every launch).
    fn drop(&mut self) {
        if let Some(pid) = self.child.id().and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: kill sends a signal to the group this launch made; it reads no memory.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let _ = self.child.start_kill();
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
