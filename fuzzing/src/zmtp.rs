//! The ZMTP target: fuzzed bytes sent by a peer of mockserve's KV-event sockets, which speak
//! ZMTP 3.0 by hand (`mock_server/src/kv_events/zmtp.rs`).
//!
//! Input layout: byte 0 is `0bxxxxTTHS`: `S` picks the socket (0: a PUB socket, 1: a replay
//! ROUTER socket), `H` puts a valid greeting and READY before the rest (so mutants reach the
//! frames after the handshake), `TT` picks the READY's socket type (PUB socket: SUB, XSUB,
//! DEALER, PUB; replay socket: DEALER, REQ, ROUTER, SUB). The rest is sent as is, a batch is
//! published, and the peer closes its side. Properties:
//!
//! - the server closes the connection within [`CLOSE_WITHIN`] (it reads the peer's end);
//! - it writes at most 64 KiB + 256 bytes per input byte (a PONG per PING, a replay answer of
//!   the 16 batches kept per request);
//! - its heap grows by at most [`HEAP_BUDGET`] + 8 bytes per input byte while it serves the
//!   input (its runtime's threads are charged to a [`Meter`] of their own);
//! - afterwards a well-behaved DEALER still gets its replay answer: the sockets still serve.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use mock_server::kv_events::wire::{WireBatch, WireEvent, WireFormat, MEDIUM_GPU};
use mock_server::kv_events::{KvEventPublisher, KvEventsConfig, ZmqEndpoint, END_OF_REPLAY};
use mock_server::metrics::Metrics;

use crate::meter::{charge_thread, Meter};

/// How long the server may take to close a connection whose peer has closed its side.
pub const CLOSE_WITHIN: Duration = Duration::from_secs(5);

/// Heap the server may grow by for one input, besides 8 bytes per input byte: a frame's buffer
/// (64 KiB at most), a connection's read and write buffers, its subscriptions (16 KiB at
/// most) and a replay answer.
pub const HEAP_BUDGET: usize = 2 << 20;

/// Batches the replay socket keeps (published once, at start).
const REPLAY_BATCHES: u64 = 16;

/// The server's runtime threads are charged here.
static METER: Meter = Meter::new("zmtp_frames");

/// A runtime and the two publishers living on it: one whose PUB socket gets a batch per input,
/// one whose replay socket keeps [`REPLAY_BATCHES`].
struct Sockets {
    _runtime: tokio::runtime::Runtime,
    /// Publishes a batch per input (its replay buffer is not served).
    live: Mutex<KvEventPublisher>,
    pub_addr: SocketAddr,
    replay_addr: SocketAddr,
    /// Keeps the replay socket open.
    _replay: KvEventPublisher,
}

fn loopback(addr: Option<SocketAddr>) -> SocketAddr {
    let port = addr.map_or(0, |a| a.port());
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn batch() -> WireBatch {
    WireBatch {
        ts: 1.0,
        events: vec![WireEvent::BlockStored {
            block_hashes: vec![7],
            parent_block_hash: None,
            token_ids: (0..16).collect(),
            block_size: 16,
            lora_id: None,
            medium: Some(MEDIUM_GPU),
            lora_name: None,
        }],
        data_parallel_rank: Some(0),
    }
}

fn sockets() -> &'static Sockets {
    static SOCKETS: OnceLock<Sockets> = OnceLock::new();
    SOCKETS.get_or_init(|| {
        let runtime = match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .on_thread_start(|| {
                charge_thread(Some(&METER));
            })
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => panic!("cannot start a tokio runtime: {e}"),
        };
        let start = |replay: bool| {
            runtime.block_on(async {
                let any = || ZmqEndpoint::parse("tcp://*:0");
                let config = KvEventsConfig {
                    endpoint: any()?,
                    replay_endpoint: replay.then(any).transpose()?,
                    topic: "kv@fuzz".into(),
                    format: WireFormat::Array,
                    faults: None,
                };
                KvEventPublisher::start(&config, 1, Arc::new(Metrics::new())).await
            })
        };
        let (live, mut replay) = match (start(false), start(true)) {
            (Ok(live), Ok(replay)) => (live, replay),
            (Err(e), _) | (_, Err(e)) => panic!("cannot open the KV-event sockets: {e}"),
        };
        for _ in 0..REPLAY_BATCHES {
            replay.publish(0, &batch());
        }
        Sockets {
            pub_addr: loopback(live.pub_addr(0)),
            replay_addr: loopback(replay.replay_addr(0)),
            live: Mutex::new(live),
            _replay: replay,
            _runtime: runtime,
        }
    })
}

