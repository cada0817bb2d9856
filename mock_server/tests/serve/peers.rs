//! KV-event peers are isolated: a subscriber or replay client that stops reading loses (or
//! delays) only its own messages. The stalled peers here are raw TCP sockets that complete the
//! ZMTP handshake themselves (written here, independently of the server's code) and then never
//! read; the live peers are the `zeromq` crate's sockets. And every peer costs a bounded
//! amount (issue 43): subscriptions past a cap are ignored, idle connections give their slot
//! back after the handshake deadline, a REQ client gets one reply per request, and the replay
//! buffer is bounded in bytes.
//!
//! Their `recv` runs unconstrained by tokio's cooperative budget: the crate's fair queue polls
//! again whenever a read wakes it, and a read refused for an exhausted budget wakes at once, so
//! under a steady stream one `recv` could spin without ever returning.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use axum::body::Bytes;
use mock_server::kv_events::wire::{WireBatch, WireEvent, WireFormat, MEDIUM_GPU};
use mock_server::kv_events::{
    KvEventPublisher, KvEventsConfig, ZmqEndpoint, END_OF_REPLAY, PEER_QUEUE, REPLAY_BUFFER,
    REPLAY_BUFFER_BYTES,
};
use mock_server::metrics::{Metrics, WorkerLabel};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::unconstrained;
use tokio::time::{timeout, Instant};
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

/// Generous bound for each wait on a loaded machine.
const WAIT: Duration = Duration::from_secs(30);

/// A batch of about 2.5 KB (one stored block of 300 tokens), so that a few thousand fill a
/// stalled peer's socket buffers.
fn big_batch() -> WireBatch {
    WireBatch {
        ts: 1.0,
        events: vec![WireEvent::BlockStored {
            block_hashes: vec![1],
            parent_block_hash: None,
            token_ids: (100_000..100_300).collect(),
            block_size: 300,
            lora_id: None,
            medium: Some(MEDIUM_GPU),
            lora_name: None,
        }],
        data_parallel_rank: Some(0),
    }
}

/// A publisher of one worker bound on loopback ports picked by the system.
async fn publisher(replay: bool) -> Result<(KvEventPublisher, Arc<Metrics>)> {
    let config = KvEventsConfig {
        endpoint: ZmqEndpoint::parse("tcp://*:0")?,
        replay_endpoint: replay
            .then(|| ZmqEndpoint::parse("tcp://*:0"))
            .transpose()?,
        topic: String::new(),
        format: WireFormat::Array,
        faults: None,
    };
    let metrics = Arc::new(Metrics::new());
    let publisher = KvEventPublisher::start(&config, 1, Arc::clone(&metrics)).await?;
    Ok((publisher, metrics))
}

fn loopback(addr: Option<SocketAddr>) -> Result<SocketAddr> {
    let port = addr.context("bound")?.port();
    Ok(SocketAddr::from(([127, 0, 0, 1], port)))
}

/// A raw TCP peer of `socket_type` with a tiny receive buffer, after the ZMTP 3.0 greeting and
/// READY exchange.
async fn raw_peer(addr: SocketAddr, socket_type: &[u8]) -> Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.set_recv_buffer_size(4096)?;
    let mut stream = socket.connect(addr).await?;
    let mut greeting = [0u8; 64];
    greeting[0] = 0xff;
    greeting[9] = 0x7f;
    greeting[10] = 3;
    greeting[12..16].copy_from_slice(b"NULL");
    stream.write_all(&greeting).await?;
    let mut theirs = [0u8; 64];
    stream.read_exact(&mut theirs).await?;
    ensure!(
        theirs[0] == 0xff && theirs[9] == 0x7f && theirs[10] == 3,
        "{theirs:?}"
    );
    ensure!(&theirs[12..16] == b"NULL", "mechanism");
    let mut ready = vec![5];
    ready.extend_from_slice(b"READY");
    ready.push(11);
    ready.extend_from_slice(b"Socket-Type");
    ready.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    ready.extend_from_slice(socket_type);
    let mut frame = vec![0x04, ready.len() as u8];
    frame.extend_from_slice(&ready);
    stream.write_all(&frame).await?;
    let flags = stream.read_u8().await?;
    let len = stream.read_u8().await?;
    let mut body = vec![0; usize::from(len)];
    stream.read_exact(&mut body).await?;
    ensure!(flags == 0x04 && body.starts_with(b"\x05READY"), "{body:?}");
    Ok(stream)
}

