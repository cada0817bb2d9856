//! KV events over ZeroMQ: the wire format against captured bytes (decoded with `rmpv` and with
//! a minimal MessagePack decoder written here), and a served mockserve publishing to ZeroMQ
//! sockets of the test on 127.0.0.1, checked against the blocks the engine cached, plus replay.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use axum::body::Bytes;
use mock_server::config::ServerConfig;
use mock_server::kv_events::wire::{WireBatch, WireEvent, WireFormat, MEDIUM_GPU};
use mock_server::kv_events::{KvEventsArgs, END_OF_REPLAY};
use serde_json::json;
use servesim::cluster::ClusterConfig;
use servesim::tokens::BlockHashes;
use tokio::time::timeout;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::common::{within, TestServer, BLOCK_SIZE};

// ---------------------------------------------------------------------------------------------
// A second, independent MessagePack decoder: just what the KV-event payloads use.

#[derive(Clone, Debug, PartialEq)]
enum Mp {
    Nil,
    Int(i128),
    F64(f64),
    Str(String),
    Arr(Vec<Mp>),
    Map(Vec<(Mp, Mp)>),
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let end = self.at + n;
        ensure!(end <= self.bytes.len(), "truncated at {}", self.at);
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn be(&mut self, n: usize) -> Result<u64> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    fn value(&mut self) -> Result<Mp> {
        let tag = self.take(1)?[0];
        Ok(match tag {
            0x00..=0x7f => Mp::Int(i128::from(tag)),
            0xe0..=0xff => Mp::Int(i128::from(tag as i8)),
            0xc0 => Mp::Nil,
            0xcc => Mp::Int(i128::from(self.be(1)?)),
            0xcd => Mp::Int(i128::from(self.be(2)?)),
            0xce => Mp::Int(i128::from(self.be(4)?)),
            0xcf => Mp::Int(i128::from(self.be(8)?)),
            0xcb => Mp::F64(f64::from_bits(self.be(8)?)),
            0xa0..=0xbf => self.str(usize::from(tag & 0x1f))?,
            0xd9 => {
                let n = self.be(1)? as usize;
                self.str(n)?
            }
            0x90..=0x9f => self.arr(usize::from(tag & 0x0f))?,
            0xdc => {
                let n = self.be(2)? as usize;
                self.arr(n)?
            }
            0xdd => {
                let n = self.be(4)? as usize;
                self.arr(n)?
            }
            0x80..=0x8f => {
                let n = usize::from(tag & 0x0f);
                let mut m = Vec::with_capacity(n);
                for _ in 0..n {
                    m.push((self.value()?, self.value()?));
                }
                Mp::Map(m)
            }
            other => bail!("unexpected MessagePack tag {other:#x}"),
        })
    }

    fn str(&mut self, n: usize) -> Result<Mp> {
        Ok(Mp::Str(String::from_utf8(self.take(n)?.to_vec())?))
    }

    fn arr(&mut self, n: usize) -> Result<Mp> {
        (0..n)
            .map(|_| self.value())
            .collect::<Result<_>>()
            .map(Mp::Arr)
    }
}

fn decode_minimal(bytes: &[u8]) -> Result<Mp> {
    let mut r = Reader { bytes, at: 0 };
    let v = r.value()?;
    ensure!(r.at == bytes.len(), "trailing bytes");
    Ok(v)
}

// ---------------------------------------------------------------------------------------------
// Array-form batches as a consumer reads them.

/// A decoded `BlockStored` or `BlockRemoved`.
#[derive(Clone, Debug, PartialEq)]
enum Seen {
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u32>,
        block_size: u64,
    },
    Removed(Vec<u64>),
    Cleared,
}

fn u64s(v: &rmpv::Value) -> Result<Vec<u64>> {
    v.as_array()
        .context("array")?
        .iter()
        .map(|x| x.as_u64().context("u64"))
        .collect()
}

