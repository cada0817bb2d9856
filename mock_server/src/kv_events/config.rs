//! The `mockserve serve` KV-event flags ([`KvEventsArgs`]), their validated value
//! ([`KvEventsConfig`]), the ZeroMQ endpoint each rank derives its ports from ([`ZmqEndpoint`])
//! and why publishing cannot start ([`KvEventsError`]).

use clap::Args;

use super::faults::EventFaults;
use super::wire::WireFormat;

/// `mockserve serve` flags for publishing KV events.
#[derive(Args, Clone, Debug, Default, PartialEq, Eq)]
#[command(next_help_heading = "KV events")]
pub struct KvEventsArgs {
    /// Publish every worker's KV events on this ZeroMQ endpoint, as vLLM does (e.g.
    /// `tcp://*:5557`): `*` binds, a host connects; worker N publishes on the port + N.
    #[arg(long, value_name = "ENDPOINT")]
    pub kv_events_endpoint: Option<String>,

    /// Serve missed batches on this ZeroMQ ROUTER endpoint (port + N for worker N), e.g.
    /// `tcp://*:5600`.
    #[arg(long, value_name = "ENDPOINT", requires = "kv_events_endpoint")]
    pub kv_events_replay_endpoint: Option<String>,

    /// Topic frame of every message (vLLM's default is empty).
    #[arg(long, value_name = "TOPIC", default_value = "")]
    pub kv_events_topic: String,

    /// MessagePack encoding of the batches.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = WireFormat::Array)]
    pub kv_events_format: WireFormat,

    /// Seeded faults on delivery, to test a router's recovery: comma-separated drop=P,
    /// duplicate=P, reorder=P (per batch, 0 to 1), delay=MS (every batch, 0 to 60000) and
    /// seed=N, e.g. `drop=0.05,seed=1`. Numbering and replay stay exact: a dropped batch is a
    /// gap the replay endpoint fills.
    #[arg(long, value_name = "SPEC", requires = "kv_events_endpoint")]
    pub kv_events_faults: Option<EventFaults>,
}

impl KvEventsArgs {
    /// The validated configuration; None without `--kv-events-endpoint`.
    pub fn config(&self) -> Result<Option<KvEventsConfig>, KvEventsError> {
        let Some(endpoint) = &self.kv_events_endpoint else {
            return Ok(None);
        };
        Ok(Some(KvEventsConfig {
            endpoint: ZmqEndpoint::parse_flag(ENDPOINT_FLAG, endpoint)?,
            replay_endpoint: self
                .kv_events_replay_endpoint
                .as_deref()
                .map(|e| ZmqEndpoint::parse_flag(REPLAY_FLAG, e))
                .transpose()?,
            topic: self.kv_events_topic.clone(),
            format: self.kv_events_format,
            faults: self.kv_events_faults,
        }))
    }
}

/// Where and how KV events are published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEventsConfig {
    /// The PUB endpoint of rank 0.
    pub endpoint: ZmqEndpoint,
    /// The ROUTER endpoint of rank 0 for replay, if any.
    pub replay_endpoint: Option<ZmqEndpoint>,
    /// The topic frame.
    pub topic: String,
    /// The payload encoding.
    pub format: WireFormat,
    /// Faults injected on delivery.
    pub faults: Option<EventFaults>,
}

