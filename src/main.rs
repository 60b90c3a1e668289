//! The `agentserver` command line: parse arguments, call the library.
//!
//! ## Inside
//!
//! The CLI only: parses arguments, calls the library. It sets mimalloc as the global allocator
//! and, first thing in `main`, routes libxml2's allocations to it too
//! (`schema::use_mimalloc_for_libxml2`, unsafe: only before libxml2 has allocated), and turns
//! transparent huge pages off for the process (`disable_transparent_huge_pages`: a refaulted 2
//! MiB page is zeroed whole, which made large payloads cost twice). The library sets none of
//! these; the load generator and pump bench do the same as the binary.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use agentserver::client::stream::StreamArgs;
use agentserver::client::InjectBody;
use agentserver::client::{self, ServerArgs, TailFilter};
use agentserver::config;
use agentserver::server;
use agentserver::Organism;

/// mimalloc instead of the system allocator: the pump allocates per message (records, events,
/// frames), and on 2 cores glibc's malloc cost about a fifth of chain throughput
/// (docs/benchmarks-log.md, "allocator"). `main` routes libxml2's allocations to it too.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "agentserver",
    version,
    about = "Runs a multi-agent organism of XSD-validated XML listeners"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check an organism file; list every problem and exit 1, or exit 0.
    Validate { organism: PathBuf },
    /// Run the organism in-process, inject one message, print its thread as JSON lines.
    /// Exits 0 if the thread completed, 1 otherwise.
    Send {
        organism: PathBuf,
        /// The listener that receives the payload.
        #[arg(long)]
        to: String,
        /// The payload: XML, or a JSON object written as the type the listener accepts (as
        /// `inject` takes it); or @FILE to read either from a file.
        payload: String,
        /// Continue this thread id instead of opening a new one.
        #[arg(long)]
        thread: Option<String>,
        /// Give up waiting for the thread after this many seconds.
        #[arg(long, default_value_t = 30)]
        timeout: u64,
    },
    /// Start the organism and its API; run until Ctrl-C, SIGTERM or `POST
    /// /api/v1/organism/stop`, then stop gracefully (exit 0; 1 if the store could not
    /// commit everything).
    Run {
        organism: PathBuf,
        /// API bind address, `HOST:PORT` or a port alone (`8799` is `127.0.0.1:8799`); overrides `organism.listen`.
        #[arg(long)]
        listen: Option<String>,
        /// SQLite file, or `memory` (overrides `organism.store`).
        #[arg(long)]
        store: Option<String>,
        /// Serve beyond loopback without authentication (only on a network that is yours
        /// alone; a warning is logged every minute).
        #[arg(long)]
        insecure_no_auth: bool,
    },
    /// Run the handlers of listeners placed on workers (`placement: workers`) for the
    /// organism's pump, through NATS (`organism.nats`); run as many as you like, on any
    /// machine with the same organism file. Stops on Ctrl-C or SIGTERM after answering the
    /// deliveries under way.
    Worker {
        organism: PathBuf,
        /// The listeners to serve, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        listeners: Vec<String>,
        /// The NATS server (replaces `organism.nats.url`).
        #[arg(long)]
        nats: Option<String>,
        /// Deliveries of each listener run at once here (default: its `concurrency`).
        #[arg(long)]
        concurrency: Option<usize>,
        /// This worker's name in logs and results (default `worker-PID`).
        #[arg(long)]
        name: Option<String>,
    },
    /// Serve `/ws/messages` from an organism's mirrored events in NATS, without touching its
    /// pump; run as many as observers need. Prints `agentserver listening on http://ADDR`.
    Gateway {
        #[command(flatten)]
        stream: StreamArgs,
        /// Address to serve on, `HOST:PORT` or a port alone.
        #[arg(long, default_value = "127.0.0.1:8770")]
        listen: String,
        /// Events held for `?since=` and slow clients.
        #[arg(long, default_value_t = agentserver::api::gateway::DEFAULT_RETAIN)]
        retain: usize,
        /// The organism's file: check credentials as its `auth` says (keys, JWT) and show
        /// tenants only their own messages.
        #[arg(long, value_name = "ORGANISM.yaml")]
        auth_from: Option<PathBuf>,
        /// Without --auth-from, serve beyond loopback anyway (every client sees every
        /// message).
        #[arg(long)]
        insecure_no_auth: bool,
    },
    /// Rebuild a store file from an organism's mirrored events in NATS (the recovery path
    /// when the pump's machine is lost). Writes a new file; prints what it wrote.
    Restore {
        #[command(flatten)]
        stream: StreamArgs,
        /// Read the events from NATS (the only source there is).
        #[arg(long = "from-nats", required = true)]
        from_nats: bool,
        /// The store file to write (must not exist).
        #[arg(long)]
        store: PathBuf,
    },
    /// Create, list and revoke the organism's API keys (in its store file, or in
    /// `auth.keys_file` with `store: memory`); works while the server runs.
    Keys {
        #[command(subcommand)]
        action: client::keys::KeysCommand,
    },
    /// Stream a running server's messages (`/ws/messages`), one line per message.
    Tail {
        #[command(flatten)]
        server: ServerArgs,
        #[command(flatten)]
        filter: TailFilter,
        /// Print the raw JSON frames instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Post one message to a running server; prints `{"thread_id", "message_id"}`.
    Inject {
        #[command(flatten)]
        server: ServerArgs,
        /// The listener that receives the payload.
        #[arg(long)]
        to: String,
        /// The payload: XML, a JSON object (mapped in schema order), or @FILE.
        payload: String,
        /// Continue (or open) this thread id.
        #[arg(long)]
        thread: Option<String>,
        /// The payload type of a JSON payload, when the listener accepts several.
        #[arg(long = "type")]
        payload_type: Option<String>,
        /// Name this inject: run again with the same key (and payload), it runs once.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// A label for its thread, `KEY=VALUE`; repeatable.
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// `--wait` or `--wait=SECONDS`: wait (default 30 s, at most 60) until the thread is no longer
        /// active; print its messages as JSON lines; exit 0 if it completed, 1 otherwise.
        #[arg(long, value_name = "SECONDS", num_args = 0..=1, require_equals = true, default_missing_value = "30")]
        wait: Option<u64>,
    },
    /// Create and delete Lua agents on a running server (see README "For tenants").
    Agents {
        #[command(flatten)]
        server: ServerArgs,
        /// Print the server's JSON answers.
        #[arg(long, global = true)]
        json: bool,
        #[command(subcommand)]
        action: client::agents::AgentsCommand,
    },
    /// The inbox of a running server: list, show, approve (or edit), reject, answer.
    Inputs {
        #[command(flatten)]
        server: ServerArgs,
        /// Print the server's JSON answers.
        #[arg(long, global = true)]
        json: bool,
        #[command(subcommand)]
        action: client::inputs::InputsCommand,
    },
    /// Abort a thread on a running server: its work stops, the thread stays usable.
    Abort {
        #[command(flatten)]
        server: ServerArgs,
        thread: String,
        /// Why: every message the abort stops says it.
        #[arg(long)]
        reason: Option<String>,
        /// Print the server's JSON answer.
        #[arg(long)]
        json: bool,
    },
    /// Fork, rewind, pause or resume a thread, retry a message, or act on every thread a
    /// filter finds, on a running server.
    Threads {
        #[command(flatten)]
        server: ServerArgs,
        /// Print the server's JSON answers.
        #[arg(long, global = true)]
        json: bool,
        #[command(subcommand)]
        action: client::threads::ThreadsCommand,
    },
    /// Upload, list, deploy and roll back an agent's script versions on a running server.
    Scripts {
        #[command(flatten)]
        server: ServerArgs,
        /// Print the server's JSON answers.
        #[arg(long, global = true)]
        json: bool,
        #[command(subcommand)]
        action: client::agents::ScriptsCommand,
    },
}