/// Decodes an array-form batch with `rmpv`: (rank, events).
fn decode_array_batch(payload: &[u8]) -> Result<(Option<u64>, Vec<Seen>)> {
    let v = rmpv::decode::read_value(&mut &payload[..])?;
    let batch = v.as_array().context("batch is an array")?;
    ensure!(batch.len() == 3, "[ts, events, rank]");
    ensure!(
        batch[0].as_f64().is_some_and(|ts| ts > 1.0e9),
        "ts in Unix seconds"
    );
    let rank = batch[2].as_u64();
    let mut out = Vec::new();
    for e in batch[1].as_array().context("events")? {
        let e = e.as_array().context("event is an array")?;
        match e[0].as_str() {
            Some("BlockStored") => {
                ensure!(e.len() == 8, "tag + 7 fields: {e:?}");
                ensure!(e[6].as_str() == Some(MEDIUM_GPU));
                ensure!(e[5].is_nil() && e[7].is_nil(), "no LoRA");
                let tokens = u64s(&e[3])?
                    .into_iter()
                    .map(|t| u32::try_from(t).context("token id"))
                    .collect::<Result<_>>()?;
                out.push(Seen::Stored {
                    hashes: u64s(&e[1])?,
                    parent: e[2].as_u64(),
                    tokens,
                    block_size: e[4].as_u64().context("block size")?,
                });
            }
            Some("BlockRemoved") => out.push(Seen::Removed(u64s(&e[1])?)),
            Some("AllBlocksCleared") => out.push(Seen::Cleared),
            other => bail!("unknown event {other:?}"),
        }
    }
    Ok((rank, out))
}

fn sample_batch() -> WireBatch {
    WireBatch {
        ts: 1_700_000_000.25,
        events: vec![
            WireEvent::BlockStored {
                block_hashes: vec![7, u64::MAX - 1],
                parent_block_hash: Some(3),
                token_ids: vec![1, 2, 70_000, 4],
                block_size: 2,
                lora_id: None,
                medium: Some(MEDIUM_GPU),
                lora_name: None,
            },
            WireEvent::BlockRemoved {
                block_hashes: vec![7],
                medium: Some(MEDIUM_GPU),
            },
            WireEvent::AllBlocksCleared,
        ],
        data_parallel_rank: Some(1),
    }
}

#[test]
fn array_form_decodes_with_rmpv_and_a_minimal_decoder() -> Result<()> {
    let bytes = sample_batch().encode(WireFormat::Array);
    let (rank, events) = decode_array_batch(&bytes)?;
    assert_eq!(rank, Some(1));
    assert_eq!(
        events,
        vec![
            Seen::Stored {
                hashes: vec![7, u64::MAX - 1],
                parent: Some(3),
                tokens: vec![1, 2, 70_000, 4],
                block_size: 2,
            },
            Seen::Removed(vec![7]),
            Seen::Cleared,
        ]
    );
    let s = |x: &str| Mp::Str(x.to_string());
    let gpu = s(MEDIUM_GPU);
    assert_eq!(
        decode_minimal(&bytes)?,
        Mp::Arr(vec![
            Mp::F64(1_700_000_000.25),
            Mp::Arr(vec![
                Mp::Arr(vec![
                    s("BlockStored"),
                    Mp::Arr(vec![Mp::Int(7), Mp::Int(i128::from(u64::MAX - 1))]),
                    Mp::Int(3),
                    Mp::Arr(vec![Mp::Int(1), Mp::Int(2), Mp::Int(70_000), Mp::Int(4)]),
                    Mp::Int(2),
                    Mp::Nil,
                    gpu.clone(),
                    Mp::Nil,
                ]),
                Mp::Arr(vec![s("BlockRemoved"), Mp::Arr(vec![Mp::Int(7)]), gpu]),
                Mp::Arr(vec![s("AllBlocksCleared")]),
            ]),
            Mp::Int(1),
        ])
    );
    Ok(())
}

#[test]
fn map_form_decodes_with_rmpv_and_a_minimal_decoder() -> Result<()> {
    let bytes = sample_batch().encode(WireFormat::Map);
    let v = rmpv::decode::read_value(&mut &bytes[..])?;
    let field = |m: &rmpv::Value, k: &str| -> Option<rmpv::Value> {
        m.as_map()?
            .iter()
            .find(|(key, _)| key.as_str() == Some(k))
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        field(&v, "data_parallel_rank").and_then(|r| r.as_u64()),
        Some(1)
    );
    let events = field(&v, "events").context("events")?;
    let stored = &events.as_array().context("array")?[0];
    assert_eq!(
        field(stored, "type").and_then(|t| t.as_str().map(String::from)),
        Some("BlockStored".into())
    );
    assert_eq!(
        u64s(&field(stored, "token_ids").context("tokens")?)?,
        vec![1, 2, 70_000, 4]
    );
    assert_eq!(
        field(stored, "parent_block_hash").and_then(|p| p.as_u64()),
        Some(3)
    );
    let Mp::Map(top) = decode_minimal(&bytes)? else {
        bail!("map form is a map");
    };
    let keys: Vec<Mp> = top.into_iter().map(|(k, _)| k).collect();
    let s = |x: &str| Mp::Str(x.to_string());
    assert_eq!(keys, vec![s("ts"), s("events"), s("data_parallel_rank")]);
    Ok(())
}