/// Why KV events cannot be published.
#[derive(Debug, thiserror::Error)]
pub enum KvEventsError {
    /// The endpoint is not `tcp://HOST:PORT`.
    #[error("{flag}: invalid KV events endpoint {endpoint:?}: {reason}")]
    BadEndpoint {
        /// The endpoint's flag.
        flag: &'static str,
        /// As given (cut to 64 characters).
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The port of the last rank is beyond 65535.
    #[error(
        "{flag} {endpoint}: worker {rank} would use port {port}, beyond 65535 (the port plus \
         the number of workers minus one must be at most 65535)"
    )]
    PortOverflow {
        /// The endpoint's flag.
        flag: &'static str,
        /// As given.
        endpoint: String,
        /// The rank.
        rank: usize,
        /// Base port + rank.
        port: usize,
    },
    /// The replay ports of some ranks are publish ports of others.
    #[error(
        "--kv-events-replay-endpoint {replay}: its ports {replay_first}..={replay_last} (one \
         per worker) overlap the publish ports {first}..={last} of --kv-events-endpoint \
         {endpoint}"
    )]
    PortCollision {
        /// The publish endpoint, as given.
        endpoint: String,
        /// Its first and last port.
        first: usize,
        /// Its last port.
        last: usize,
        /// The replay endpoint, as given.
        replay: String,
        /// Its first port.
        replay_first: usize,
        /// Its last port.
        replay_last: usize,
    },
    /// Binding failed (the port is in use, the address is not local, ...).
    #[error("{flag} {endpoint}: worker {rank} cannot bind {addr}: {error}")]
    Bind {
        /// The endpoint's flag.
        flag: &'static str,
        /// As given.
        endpoint: String,
        /// The rank.
        rank: usize,
        /// The address bound.
        addr: String,
        /// The socket's error (its text is part of this error's, so it is no `source`).
        error: std::io::Error,
    },
}

impl KvEventsConfig {
    /// Checks the port ranges `num_ranks` workers use: each endpoint's last port within 65535,
    /// and the replay ports apart from the publish ports. Port 0 (any free port) is exempt.
    pub(crate) fn check_ports(&self, num_ranks: usize) -> Result<(), KvEventsError> {
        let last_rank = num_ranks.saturating_sub(1);
        let range = |endpoint: &ZmqEndpoint, flag| {
            let first = usize::from(endpoint.port);
            let last = first + last_rank;
            if first != 0 && last > usize::from(u16::MAX) {
                return Err(KvEventsError::PortOverflow {
                    flag,
                    endpoint: endpoint.text.clone(),
                    rank: last_rank,
                    port: last,
                });
            }
            Ok((first, last))
        };
        let (first, last) = range(&self.endpoint, ENDPOINT_FLAG)?;
        let Some(replay) = &self.replay_endpoint else {
            return Ok(());
        };
        let (replay_first, replay_last) = range(replay, REPLAY_FLAG)?;
        let same_host = self.endpoint.host == replay.host || self.endpoint.bind || replay.bind;
        if first != 0
            && replay_first != 0
            && same_host
            && first <= replay_last
            && replay_first <= last
        {
            return Err(KvEventsError::PortCollision {
                endpoint: self.endpoint.text.clone(),
                first,
                last,
                replay: replay.text.clone(),
                replay_first,
                replay_last,
            });
        }
        Ok(())
    }
}

/// A TCP ZeroMQ endpoint, bound (`*`, `0.0.0.0`, `::`) or connected (any other host).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZmqEndpoint {
    /// As given (for messages).
    pub text: String,
    /// The host to bind or connect to (`*` already turned into an address).
    pub host: String,
    /// Rank 0's port.
    pub port: u16,
    /// Bind (`*` and the unspecified addresses) or connect.
    pub bind: bool,
}

impl ZmqEndpoint {
    /// Parses `tcp://HOST:PORT` (an IPv6 host in brackets), as `--kv-events-endpoint`.
    pub fn parse(text: &str) -> Result<ZmqEndpoint, KvEventsError> {
        ZmqEndpoint::parse_flag(ENDPOINT_FLAG, text)
    }