fn seq_of(frame: &Bytes) -> Result<u64> {
    Ok(u64::from_be_bytes(<[u8; 8]>::try_from(frame.as_ref())?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_subscriber_loses_only_its_own_batches() -> Result<()> {
    let (mut publisher, metrics) = publisher(false).await?;
    let addr = loopback(publisher.pub_addr(0))?;
    // Subscribes to every topic, then never reads.
    let mut stalled = timeout(WAIT, raw_peer(addr, b"SUB")).await??;
    stalled.write_all(&[0x00, 0x01, 0x01]).await?;
    let mut live = zeromq::SubSocket::new();
    timeout(WAIT, live.connect(&format!("tcp://{addr}"))).await??;
    live.subscribe("").await?;

    let batch = big_batch();
    // Probe until the live subscriber's subscription is in.
    let mut next_seq = 0u64;
    let first = loop {
        publisher.publish(0, &batch);
        next_seq += 1;
        if let Ok(message) = timeout(Duration::from_millis(200), unconstrained(live.recv())).await {
            break seq_of(&message?.into_vec()[1])?;
        }
        ensure!(next_seq < 150, "the live subscriber never received a batch");
    };
    // Every batch from the first one seen on must reach the live subscriber, in order, while
    // the stalled one's queue overflows.
    let total = 4 * PEER_QUEUE as u64;
    let mut expected = first + 1;
    while next_seq < first + total {
        for _ in 0..200 {
            publisher.publish(0, &batch);
            next_seq += 1;
        }
        while expected < next_seq {
            let message = timeout(WAIT, unconstrained(live.recv()))
                .await
                .with_context(|| format!("the live subscriber stopped at batch {expected}"))??;
            let frames = message.into_vec();
            ensure!(frames.len() == 3, "{} frames", frames.len());
            assert_eq!(
                seq_of(&frames[1])?,
                expected,
                "no gap for the live subscriber"
            );
            expected += 1;
        }
    }
    let dropped = metrics
        .kv_events_dropped
        .get_or_create(&WorkerLabel { worker: 0 })
        .get();
    // All drops are the stalled subscriber's: it holds at most PEER_QUEUE batches plus what its
    // socket buffers took.
    assert!(dropped > 0, "the stalled subscriber's queue overflowed");
    assert!(dropped < next_seq, "{dropped} of {next_seq}");
    let published = metrics
        .kv_events_published
        .get_or_create(&WorkerLabel { worker: 0 })
        .get();
    assert_eq!(published, next_seq);
    drop(stalled);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_replay_client_delays_only_itself() -> Result<()> {
    let (mut publisher, _metrics) = publisher(true).await?;
    let addr = loopback(publisher.replay_addr(0))?;
    let batch = big_batch();
    for _ in 0..REPLAY_BUFFER {
        publisher.publish(0, &batch);
    }
    // Asks for everything (about 25 MB), reads the first byte of the answer (so the server is
    // busy answering it), then never reads again.
    let mut stalled = timeout(WAIT, raw_peer(addr, b"DEALER")).await??;
    let mut request = vec![0x00, 0x08];
    request.extend_from_slice(&0u64.to_be_bytes());
    stalled.write_all(&request).await?;
    timeout(WAIT, stalled.read_u8()).await??;

    let mut live = zeromq::DealerSocket::new();
    timeout(WAIT, live.connect(&format!("tcp://{addr}"))).await??;
    let request = vec![Bytes::copy_from_slice(&0u64.to_be_bytes())];
    timeout(
        WAIT,
        live.send(ZmqMessage::try_from(request).map_err(|_| anyhow::anyhow!("empty"))?),
    )
    .await??;
    let mut seqs = Vec::new();
    loop {
        let reply = timeout(WAIT, unconstrained(live.recv()))
            .await
            .with_context(|| format!("the live client stopped after {} batches", seqs.len()))??;
        let frames = reply.into_vec();
        ensure!(frames.len() == 2, "[seq, payload]: {} frames", frames.len());
        if frames[0].as_ref() == END_OF_REPLAY {
            break;
        }
        seqs.push(seq_of(&frames[0])?);
    }
    assert_eq!(seqs, (0..REPLAY_BUFFER as u64).collect::<Vec<_>>());
    drop(stalled);
    Ok(())
}

/// The subscriptions one peer may hold (`MAX_SUBSCRIPTIONS` in the server).
const MAX_SUBSCRIPTIONS: usize = 256;

/// Connections a socket serves at once (`MAX_PEERS` in the server).
const MAX_PEERS: usize = 256;

/// One frame read from a raw peer: its flags and body.
async fn read_raw_frame(stream: &mut TcpStream) -> Result<(u8, Vec<u8>)> {
    let flags = stream.read_u8().await?;
    let len = if flags & 0x02 != 0 {
        stream.read_u64().await?
    } else {
        u64::from(stream.read_u8().await?)
    };
    ensure!(len < 1 << 24, "a {len}-byte frame");
    let mut body = vec![0; len as usize];
    stream.read_exact(&mut body).await?;
    Ok((flags, body))
}

/// One whole message (its frames' bodies), skipping commands (PONGs).
async fn read_raw_message(stream: &mut TcpStream) -> Result<Vec<Vec<u8>>> {
    let mut frames = Vec::new();
    loop {
        let (flags, body) = read_raw_frame(stream).await?;
        if flags & 0x04 != 0 {
            continue;
        }
        frames.push(body);
        if flags & 0x01 == 0 {
            return Ok(frames);
        }
    }
}

/// A ZMTP 3.0 subscription message (`\x01` + prefix) or cancel (`\x00` + prefix), as a frame.
fn subscription(subscribe: bool, prefix: &[u8]) -> Vec<u8> {
    let mut body = vec![u8::from(subscribe)];
    body.extend_from_slice(prefix);
    let mut frame = vec![0x00];
    if body.len() < 256 {
        frame.push(body.len() as u8);
    } else {
        frame[0] = 0x02;
        frame.extend_from_slice(&(body.len() as u64).to_be_bytes());
    }
    frame.extend_from_slice(&body);
    frame
}

/// Sends a PING and reads until its PONG: everything sent before it has been applied.
async fn ping_pong(stream: &mut TcpStream) -> Result<()> {
    let mut ping = vec![0x04, 9, 4];
    ping.extend_from_slice(b"PING");
    ping.extend_from_slice(&[0, 10, b'p', b'n']);
    stream.write_all(&ping).await?;
    loop {
        let (flags, body) = read_raw_frame(stream).await?;
        if flags & 0x04 != 0 && body.starts_with(b"\x04PONG") {
            ensure!(
                body.ends_with(b"pn"),
                "the PONG echoes the context: {body:?}"
            );
            return Ok(());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_past_the_cap_are_ignored() -> Result<()> {
    let (mut publisher, _metrics) = publisher(false).await?;
    let addr = loopback(publisher.pub_addr(0))?;
    let mut peer = timeout(WAIT, raw_peer(addr, b"SUB")).await??;
    // The cap in count: MAX_SUBSCRIPTIONS prefixes that match nothing, then the empty one
    // (which would match every batch) is one too many.
    let mut subscriptions = Vec::new();
    for n in 0..MAX_SUBSCRIPTIONS {
        subscriptions.extend(subscription(true, format!("no-such-topic-{n}").as_bytes()));
    }
    subscriptions.extend(subscription(true, b""));
    timeout(WAIT, peer.write_all(&subscriptions)).await??;
    timeout(WAIT, ping_pong(&mut peer)).await??;
    let batch = big_batch();
    publisher.publish(0, &batch); // seq 0: ignored subscription, not delivered
                                  // One cancelled makes room: the empty subscription is held now.
    let mut again = subscription(false, b"no-such-topic-0");
    again.extend(subscription(true, b""));
    timeout(WAIT, peer.write_all(&again)).await??;
    timeout(WAIT, ping_pong(&mut peer)).await??;
    publisher.publish(0, &batch); // seq 1: delivered
    let message = timeout(WAIT, read_raw_message(&mut peer)).await??;
    ensure!(message.len() == 3, "{} frames", message.len());
    assert_eq!(
        message[1],
        1u64.to_be_bytes(),
        "batch 0 was not subscribed to"
    );

    // The cap in bytes: 16 KiB of subscriptions at most, so 64 KiB prefixes (the frame cap)
    // are all ignored, however many are sent.
    let mut big = timeout(WAIT, raw_peer(addr, b"SUB")).await??;
    let prefix = vec![b'x'; 64 * 1024 - 2];
    for _ in 0..200 {
        timeout(WAIT, big.write_all(&subscription(true, &prefix))).await??;
    }
    timeout(WAIT, big.write_all(&subscription(true, b""))).await??;
    timeout(WAIT, ping_pong(&mut big)).await??;
    publisher.publish(0, &batch); // seq 2: both peers hold the empty subscription
    let message = timeout(WAIT, read_raw_message(&mut big)).await??;
    assert_eq!(message[1], 2u64.to_be_bytes());
    Ok(())
}

/// `MAX_PEERS` connections to `addr` that say nothing; each is served (it gets the server's
/// greeting) and holds a slot.
async fn idle_connections(addr: SocketAddr) -> Result<Vec<TcpStream>> {
    let mut idle = Vec::with_capacity(MAX_PEERS);
    for _ in 0..MAX_PEERS {
        let mut stream = timeout(WAIT, TcpStream::connect(addr)).await??;
        let mut greeting = [0u8; 64];
        timeout(WAIT, stream.read_exact(&mut greeting)).await??;
        ensure!(greeting[0] == 0xff && greeting[10] == 3, "{greeting:?}");
        idle.push(stream);
    }
    Ok(idle)
}

/// Whether the server closed `stream` (reads its end, or an error).
async fn closed(stream: &mut TcpStream) -> Result<bool> {
    let mut byte = [0u8; 1];
    Ok(matches!(
        timeout(WAIT, stream.read(&mut byte)).await?,
        Ok(0) | Err(_)
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_give_their_slots_to_real_peers() -> Result<()> {
    let (mut publisher, _metrics) = publisher(true).await?;
    for addr in [publisher.pub_addr(0), publisher.replay_addr(0)] {
        let addr = loopback(addr)?;
        // Fill the socket's cap with connections that never begin their handshake.
        let mut idle = idle_connections(addr).await?;
        // A real peer still gets in at once: it takes the slot of the oldest idle connection.
        let socket_type: &[u8] = if Some(addr.port()) == publisher.pub_addr(0).map(|a| a.port()) {
            b"SUB"
        } else {
            b"DEALER"
        };
        let mut live = timeout(WAIT, raw_peer(addr, socket_type)).await??;
        ensure!(
            closed(&mut idle[0]).await?,
            "the oldest idle connection is open"
        );
        if socket_type == b"SUB" {
            timeout(WAIT, live.write_all(&subscription(true, b""))).await??;
            timeout(WAIT, ping_pong(&mut live)).await??;
            publisher.publish(0, &big_batch());
            let message = timeout(WAIT, read_raw_message(&mut live)).await??;
            assert_eq!(message[1], 0u64.to_be_bytes());
        } else {
            let mut request = vec![0x00, 0x08];
            request.extend_from_slice(&0u64.to_be_bytes());
            timeout(WAIT, live.write_all(&request)).await??;
            let reply = timeout(WAIT, read_raw_message(&mut live)).await??;
            assert_eq!(reply[0], 0u64.to_be_bytes());
        }
        // The others are closed by the handshake deadline.
        for stream in &mut idle[1..] {
            ensure!(closed(stream).await?, "an idle connection is still open");
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_full_of_subscribers_refuses_the_next_until_one_leaves() -> Result<()> {
    let (publisher, _metrics) = publisher(false).await?;
    let addr = loopback(publisher.pub_addr(0))?;
    let mut peers = Vec::with_capacity(MAX_PEERS);
    for _ in 0..MAX_PEERS {
        let mut peer = timeout(WAIT, raw_peer(addr, b"SUB")).await??;
        // Answered: the server has read its READY, the handshake is complete on both sides.
        timeout(WAIT, ping_pong(&mut peer)).await??;
        peers.push(peer);
    }
    // Every connection completed its handshake: the next one is closed without a greeting.
    let mut refused = timeout(WAIT, TcpStream::connect(addr)).await??;
    ensure!(
        closed(&mut refused).await?,
        "the connection past the cap was served"
    );
    // One leaves: its slot is free again.
    drop(peers.pop());
    let started = Instant::now();
    loop {
        if timeout(WAIT, raw_peer(addr, b"SUB")).await?.is_ok() {
            break;
        }
        ensure!(started.elapsed() < WAIT, "the slot never came free");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// A REQ request for batches from `start`: the empty delimiter, then the number.
fn req_request(start: u64) -> Vec<u8> {
    let mut request = vec![0x01, 0x00, 0x00, 0x08];
    request.extend_from_slice(&start.to_be_bytes());
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_req_client_gets_one_reply_per_request() -> Result<()> {
    let (mut publisher, _metrics) = publisher(true).await?;
    let addr = loopback(publisher.replay_addr(0))?;
    let batch = big_batch();
    for _ in 0..5 {
        publisher.publish(0, &batch);
    }
    let mut req = timeout(WAIT, raw_peer(addr, b"REQ")).await??;
    // Each request gets exactly one reply, [empty, seq, payload]: the first batch from the
    // number asked; the next request's reply is its own, no leftover of the first.
    for (start, seq) in [(0u64, 0u64), (3, 3), (4, 4), (2, 2)] {
        timeout(WAIT, req.write_all(&req_request(start))).await??;
        let reply = timeout(WAIT, read_raw_message(&mut req)).await??;
        ensure!(reply.len() == 3, "{} frames", reply.len());
        assert!(reply[0].is_empty(), "the delimiter");
        assert_eq!(reply[1], seq.to_be_bytes());
        assert!(!reply[2].is_empty(), "a payload");
    }
    // Past the last batch: the end marker, alone.
    timeout(WAIT, req.write_all(&req_request(5))).await??;
    let reply = timeout(WAIT, read_raw_message(&mut req)).await??;
    assert_eq!(reply, vec![Vec::new(), END_OF_REPLAY.to_vec(), Vec::new()]);
    // Nothing else was sent: the next frame on the wire is the PONG.
    let mut ping = vec![0x04, 7, 4];
    ping.extend_from_slice(b"PING");
    ping.extend_from_slice(&[0, 10]);
    timeout(WAIT, req.write_all(&ping)).await??;
    let (flags, body) = timeout(WAIT, read_raw_frame(&mut req)).await??;
    assert_eq!((flags, body.as_slice()), (0x04, &b"\x04PONG"[..]));

    // A DEALER asking with the same envelope still gets the whole stream, as from vLLM.
    let mut dealer = timeout(WAIT, raw_peer(addr, b"DEALER")).await??;
    timeout(WAIT, dealer.write_all(&req_request(3))).await??;
    let mut seqs = Vec::new();
    loop {
        let reply = timeout(WAIT, read_raw_message(&mut dealer)).await??;
        if reply[1] == END_OF_REPLAY {
            break;
        }
        seqs.push(u64::from_be_bytes(<[u8; 8]>::try_from(&reply[1][..])?));
    }
    assert_eq!(seqs, vec![3, 4]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replay_buffer_is_bounded_in_bytes() -> Result<()> {
    let (mut publisher, _metrics) = publisher(true).await?;
    // About 40 KB each: 8,000 tokens of 5 MessagePack bytes.
    let mut batch = big_batch();
    if let WireEvent::BlockStored {
        token_ids,
        block_size,
        ..
    } = &mut batch.events[0]
    {
        *token_ids = (100_000..108_000).collect();
        *block_size = 8_000;
    }
    let total = 1_200u64;
    for _ in 0..total {
        publisher.publish(0, &batch);
    }
    let (kept, bytes) = publisher.replay_size(0).context("rank 0")?;
    assert!(bytes <= REPLAY_BUFFER_BYTES, "{bytes} bytes kept");
    assert!(kept < total as usize && kept > 0, "{kept} batches kept");
    assert!(
        bytes + 40_000 > REPLAY_BUFFER_BYTES,
        "the newest that fit: {bytes}"
    );
    // A replay from 0 serves exactly the newest batches kept.
    let addr = loopback(publisher.replay_addr(0))?;
    let mut dealer = timeout(WAIT, raw_peer(addr, b"DEALER")).await??;
    let mut request = vec![0x00, 0x08];
    request.extend_from_slice(&0u64.to_be_bytes());
    timeout(WAIT, dealer.write_all(&request)).await??;
    let mut seqs = Vec::new();
    loop {
        let reply = timeout(WAIT, read_raw_message(&mut dealer)).await??;
        if reply[0] == END_OF_REPLAY {
            break;
        }
        seqs.push(u64::from_be_bytes(<[u8; 8]>::try_from(&reply[0][..])?));
    }
    let first = total - kept as u64;
    assert_eq!(seqs, (first..total).collect::<Vec<_>>());
    Ok(())
}
