//! The client commands against a server that is not ours: answers that never end, and
//! events cut anywhere. The CLI reads a bounded amount and says why it stopped.

use std::process::Stdio;
use std::time::Duration;

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::child::{agentserver, wait_exit, Running};
use crate::remote::{line_matching, spawn_lines};

/// A body of `start` and then `fill` repeated for ever.
fn endless(start: &'static str, fill: &'static str) -> Body {
    let fill = bytes::Bytes::from(fill.repeat(65_536 / fill.len()));
    let start =
        futures_util::stream::once(async move { bytes::Bytes::from_static(start.as_bytes()) });
    let rest = futures_util::stream::repeat_with(move || fill.clone());
    Body::from_stream(futures_util::StreamExt::map(
        futures_util::StreamExt::chain(start, rest),
        Ok::<_, std::convert::Infallible>,
    ))
}

/// One server-sent event whose every byte comes in a chunk of its own (a character's bytes
/// apart), and then nothing more, the stream left open.
fn bytewise(event: &'static str) -> Body {
    let bytes = futures_util::stream::iter(
        event
            .bytes()
            .map(|b| Ok::<_, std::convert::Infallible>(bytes::Bytes::from(vec![b]))),
    );
    Body::from_stream(futures_util::StreamExt::chain(
        bytes,
        futures_util::stream::pending(),
    ))
}

const EVENT: &str = "event: message\ndata: {\"event\":\"message\",\"message\":{\"from\":\"api\",\
    \"to\":\"greeter\",\"payload_type\":\"Greeting\",\"payload\":{\"name\":\"Zoë 日本\"},\
    \"payload_xml\":\"<Greeting><name>Zoë 日本</name></Greeting>\"}}\n\n";

/// Serves the hostile answers on a port of its own, for as long as the test runs.
fn hostile_server() -> String {
    let app = axum::Router::new()
        .route(
            "/api/v1/inject",
            post(|| async {
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    endless("overloaded ", "x"),
                )
                    .into_response()
            }),
        )
        .route(
            "/api/v1/inputs",
            get(|| async { endless("{\"items\": [", " ").into_response() }),
        )
        .route(
            "/api/v1/threads/{id}/events",
            get(
                |axum::extract::Path(id): axum::extract::Path<String>| async move {
                    let body = match id.as_str() {
                        "endless" => endless("data: ", "x"),
                        _ => bytewise(EVENT),
                    };
                    Response::builder()
                        .header("content-type", "text/event-stream")
                        .body(body)
                        .unwrap()
                },
            ),
        );
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    let addr = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    format!("http://{addr}")
}

/// Runs `agentserver ARGS` against the server: it must exit (an unbounded read would not),
/// with 1; its stderr.
fn refused(args: &[&str]) -> String {
    let mut child = Running::spawn(
        agentserver()
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    // Read meanwhile: a pipe left full would stop the process writing.
    let mut stderr = child.stderr.take().unwrap();
    let said = std::thread::spawn(move || {
        let mut said = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut said).unwrap();
        said
    });
    assert_eq!(wait_exit(&mut child), Some(1), "{args:?}");
    said.join().unwrap()
}

#[test]
fn an_endless_answer_is_read_only_so_far_and_a_cut_event_is_read_whole() {
    let url = hostile_server();

    // A refusal whose body never ends: its start is shown, 64 KiB at most.
    let said = refused(&["inject", "--url", &url, "--to", "x", "<X/>"]);
    assert!(
        said.contains("answered 500: overloaded xxx"),
        "{}",
        &said[..said.len().min(300)]
    );
    assert!(said.len() < 70_000, "{} bytes", said.len());

    // A 200 whose JSON never ends: refused past the bound, saying so.
    let said = refused(&["inputs", "--url", &url, "list"]);
    assert!(
        said.contains("the answer is over 268435456 bytes"),
        "{said}"
    );
    assert!(said.len() < 2_000, "{} bytes", said.len());

    // An event stream whose first event never ends.
    let said = refused(&["tail", "--thread", "endless", "--url", &url]);
    assert!(said.contains("an event over 268435456 bytes"), "{said}");

    // An event that comes a byte at a time (each character's bytes in chunks apart) is
    // printed whole, its characters intact.
    let mut cmd = agentserver();
    cmd.args(["tail", "--thread", "bytewise", "--json", "--url", &url]);
    let (_child, lines) = spawn_lines(cmd);
    let line = line_matching(&lines, |l| l.contains("Greeting"));
    assert!(line.contains("Zoë 日本"), "{line}");
    assert!(!line.contains('\u{FFFD}'), "{line}");
}