#[test]
fn the_flags_parse_and_bad_endpoints_are_refused() {
    let args = KvEventsArgs {
        kv_events_endpoint: Some("tcp://*:5557".into()),
        ..KvEventsArgs::default()
    };
    let config = args.config().expect("valid").expect("set");
    assert!(config.endpoint.bind);
    assert_eq!(config.format, WireFormat::Array);
    let bad = KvEventsArgs {
        kv_events_endpoint: Some("tcp//nowhere".into()),
        ..KvEventsArgs::default()
    };
    let e = bad.config().expect_err("refused").to_string();
    assert!(e.contains("tcp//nowhere"), "{e}");
}

/// The error of `mockserve serve FLAGS`, clap's or the configuration's.
fn serve_flags_error(flags: &[&str]) -> String {
    let mut argv = vec!["mockserve", "serve"];
    argv.extend_from_slice(flags);
    let args = match <mock_server::Cli as clap::Parser>::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) => return e.to_string(),
    };
    let Some(mock_server::Command::Serve(args)) = args.command else {
        return "not serve".into();
    };
    match ServerConfig::from_serve_args(&args.serve, &args.vllm) {
        Ok(_) => "accepted".into(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn kv_flag_errors_name_the_flag_not_the_engine() {
    let endpoint = ["--kv-events-endpoint", "tcp://*:5557"];
    for (flags, needles) in [
        (
            vec!["--kv-events-endpoint", "5557"],
            vec!["--kv-events-endpoint: invalid KV events endpoint \"5557\""],
        ),
        (
            vec![
                endpoint[0],
                endpoint[1],
                "--kv-events-replay-endpoint",
                "tcp://*:x",
            ],
            vec!["--kv-events-replay-endpoint: ", "the port must be a number"],
        ),
        (
            vec![
                "--kv-events-endpoint",
                "tcp://*:65535",
                "--num-workers",
                "2",
            ],
            vec!["--kv-events-endpoint tcp://*:65535: worker 1 would use port 65536"],
        ),
        (
            vec![
                endpoint[0],
                endpoint[1],
                "--kv-events-faults",
                "drop=0.1,seed=2,drop=0.5",
            ],
            vec!["--kv-events-faults", "\"drop\" is given twice"],
        ),
    ] {
        let e = serve_flags_error(&flags);
        for needle in needles {
            assert!(e.contains(needle), "{flags:?}: {e}");
        }
        assert!(!e.contains("engine"), "{flags:?}: {e}");
    }
}

// ---------------------------------------------------------------------------------------------
// A served mockserve publishing to the test's sockets.

/// Two free consecutive loopback ports, each bound by `bind` (retried on a collision).
async fn bind_pair<S: Socket>(tries: usize) -> Result<(u16, S, S)> {
    for _ in 0..tries {
        let probe = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = probe.local_addr()?.port();
        drop(probe);
        if port == u16::MAX {
            continue;
        }
        let mut a = S::new();
        let mut b = S::new();
        if a.bind(&format!("tcp://127.0.0.1:{port}")).await.is_err() {
            continue;
        }
        if b.bind(&format!("tcp://127.0.0.1:{}", port + 1))
            .await
            .is_err()
        {
            continue;
        }
        return Ok((port, a, b));
    }
    bail!("no two consecutive free ports in {tries} tries")
}

/// Receives `[topic, seq, payload]` messages until `enough` says stop.
async fn receive(
    sub: &mut zeromq::SubSocket,
    batches: &mut BTreeMap<u64, Bytes>,
    wait: Duration,
) -> Result<()> {
    while let Ok(message) = timeout(wait, sub.recv()).await {
        let frames = message?.into_vec();
        ensure!(frames.len() == 3, "three frames: {frames:?}");
        ensure!(frames[0].as_ref() == b"kv", "topic");
        let seq = u64::from_be_bytes(<[u8; 8]>::try_from(frames[1].as_ref())?);
        batches.insert(seq, frames[2].clone());
    }
    Ok(())
}

/// Asks a replay socket for every batch from `start`: `(seq, payload)` up to the end marker.
async fn replay_from(dealer: &mut zeromq::DealerSocket, start: u64) -> Result<Vec<(u64, Bytes)>> {
    // The server connects to us; retry until it has.
    for _ in 0..60 {
        let request: Vec<Bytes> = vec![Bytes::new(), Bytes::copy_from_slice(&start.to_be_bytes())];
        let sent = timeout(
            Duration::from_secs(1),
            dealer.send(ZmqMessage::try_from(request).map_err(|_| anyhow::anyhow!("empty"))?),
        )
        .await;
        if !matches!(sent, Ok(Ok(()))) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let mut out = Vec::new();
        loop {
            let Ok(reply) = timeout(Duration::from_secs(5), dealer.recv()).await else {
                bail!("no end marker");
            };
            let frames = reply?.into_vec();
            ensure!(
                frames.len() == 3 && frames[0].is_empty(),
                "[empty, seq, payload]"
            );
            if frames[1].as_ref() == END_OF_REPLAY {
                ensure!(frames[2].is_empty(), "the end marker has an empty payload");
                return Ok(out);
            }
            let seq = u64::from_be_bytes(<[u8; 8]>::try_from(frames[1].as_ref())?);
            out.push((seq, frames[2].clone()));
        }
    }
    bail!("the replay socket never answered")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_kv_events_name_the_blocks_the_engine_cached() -> Result<()> {
    let (port, mut sub0, mut sub1) = within(bind_pair::<zeromq::SubSocket>(20)).await??;
    let (replay_port, mut dealer0, mut dealer1) =
        within(bind_pair::<zeromq::DealerSocket>(20)).await??;
    sub0.subscribe("").await?;
    sub1.subscribe("").await?;
    let mut cluster = ClusterConfig {
        num_workers: 2,
        ..ClusterConfig::default()
    };
    cluster.engine.block_size = BLOCK_SIZE;
    cluster.engine.latency.speedup_ratio = f64::INFINITY;
    let kv = KvEventsArgs {
        kv_events_endpoint: Some(format!("tcp://127.0.0.1:{port}")),
        kv_events_replay_endpoint: Some(format!("tcp://127.0.0.1:{replay_port}")),
        kv_events_topic: "kv".into(),
        kv_events_format: WireFormat::Array,
        kv_events_faults: None,
    };
    let config = ServerConfig {
        kv_events: kv.config()?,
        ..ServerConfig::new(cluster)
    };
    let server = within(TestServer::start(config)).await??;
    // Give the publishers a moment to connect; whatever is missed comes back by replay.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let prompts: [Vec<u32>; 2] = [
        (1000..1040).collect(), // 2 full blocks + 8 on worker 0
        (5000..5050).collect(), // 3 full blocks + 2 on worker 1
    ];
    for (worker, prompt) in prompts.iter().enumerate() {
        let body = json!({
            "model": "mock-model", "prompt": prompt, "max_tokens": 30, "ignore_eos": true,
            "nvext": {"backend_instance_id": worker},
        });
        let response = within(
            server
                .client
                .post(format!("{}/v1/completions", server.base))
                .json(&body)
                .send(),
        )
        .await??;
        ensure!(response.status().is_success(), "{}", response.text().await?);
        within(response.bytes()).await??;
    }
    let live = server.state.engine.snapshot().await?;
    let subs = [&mut sub0, &mut sub1];
    let dealers = [&mut dealer0, &mut dealer1];
    for (worker, prompt) in prompts.iter().enumerate() {
        let mut batches = BTreeMap::new();
        within(receive(subs[worker], &mut batches, Duration::from_secs(2))).await??;
        // Fill any gap (a batch sent before the subscription took effect) from the replay socket.
        for (seq, payload) in within(replay_from(dealers[worker], 0)).await?? {
            let live = batches.entry(seq).or_insert_with(|| payload.clone());
            assert_eq!(*live, payload, "replay serves the bytes published");
        }
        ensure!(!batches.is_empty(), "worker {worker} published nothing");
        let seqs: Vec<u64> = batches.keys().copied().collect();
        assert_eq!(
            seqs,
            (0..seqs.len() as u64).collect::<Vec<_>>(),
            "from 0, no gap"
        );
        let mut stored_hashes = Vec::new();
        let mut stored_tokens = Vec::new();
        for payload in batches.values() {
            let (rank, events) = decode_array_batch(payload)?;
            assert_eq!(rank, Some(worker as u64));
            for event in events {
                let Seen::Stored {
                    hashes,
                    parent,
                    tokens,
                    block_size,
                } = event
                else {
                    bail!("only stores expected: {event:?}");
                };
                assert_eq!(block_size, BLOCK_SIZE as u64);
                assert_eq!(tokens.len(), hashes.len() * BLOCK_SIZE);
                // Parents chain: each event continues the sequence published so far.
                assert_eq!(parent, stored_hashes.last().copied());
                stored_hashes.extend(hashes);
                stored_tokens.extend(tokens);
            }
        }
        // The tokens are the prompt's, then the answer's, and hash to the engine's hashes.
        let full = prompt.len() / BLOCK_SIZE * BLOCK_SIZE;
        assert_eq!(&stored_tokens[..full], &prompt[..full]);
        assert_eq!(&stored_tokens[full..prompt.len()], &prompt[full..]);
        let engine_hashes = BlockHashes::of(&stored_tokens, BLOCK_SIZE);
        let engine_hashes: Vec<u64> = engine_hashes.sequence.iter().map(|h| h.0).collect();
        assert_eq!(stored_hashes, engine_hashes);
        // Exactly the blocks the engine holds in its cache now that the request is done.
        assert_eq!(
            stored_hashes.len(),
            live.cluster.workers[worker].scheduler.inactive_blocks
        );
        assert_eq!(stored_hashes.len(), (prompt.len() + 30 - 1) / BLOCK_SIZE);
    }
    let metrics = within(server.client.get(format!("{}/metrics", server.base)).send())
        .await??
        .text()
        .await?;
    assert!(
        metrics.contains("servesim_kv_events_unknown_blocks_total 0"),
        "{metrics}"
    );
    Ok(())
}

/// What one subscriber of a one-worker server with `--kv-events-faults SPEC` received while
/// 12 prompts were served (each stores blocks), in arrival order with arrival times, what the
/// replay socket holds, the `servesim_kv_events_faults` counts by fault, and when the last
/// request ended.
struct FaultRun {
    received: Vec<(u64, Bytes, std::time::Instant)>,
    replayed: Vec<(u64, Bytes)>,
    counted: BTreeMap<String, f64>,
    served: std::time::Instant,
}

async fn run_with_faults(spec: &str) -> Result<FaultRun> {
    let (port, mut sub, _spare) = within(bind_pair::<zeromq::SubSocket>(20)).await??;
    let (replay_port, mut dealer, _spare_dealer) =
        within(bind_pair::<zeromq::DealerSocket>(20)).await??;
    sub.subscribe("").await?;
    let mut cluster = ClusterConfig {
        num_workers: 1,
        ..ClusterConfig::default()
    };
    cluster.engine.block_size = BLOCK_SIZE;
    cluster.engine.latency.speedup_ratio = f64::INFINITY;
    let kv = KvEventsArgs {
        kv_events_endpoint: Some(format!("tcp://127.0.0.1:{port}")),
        kv_events_replay_endpoint: Some(format!("tcp://127.0.0.1:{replay_port}")),
        kv_events_topic: "kv".into(),
        kv_events_format: WireFormat::Array,
        kv_events_faults: Some(spec.parse().map_err(anyhow::Error::msg)?),
    };
    let config = ServerConfig {
        kv_events: kv.config()?,
        ..ServerConfig::new(cluster)
    };
    let server = within(TestServer::start(config)).await??;
    // The publisher connects to the test's socket: let it, so that nothing is missed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..12u32 {
        let prompt: Vec<u32> = (i * 1000..i * 1000 + 40).collect();
        let body = json!({"model": "mock-model", "prompt": prompt, "max_tokens": 2});
        let response = within(
            server
                .client
                .post(format!("{}/v1/completions", server.base))
                .json(&body)
                .send(),
        )
        .await??;
        ensure!(response.status().is_success(), "{}", response.text().await?);
        within(response.bytes()).await??;
    }
    let served = std::time::Instant::now();
    let mut received = Vec::new();
    while let Ok(message) = timeout(Duration::from_millis(1500), sub.recv()).await {
        let frames = message?.into_vec();
        ensure!(frames.len() == 3, "three frames");
        let seq = u64::from_be_bytes(<[u8; 8]>::try_from(frames[1].as_ref())?);
        received.push((seq, frames[2].clone(), std::time::Instant::now()));
    }
    let replayed = within(replay_from(&mut dealer, 0)).await??;
    let metrics = within(server.client.get(format!("{}/metrics", server.base)).send())
        .await??
        .text()
        .await?;
    let counted = metrics
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("servesim_kv_events_faults_total{")?;
            let fault = rest.split("fault=\"").nth(1)?.split('"').next()?;
            let value = l.rsplit(' ').next()?.parse::<f64>().ok()?;
            Some((fault.to_string(), value))
        })
        .collect();
    Ok(FaultRun {
        received,
        replayed,
        counted,
        served,
    })
}

