//! KV-event peers are isolated: a subscriber or replay client that stops reading loses (or
//! delays) only its own messages. The stalled peers here are raw TCP sockets that complete the
//! ZMTP handshake themselves (written here, independently of the server's code) and then never
//! read; the live peers are the `zeromq` crate's sockets.
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
};
use mock_server::metrics::{Metrics, WorkerLabel};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::unconstrained;
use tokio::time::timeout;
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
