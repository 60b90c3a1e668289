//! The arguments of the commands that read an organism's mirrored event stream (`restore`,
//! `gateway`): which NATS server, which organism's streams.

use crate::config::NatsConfig;

/// Which stream to read: the server, and the organism's name or the stream prefix.
#[derive(Debug, Clone, clap::Args)]
pub struct StreamArgs {
    /// The NATS server (`nats://host:port`, several comma-separated).
    #[arg(long = "nats", value_name = "URL")]
    pub url: String,
    /// The organism's name: its streams are `agentserver_<NAME>_…` unless its file sets
    /// `organism.nats.stream_prefix` (then give that with --stream-prefix).
    #[arg(long, required_unless_present = "stream_prefix")]
    pub organism: Option<String>,
    /// The organism's `organism.nats.stream_prefix`.
    #[arg(long, conflicts_with = "organism")]
    pub stream_prefix: Option<String>,
    /// The NATS credential (`user:password` or a token).
    #[arg(long, env = "AGENTSERVER_NATS_CREDENTIALS", hide_env_values = true)]
    pub nats_credentials: Option<String>,
}

impl StreamArgs {
    pub fn config(&self) -> NatsConfig {
        let prefix = match (&self.stream_prefix, &self.organism) {
            (Some(p), _) => p.clone(),
            (None, Some(name)) => NatsConfig::default_prefix(name),
            (None, None) => NatsConfig::default_prefix(""),
        };
        NatsConfig::client(&self.url, &prefix, self.nats_credentials.clone())
    }
}