/// `--kv-events-faults`: dropped batches leave gaps the replay socket fills with the same
/// bytes, duplicates repeat a number, reordered batches come after their successor, delayed
/// ones come late; each counted per fault; numbering and replay stay exact throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_on_the_event_plane_are_what_a_router_sees() -> Result<()> {
    let seqs = |r: &FaultRun| r.received.iter().map(|(s, _, _)| *s).collect::<Vec<_>>();
    let drop = run_with_faults("drop=0.5,seed=3").await?;
    let total = drop.replayed.len() as u64;
    ensure!(total >= 12, "{total} batches published");
    assert_eq!(
        drop.replayed.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        (0..total).collect::<Vec<_>>(),
        "replay holds every batch, numbered from 0"
    );
    let got = seqs(&drop);
    let dropped = drop.counted.get("drop").copied().unwrap_or(0.0);
    assert_eq!(got.len() as f64, total as f64 - dropped, "{got:?}");
    assert!(dropped > 0.0 && !got.is_empty(), "{got:?}");
    assert!(got.windows(2).all(|w| w[0] < w[1]), "in order: {got:?}");
    for (seq, payload, _) in &drop.received {
        assert_eq!(&drop.replayed[*seq as usize].1, payload);
    }

    let dup = run_with_faults("duplicate=1").await?;
    let n = dup.replayed.len() as u64;
    let twice: Vec<u64> = (0..n).flat_map(|s| [s, s]).collect();
    assert_eq!(seqs(&dup), twice);
    assert_eq!(dup.counted.get("duplicate").copied(), Some(n as f64));

    let reorder = run_with_faults("reorder=1").await?;
    let n = reorder.replayed.len() as u64;
    // Pairs swapped; with an odd count the last is still held back.
    let swapped: Vec<u64> = (0..n / 2).flat_map(|p| [2 * p + 1, 2 * p]).collect();
    assert_eq!(seqs(&reorder), swapped);

    let late = run_with_faults("delay=400").await?;
    assert_eq!(
        seqs(&late),
        (0..late.replayed.len() as u64).collect::<Vec<_>>()
    );
    let last = late.received.last().context("delivered")?.2;
    // The last batch was published before the last request ended: it came 400 ms later.
    assert!(last.duration_since(late.served) >= Duration::from_millis(300));
    Ok(())
}