fn main() -> ExitCode {
    // SAFETY: first thing in the process; libxml2 has allocated nothing yet.
    if !unsafe { agentserver::schema::use_mimalloc_for_libxml2() } {
        eprintln!("warning: libxml2 keeps the system allocator");
    }
    agentserver::disable_transparent_huge_pages();
    agentserver::log_to_stderr();
    let cli = Cli::parse();
    match cli.command {
        Command::Validate { organism } => validate(&organism),
        Command::Send {
            organism,
            to,
            payload,
            thread,
            timeout,
        } => with_runtime(send(organism, to, payload, thread, timeout)),
        Command::Run {
            organism,
            listen,
            store,
            insecure_no_auth,
        } => with_runtime(run(organism, listen, store, insecure_no_auth)),
        Command::Keys { action } => client::keys::run(action, load),
        Command::Gateway {
            stream,
            listen,
            retain,
            auth_from,
            insecure_no_auth,
        } => {
            let auth_from = match auth_from.as_deref().map(load).transpose() {
                Ok(c) => c,
                Err(code) => return code,
            };
            with_runtime(gateway(
                stream,
                listen_address(listen),
                retain,
                auth_from,
                insecure_no_auth,
            ))
        }
        Command::Restore { stream, store, .. } => with_runtime(restore(stream, store)),
        Command::Worker {
            organism,
            listeners,
            nats,
            concurrency,
            name,
        } => with_runtime(worker(agentserver::pump::worker::WorkerOptions {
            organism,
            listeners,
            nats_url: nats,
            concurrency,
            name: name.unwrap_or_else(|| format!("worker-{}", std::process::id())),
        })),
        Command::Agents {
            server,
            json,
            action,
        } => with_runtime(agent_command("agents", server, async move |r| {
            client::agents::agents(r, action, json).await
        })),
        Command::Inputs {
            server,
            json,
            action,
        } => with_runtime(agent_command("inputs", server, async move |r| {
            client::inputs::inputs(r, action, json).await
        })),
        Command::Abort {
            server,
            thread,
            reason,
            json,
        } => with_runtime(agent_command("abort", server, async move |r| {
            client::inputs::abort(r, &thread, reason, json).await
        })),
        Command::Threads {
            server,
            json,
            action,
        } => with_runtime(agent_command("threads", server, async move |r| {
            client::threads::threads(r, action, json).await
        })),
        Command::Scripts {
            server,
            json,
            action,
        } => with_runtime(agent_command("scripts", server, async move |r| {
            client::agents::scripts(r, action, json).await
        })),
        Command::Tail {
            server,
            filter,
            json,
        } => with_runtime(tail(server, filter, json)),
        Command::Inject {
            server,
            to,
            payload,
            thread,
            payload_type,
            idempotency_key,
            labels,
            wait,
        } => with_runtime(inject(
            server,
            InjectArgs {
                to,
                payload,
                thread_id: thread,
                idempotency_key,
                payload_type,
                labels,
            },
            wait,
        )),
    }
}

