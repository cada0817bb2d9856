//! The fleet manifest (`--fleet-manifest PATH`, `GET /fleet/manifest`): every worker's URLs and
//! KV-event endpoints, for scripts that put a router in front of the fleet.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// What a fleet serves, where.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The served model name (`--model-name`).
    pub model: String,
    /// Tokens per KV block (what a KV-aware router needs as its block size).
    pub block_size: usize,
    /// The admin listener (`--admin-port`): `/metrics` of the whole fleet and the routing judge,
    /// `/fleet/decisions`, `/fleet/manifest`.
    pub admin_url: Option<String>,
    /// Every worker, by index.
    pub workers: Vec<ManifestWorker>,
}

/// One worker of the manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestWorker {
    /// The worker's index (its `engine` label, its events' data-parallel rank).
    pub index: usize,
    /// Its OpenAI-compatible base URL (`http://HOST:PORT`).
    pub url: String,
    /// Its Prometheus endpoint.
    pub metrics_url: String,
    /// The ZeroMQ endpoint of its KV events: the address to subscribe to when it binds, the
    /// collector it connects to otherwise.
    pub kv_events_endpoint: Option<String>,
    /// Its replay (ROUTER) endpoint, with `--kv-events-replay-endpoint`.
    pub kv_events_replay_endpoint: Option<String>,
}

/// The address a client dials to reach a socket bound to `addr`: the loopback address of the
/// same family for an unspecified one (`0.0.0.0`, `::`).
pub(crate) fn dialable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), addr.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), addr.port())
        }
        _ => addr,
    }
}

impl Manifest {
    /// Pretty JSON, ending with a newline.
    pub fn to_json(&self) -> String {
        // A struct of strings and numbers always serializes.
        let mut json = serde_json::to_string_pretty(self).unwrap_or_default();
        json.push('\n');
        json
    }

    /// Writes the manifest to `path` whole: to a temporary file beside it, then renamed, so a
    /// reader never sees half of it.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = std::path::PathBuf::from(tmp);
        std::fs::write(&tmp, self.to_json())?;
        std::fs::rename(&tmp, path)
    }
}