/// `restart=4`: the publisher restarts after every 4 batches, as a restarted vLLM engine's new
/// publisher does: the numbering starts over at 0 and the replay buffer holds only the batches
/// published since; each restart is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_restart_starts_the_numbering_over() -> Result<()> {
    let run = run_with_faults("restart=4").await?;
    let seqs: Vec<u64> = run.received.iter().map(|(s, _, _)| *s).collect();
    let n = seqs.len() as u64;
    ensure!(n >= 12, "{n} batches received");
    assert_eq!(seqs, (0..n).map(|i| i % 4).collect::<Vec<_>>());
    let restarts = (n - 1) / 4;
    assert_eq!(run.counted.get("restart").copied(), Some(restarts as f64));
    let since = (n - 4 * restarts) as usize;
    let last = &run.received[run.received.len() - since..];
    assert_eq!(run.replayed.len(), since, "{:?}", run.replayed);
    for ((seq, payload), (s, p, _)) in run.replayed.iter().zip(last) {
        assert_eq!((seq, payload), (s, p));
    }
    Ok(())
}

/// `POST /reset_prefix_cache` (vLLM's) empties an idle worker's cache: the subscriber gets
/// `AllBlocksCleared`, and the same prompt again reuses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_cache_reset_publishes_all_blocks_cleared() -> Result<()> {
    let (port, mut sub, _spare) = within(bind_pair::<zeromq::SubSocket>(20)).await??;
    sub.subscribe("").await?;
    let mut cluster = ClusterConfig {
        num_workers: 1,
        ..ClusterConfig::default()
    };
    cluster.engine.block_size = BLOCK_SIZE;
    cluster.engine.latency.speedup_ratio = f64::INFINITY;
    let kv = KvEventsArgs {
        kv_events_endpoint: Some(format!("tcp://127.0.0.1:{port}")),
        kv_events_topic: "kv".into(),
        ..KvEventsArgs::default()
    };
    let config = ServerConfig {
        kv_events: kv.config()?,
        ..ServerConfig::new(cluster)
    };
    let server = within(TestServer::start(config)).await??;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cached = || async {
        let body = json!({"model": "mock-model", "prompt": (0..64).collect::<Vec<u32>>(),
            "max_tokens": 2});
        let response = within(
            server
                .client
                .post(format!("{}/v1/completions", server.base))
                .json(&body)
                .send(),
        )
        .await??;
        let v: serde_json::Value = within(response.json()).await??;
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .context("cached_tokens")
    };
    assert_eq!(cached().await?, 0);
    assert!(cached().await? > 0);
    let reset = within(
        server
            .client
            .post(format!("{}/reset_prefix_cache", server.base))
            .send(),
    )
    .await??;
    assert_eq!(reset.status(), 200);
    let answer: serde_json::Value = within(reset.json()).await??;
    assert_eq!(answer, json!({"reset_workers": [0], "busy_workers": []}));
    let mut batches = BTreeMap::new();
    within(receive(&mut sub, &mut batches, Duration::from_secs(1))).await??;
    let (_, last) = batches.last_key_value().context("batches")?;
    let (_, events) = decode_array_batch(last)?;
    assert_eq!(events, [Seen::Cleared]);
    assert_eq!(cached().await?, 0, "nothing cached after the reset");
    Ok(())
}