/// The greeting and READY of a peer of `socket_type`.
fn handshake(socket_type: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; 64];
    out[0] = 0xff;
    out[9] = 0x7f;
    out[10] = 3;
    out[12..16].copy_from_slice(b"NULL");
    let mut ready = vec![5];
    ready.extend_from_slice(b"READY");
    ready.push(11);
    ready.extend_from_slice(b"Socket-Type");
    ready.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    ready.extend_from_slice(socket_type);
    out.extend_from_slice(&[0x04, ready.len() as u8]);
    out.extend_from_slice(&ready);
    out
}

/// Sends `bytes` to `addr`, closes the sending side and reads until the server closes:
/// the bytes read, or why the server did not close in time.
fn exchange(addr: SocketAddr, bytes: &[u8], after_send: impl FnOnce()) -> Result<usize, String> {
    let mut stream = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    // The server reads as it goes (and closes on a bad frame): a write error is its close.
    let _ = stream.write_all(bytes);
    after_send();
    let _ = stream.shutdown(Shutdown::Write);
    let started = Instant::now();
    let mut read = 0;
    let mut buffer = vec![0u8; 64 << 10];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return Ok(read),
            Ok(n) => read += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return Ok(read),
        }
        if started.elapsed() > CLOSE_WITHIN {
            return Err(format!(
                "the server kept the connection open {CLOSE_WITHIN:?} after the peer closed its \
                 side ({read} bytes read)"
            ));
        }
    }
}

/// A well-behaved DEALER asking for everything gets the batches kept and the end marker.
fn replay_still_serves(addr: SocketAddr) -> Result<(), String> {
    let mut request = handshake(b"DEALER");
    request.extend_from_slice(&[0x00, 0x08]);
    request.extend_from_slice(&0u64.to_be_bytes());
    let mut stream = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    let _ = stream.set_read_timeout(Some(CLOSE_WITHIN));
    stream
        .write_all(&request)
        .map_err(|e| format!("send: {e}"))?;
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    while !answer.windows(8).any(|w| w == END_OF_REPLAY) {
        match stream.read(&mut buffer) {
            Ok(0) | Err(_) => {
                return Err(format!(
                    "a DEALER's replay request got no end marker ({} bytes)",
                    answer.len()
                ))
            }
            Ok(n) => answer.extend_from_slice(&buffer[..n]),
        }
    }
    Ok(())
}

/// The checker (see the module documentation).
pub fn zmtp_frames(input: &[u8]) {
    let Some((&head, rest)) = input.split_first() else {
        return;
    };
    let sockets = sockets();
    let replay = head & 1 == 1;
    let types: [&[u8]; 4] = if replay {
        [b"DEALER", b"REQ", b"ROUTER", b"SUB"]
    } else {
        [b"SUB", b"XSUB", b"DEALER", b"PUB"]
    };
    let mut bytes = Vec::with_capacity(rest.len() + 128);
    if head & 2 != 0 {
        bytes.extend(handshake(types[usize::from((head >> 2) & 3)]));
    }
    bytes.extend_from_slice(rest);
    let addr = if replay {
        sockets.replay_addr
    } else {
        sockets.pub_addr
    };
    let budget = HEAP_BUDGET + 8 * input.len();
    METER.arm(64 * budget, input);
    let exchanged = exchange(addr, &bytes, || {
        if !replay {
            let mut live = sockets.live.lock().unwrap_or_else(PoisonError::into_inner);
            live.publish(0, &batch());
        }
    });
    let grown = METER.disarm();
    let read = match exchanged {
        Ok(read) => read,
        Err(why) => panic!("{why}"),
    };
    let most = (64 << 10) + 256 * input.len();
    assert!(
        read <= most,
        "the server wrote {read} bytes for a {}-byte input (at most {most})",
        input.len()
    );
    assert!(
        grown <= budget,
        "the server's heap grew by {grown} bytes for a {}-byte input (budget {budget})",
        input.len()
    );
    if let Err(why) = replay_still_serves(sockets.replay_addr) {
        panic!("{why}");
    }
}