    /// Parses `tcp://HOST:PORT` given to `flag`, which an error names.
    pub fn parse_flag(flag: &'static str, text: &str) -> Result<ZmqEndpoint, KvEventsError> {
        let bad = |reason: &str| KvEventsError::BadEndpoint {
            flag,
            endpoint: match text.char_indices().nth(64) {
                Some((end, _)) => format!("{}...", &text[..end]),
                None => text.to_string(),
            },
            reason: reason.to_string(),
        };
        let rest = text
            .strip_prefix("tcp://")
            .ok_or_else(|| bad("expected tcp://HOST:PORT (only TCP is supported)"))?;
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| bad("expected tcp://HOST:PORT"))?;
        let port: u16 = port
            .parse()
            .map_err(|_| bad("the port must be a number from 0 to 65535"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(bad("the host is empty (use * to bind every interface)"));
        }
        let (host, bind) = match host {
            "*" | "0.0.0.0" => ("0.0.0.0".to_string(), true),
            "::" => ("[::]".to_string(), true),
            h if h.contains(':') => (format!("[{h}]"), false),
            h => (h.to_string(), false),
        };
        Ok(ZmqEndpoint {
            text: text.to_string(),
            host,
            port,
            bind,
        })
    }

    /// The endpoint of `rank`: the port offset by the rank (port 0 stays 0: any free port).
    pub(crate) fn for_rank(&self, rank: usize) -> Result<String, KvEventsError> {
        Ok(format!("tcp://{}", self.addr_for_rank(rank)?))
    }

    /// The `HOST:PORT` of `rank` (to bind or connect to).
    pub(crate) fn addr_for_rank(&self, rank: usize) -> Result<String, KvEventsError> {
        let port = if self.port == 0 {
            0
        } else {
            usize::from(self.port) + rank
        };
        if port > usize::from(u16::MAX) {
            return Err(KvEventsError::PortOverflow {
                flag: ENDPOINT_FLAG,
                endpoint: self.text.clone(),
                rank,
                port,
            });
        }
        Ok(format!("{}:{port}", self.host))
    }
}

/// The flag of the PUB endpoint, for messages.
pub(super) const ENDPOINT_FLAG: &str = "--kv-events-endpoint";
/// The flag of the replay endpoint, for messages.
pub(super) const REPLAY_FLAG: &str = "--kv-events-replay-endpoint";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn star_binds_and_hosts_connect() {
        let e = ZmqEndpoint::parse("tcp://*:5557").expect("valid");
        assert!(e.bind);
        assert_eq!(e.for_rank(3).expect("in range"), "tcp://0.0.0.0:5560");
        let e = ZmqEndpoint::parse("tcp://127.0.0.1:5557").expect("valid");
        assert!(!e.bind);
        assert_eq!(e.for_rank(0).expect("in range"), "tcp://127.0.0.1:5557");
        let e = ZmqEndpoint::parse("tcp://[::]:9").expect("valid");
        assert!(e.bind);
        assert_eq!(e.for_rank(1).expect("in range"), "tcp://[::]:10");
    }

    #[test]
    fn bad_endpoints_say_why() {
        for (bad, why) in [
            ("5557", "tcp://"),
            ("ipc:///tmp/x", "only TCP"),
            ("tcp://*", "HOST:PORT"),
            ("tcp://*:port", "port must be a number"),
            ("tcp://*:70000", "port must be a number"),
            ("tcp://:5557", "host is empty"),
        ] {
            let e = ZmqEndpoint::parse(bad).expect_err(bad).to_string();
            assert!(e.contains(why) && e.contains(bad), "{bad}: {e}");
            assert!(e.starts_with("--kv-events-endpoint: "), "{e}");
        }
        let e = ZmqEndpoint::parse_flag(REPLAY_FLAG, &"x".repeat(10_000)).expect_err("bad");
        let e = e.to_string();
        assert!(
            e.starts_with("--kv-events-replay-endpoint: ") && e.len() < 200,
            "{e}"
        );
        let e = ZmqEndpoint::parse("tcp://*:65535").expect("valid");
        let overflow = e.for_rank(1).expect_err("beyond 65535").to_string();
        assert!(overflow.contains("65536"), "{overflow}");
    }
}