#[test]
fn replay_writes_the_kv_event_stream_as_json_lines() -> Result<()> {
    use clap::Parser;
    let dir = std::env::temp_dir().join(format!("mockserve-kv-jsonl-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("events.jsonl");
    let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/trace_small.jsonl");
    let cli = mock_server::Cli::try_parse_from([
        "mockserve",
        "replay",
        trace,
        "-q",
        "--num-workers",
        "2",
        "--block-size",
        "16",
        "--trace-block-size",
        "16",
        "--kv-events-jsonl",
        path.to_str().context("utf-8 path")?,
    ])?;
    let Some(mock_server::Command::Replay(args)) = cli.command else {
        bail!("expected replay");
    };
    let outcome = mock_server::cmd::replay::run(&args)?;
    let text = std::fs::read_to_string(&path)?;
    std::fs::remove_dir_all(&dir)?;
    let mut stored_blocks = 0usize;
    let mut ranks = std::collections::BTreeSet::new();
    for line in text.lines() {
        let batch: serde_json::Value = serde_json::from_str(line)?;
        ranks.insert(batch["data_parallel_rank"].as_u64().context("rank")?);
        for event in batch["events"].as_array().context("events")? {
            if event["type"] == "BlockStored" {
                let hashes = event["block_hashes"].as_array().context("hashes")?;
                let tokens: Vec<u32> = serde_json::from_value(event["token_ids"].clone())?;
                assert_eq!(tokens.len(), hashes.len() * 16, "{event}");
                // The synthesized trace tokens hash to the engine's block hashes.
                let parent = event["parent_block_hash"].as_u64();
                if parent.is_none() {
                    let want = BlockHashes::of(&tokens, 16);
                    let got: Vec<u64> = hashes.iter().filter_map(|h| h.as_u64()).collect();
                    assert_eq!(got, want.sequence.iter().map(|h| h.0).collect::<Vec<_>>());
                }
                stored_blocks += hashes.len();
            }
        }
    }
    assert!(stored_blocks > 0, "{text}");
    assert!(outcome.report.completed_requests > 0);
    assert!(ranks.iter().all(|r| *r < 2), "{ranks:?}");
    Ok(())
}
