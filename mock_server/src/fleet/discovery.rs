//! The discovery file (`--discovery-file PATH`): the fleet's serving workers in the format of
//! llm-d's `file-discovery` plugin (its `EndpointsFile`), JSON, which that plugin reads as it
//! reads YAML:
//!
//! ```json
//! {"endpoints": [{"name": "mockserve-worker-0", "namespace": "default",
//!                 "address": "127.0.0.1", "port": "8001", "metricsHost": "127.0.0.1:8001",
//!                 "labels": {"llm-d.ai/role": "both", "servesim/worker": "0"}}]}
//! ```
//!
//! `port` is a string, as that plugin declares it. Every worker of a fleet prefills and decodes
//! its own requests, so its role label is `both`. The file is written whole (a temporary file
//! beside it, then renamed), so a reader never sees half of it.

use std::net::SocketAddr;
use std::path::Path;

use serde::Serialize;

/// The whole file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EndpointsFile {
    /// Every worker that takes requests, by index.
    pub endpoints: Vec<Endpoint>,
}

/// One worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Endpoint {
    /// `mockserve-worker-INDEX`: stable for the worker's index across scale events.
    pub name: String,
    /// Always `default` (the plugin's own default).
    pub namespace: String,
    /// The IP a client dials.
    pub address: String,
    /// The port, as a string.
    pub port: String,
    /// `ADDRESS:PORT` of its `/metrics` (the worker's own listener).
    #[serde(rename = "metricsHost")]
    pub metrics_host: String,
    /// `llm-d.ai/role: both` and `servesim/worker: INDEX`.
    pub labels: std::collections::BTreeMap<String, String>,
}

impl Endpoint {
    /// Worker `index` listening on `addr` (a dialable address).
    pub fn new(index: usize, addr: SocketAddr) -> Endpoint {
        let labels = [
            ("llm-d.ai/role".to_string(), "both".to_string()),
            ("servesim/worker".to_string(), index.to_string()),
        ]
        .into_iter()
        .collect();
        Endpoint {
            name: format!("mockserve-worker-{index}"),
            namespace: "default".into(),
            address: addr.ip().to_string(),
            port: addr.port().to_string(),
            metrics_host: addr.to_string(),
            labels,
        }
    }
}

impl EndpointsFile {
    /// Pretty JSON ending with a newline.
    pub fn to_json(&self) -> String {
        // Strings and maps of strings always serialize.
        let mut json = serde_json::to_string_pretty(self).unwrap_or_default();
        json.push('\n');
        json
    }

    /// Writes the file whole at `path` (a temporary file beside it, then renamed).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        write_whole(path, &self.to_json())
    }
}

/// Writes `text` to `path` whole: a temporary file beside it, then renamed over it.
pub(crate) fn write_whole(path: &Path, text: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_has_llm_d_file_discovery_fields() {
        let addr: SocketAddr = "127.0.0.1:8003".parse().expect("addr");
        let file = EndpointsFile {
            endpoints: vec![Endpoint::new(3, addr)],
        };
        let value: serde_json::Value = serde_json::from_str(&file.to_json()).expect("json");
        assert_eq!(
            value,
            serde_json::json!({"endpoints": [{
                "name": "mockserve-worker-3",
                "namespace": "default",
                "address": "127.0.0.1",
                "port": "8003",
                "metricsHost": "127.0.0.1:8003",
                "labels": {"llm-d.ai/role": "both", "servesim/worker": "3"},
            }]})
        );
        let v6: SocketAddr = "[::1]:9000".parse().expect("addr");
        let e = Endpoint::new(0, v6);
        assert_eq!((e.address.as_str(), e.port.as_str()), ("::1", "9000"));
        assert_eq!(e.metrics_host, "[::1]:9000");
    }
}
