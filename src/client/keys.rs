//! `agentserver keys create|list|revoke`: the organism's API keys, in its store file (or
//! `auth.keys_file`), with no server needed (a running one sees each change at once).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::config::OrganismConfig;

#[derive(clap::Subcommand, Debug)]
pub enum KeysCommand {
    /// Create a key; prints what it is, then the key alone on the last line (shown once).
    Create {
        organism: PathBuf,
        /// Unique among live keys: letters, digits, `.`, `_`, `-`.
        #[arg(long)]
        name: String,
        /// viewer, operator or admin.
        #[arg(long)]
        role: String,
        /// The tenant the key acts for (none: the whole organism).
        #[arg(long)]
        tenant: Option<String>,
        /// Lifetime: 30d, 12h, 15m (none: until revoked).
        #[arg(long)]
        expires: Option<String>,
        /// The key's own injects per second (over `auth.inject_per_s`).
        #[arg(long)]
        inject_per_s: Option<u32>,
        /// The key's own burst above its rate (needs --inject-per-s).
        #[arg(long)]
        burst: Option<u32>,
        /// The store file (overrides `organism.store`).
        #[arg(long)]
        store: Option<String>,
    },
    /// List every key (revoked ones too); never a secret.
    List {
        organism: PathBuf,
        #[arg(long)]
        store: Option<String>,
    },
    /// Revoke a key by name or id: refused from then on.
    Revoke {
        organism: PathBuf,
        /// The key's name or id.
        key: String,
        #[arg(long)]
        store: Option<String>,
    },
}

/// Runs one `keys` command; `load` reads the organism file (printing its problems).
pub fn run(
    action: KeysCommand,
    load: impl Fn(&Path) -> Result<OrganismConfig, ExitCode>,
) -> ExitCode {
    use crate::access::{KeySource, NewKeyError, Role};
    let (path, store) = match &action {
        KeysCommand::Create {
            organism, store, ..
        }
        | KeysCommand::List { organism, store }
        | KeysCommand::Revoke {
            organism, store, ..
        } => (organism, store),
    };
    let mut config = match load(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if let Some(s) = store {
        config.store = (s != "memory").then(|| PathBuf::from(s));
    }
    let source = match KeySource::of(&config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("agentserver: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !config.auth.uses(crate::config::AuthMethod::Keys) {
        eprintln!(
            "agentserver: note: {} has no `keys` in auth.methods, so the server does not \
             accept these keys yet",
            path.display()
        );
    }
    let now = crate::time::Timestamp::now();
    match action {
        KeysCommand::Create {
            name,
            role,
            tenant,
            expires,
            inject_per_s,
            burst,
            ..
        } => {
            let Some(role) = Role::parse(&role) else {
                eprintln!("agentserver: --role is viewer, operator or admin (got `{role}`)");
                return ExitCode::from(2);
            };
            let (key, row) = match crate::access::new_key_with_rate(
                &name,
                role,
                tenant.as_deref(),
                expires.as_deref(),
                (inject_per_s, burst),
            ) {
                Ok(k) => k,
                Err(NewKeyError::Field { field, message }) => {
                    eprintln!("agentserver: --{}: {message}", field.replace('_', "-"));
                    return ExitCode::from(2);
                }
                Err(e) => {
                    eprintln!("agentserver: {e}");
                    return ExitCode::FAILURE;
                }
            };
            if let Err(e) = source.add(&row) {
                eprintln!("agentserver: {e}");
                return ExitCode::FAILURE;
            }
            println!("{}", key_line(&row));
            println!("the key is shown this once; keep it now:");
            println!("{key}");
            ExitCode::SUCCESS
        }
        KeysCommand::List { .. } => match source.list() {
            Ok(rows) => {
                for row in &rows {
                    println!("{}", key_line(row));
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("agentserver: {e}");
                ExitCode::FAILURE
            }
        },
        KeysCommand::Revoke { key, .. } => match source.revoke(&key, now) {
            Ok(Some(row)) => {
                println!("revoked {}", key_line(&row));
                ExitCode::SUCCESS
            }
            Ok(None) => {
                eprintln!(
                    "agentserver: no live key named `{key}` in {}",
                    source.describe()
                );
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("agentserver: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// One key as `keys list` shows it.
fn key_line(k: &crate::store::keys::KeyRow) -> String {
    let time = |t: Option<crate::time::Timestamp>| t.map_or("-".to_string(), |t| t.to_rfc3339());
    format!(
        "{} id={} role={} tenant={} created={} expires={} last_used={} revoked={}{}",
        k.name,
        k.id,
        k.role,
        k.tenant.as_deref().unwrap_or("-"),
        k.created.to_rfc3339(),
        time(k.expires),
        time(k.last_used),
        time(k.revoked),
        match k.inject_per_s {
            Some(r) => format!(" inject_per_s={r} burst={}", k.burst.unwrap_or(r)),
            None => String::new(),
        }
    )
}