/// `agents …` / `scripts …`: prints what the command returns, or says why it failed (exit
/// 1 for the server's refusal or an unreachable server, 2 for a file that cannot be read).
async fn agent_command(
    what: &str,
    server: ServerArgs,
    run: impl AsyncFnOnce(&client::Remote) -> Result<String, client::agents::Failed>,
) -> ExitCode {
    let remote = match server.remote() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("agentserver {what}: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(&remote).await {
        Ok(text) => {
            if !text.is_empty() {
                println!("{text}");
            }
            ExitCode::SUCCESS
        }
        Err(f) => {
            if let Some(report) = &f.report {
                println!("{report}");
            }
            eprintln!("agentserver {what}: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

async fn tail(server: ServerArgs, filter: TailFilter, json: bool) -> ExitCode {
    let remote = match server.remote() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("agentserver tail: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut stdout = std::io::stdout();
    match client::tail(&remote, &filter, json, &mut stdout).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agentserver tail: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What `inject` posts, as given on the command line.
struct InjectArgs {
    to: String,
    payload: String,
    thread_id: Option<String>,
    idempotency_key: Option<String>,
    payload_type: Option<String>,
    labels: Vec<String>,
}

async fn inject(server: ServerArgs, args: InjectArgs, wait: Option<u64>) -> ExitCode {
    let remote = match server.remote() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("agentserver inject: {e}");
            return ExitCode::FAILURE;
        }
    };
    let InjectArgs {
        to,
        payload,
        thread_id,
        idempotency_key,
        payload_type,
        labels,
    } = args;
    let thread_labels = match client::label_args(&labels) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("agentserver inject: {e}");
            return ExitCode::from(2);
        }
    };
    let text = match read_payload(&payload) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("agentserver inject: {e}");
            return ExitCode::from(2);
        }
    };
    let (payload, payload_xml) = if text.trim_start().starts_with('{') {
        match serde_json::from_str(&text) {
            Ok(v) => (Some(v), None),
            Err(e) => {
                eprintln!("agentserver inject: the payload looks like JSON but is not: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        (None, Some(text))
    };
    let body = InjectBody {
        to,
        payload,
        payload_xml,
        payload_type,
        thread_id,
        idempotency_key,
        labels: (!thread_labels.is_empty()).then_some(thread_labels),
    };
    if let Some(seconds) = wait {
        return inject_and_wait(&remote, &body, seconds).await;
    }
    match client::inject(&remote, &body).await {
        Ok(receipt) => {
            let receipt = agentserver::api::view::InjectReceipt::from(receipt);
            println!("{}", serde_json::to_string(&receipt).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("agentserver inject: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `inject --wait`: the thread's messages as JSON lines; exit 0 if it completed.
async fn inject_and_wait(remote: &client::Remote, body: &InjectBody, seconds: u64) -> ExitCode {
    let answer = match client::inject_and_wait(remote, body, seconds).await {
        Ok(a) => a,
        Err(e) => {
            eprintln!("agentserver inject: {e}");
            return ExitCode::FAILURE;
        }
    };
    for m in answer["messages"].as_array().into_iter().flatten() {
        println!("{m}");
    }
    let thread = answer["thread_id"].as_str().unwrap_or_default();
    match answer["thread_status"].as_str() {
        Some("completed") => ExitCode::SUCCESS,
        Some("active") => {
            eprintln!("agentserver inject: thread {thread} still active after {seconds}s");
            ExitCode::FAILURE
        }
        other => {
            eprintln!(
                "agentserver inject: thread {thread} ended {}",
                other.unwrap_or("?")
            );
            ExitCode::FAILURE
        }
    }
}

fn with_runtime(fut: impl std::future::Future<Output = ExitCode>) -> ExitCode {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(fut),
        Err(e) => {
            eprintln!("agentserver: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

fn load(path: &Path) -> Result<config::OrganismConfig, ExitCode> {
    Organism::builder().load_config(path).map_err(|errors| {
        for e in &errors.0 {
            eprintln!("{e}");
        }
        eprintln!("{}: {} problem(s)", path.display(), errors.0.len());
        ExitCode::FAILURE
    })
}

fn validate(path: &Path) -> ExitCode {
    match load(path) {
        Ok(c) => {
            if let Err(e) = agentserver::api::check_tls(&c) {
                eprintln!("{e}");
                eprintln!("{}: 1 problem(s)", path.display());
                return ExitCode::FAILURE;
            }
            warn_at_validate(&c);
            println!("{}: ok ({} listeners)", path.display(), c.listeners.len());
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

/// What `validate` warns of: the file's slow schema patterns (`run` warns of them too), and
/// an address beyond loopback without authentication, which `run` refuses.
fn warn_at_validate(c: &config::OrganismConfig) {
    for w in config::slow_pattern_warnings(c) {
        eprintln!("WARNING: {w}");
    }
    if !c.auth.enabled() && !config::listen_is_loopback(&c.listen) {
        eprintln!(
            "WARNING: the API listens on {}, beyond this machine, and the organism has no \
             auth.methods: `agentserver run` refuses to serve it (add `auth: {{methods: \
             [keys]}}`, or pass --insecure-no-auth on a network that is yours alone).",
            c.listen
        );
    }
}

/// `agentserver keys …`: works on the organism's keys directly (no server needed).
/// `--listen 8799` means `127.0.0.1:8799`.
fn listen_address(listen: String) -> String {
    if !listen.is_empty() && listen.bytes().all(|b| b.is_ascii_digit()) {
        format!("127.0.0.1:{listen}")
    } else {
        listen
    }
}

fn read_payload(arg: &str) -> Result<String, String> {
    match arg.strip_prefix('@') {
        Some(file) => std::fs::read_to_string(file).map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => {
                format!("cannot read {file}: it is not UTF-8 text (a payload is XML or JSON text)")
            }
            _ => format!("cannot read {file}: {e}"),
        }),
        None => Ok(arg.to_string()),
    }
}

async fn send(
    path: PathBuf,
    to: String,
    payload: String,
    thread: Option<String>,
    timeout: u64,
) -> ExitCode {
    let payload = match read_payload(&payload) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("agentserver: {e}");
            return ExitCode::from(2);
        }
    };
    let config = match load(&path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let request = server::SendRequest {
        to,
        payload,
        thread,
        timeout: Duration::from_secs(timeout),
    };
    match server::send(config, request).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(server::SendError::Usage(e)) => {
            eprintln!("agentserver: {e}");
            ExitCode::from(2)
        }
        Err(server::SendError::Failed(e)) => {
            eprintln!("agentserver: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(
    path: PathBuf,
    listen: Option<String>,
    store: Option<String>,
    insecure_no_auth: bool,
) -> ExitCode {
    if store.as_deref().is_some_and(|s| s.trim().is_empty()) {
        eprintln!("agentserver: --store needs a file path (such as data/organism.db) or memory");
        return ExitCode::from(2);
    }
    let config = match load(&path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let options = server::RunOptions {
        listen: listen.map(listen_address),
        store: store.map(|s| (s != "memory").then(|| PathBuf::from(s))),
        insecure_no_auth,
    };
    match server::run(config, options).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agentserver: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn gateway(
    stream: StreamArgs,
    listen: String,
    retain: usize,
    auth_from: Option<config::OrganismConfig>,
    insecure: bool,
) -> ExitCode {
    match server::gateway(stream.config(), &listen, retain, auth_from, insecure).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agentserver gateway: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn restore(stream: StreamArgs, store: PathBuf) -> ExitCode {
    match server::restore(&stream.config(), &store).await {
        Ok(r) => {
            println!(
                "{}: restored {} events ({} messages), seq {} to {}{}",
                store.display(),
                r.events,
                r.messages,
                r.first_seq,
                r.last_seq,
                if r.missing > 0 {
                    format!("; {} events missing from the stream", r.missing)
                } else {
                    String::new()
                }
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("agentserver restore: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn worker(options: agentserver::pump::worker::WorkerOptions) -> ExitCode {
    let name = options.name.clone();
    match server::worker(options).await {
        Ok(answered) => {
            eprintln!("agentserver worker {name}: stopped; answered {answered} deliveries");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("agentserver worker: {e}");
            ExitCode::FAILURE
        }
    }
}
