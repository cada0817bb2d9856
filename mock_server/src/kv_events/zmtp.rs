//! The wire side of the KV-event sockets: just enough ZMTP 3.0 (RFC 23, NULL mechanism) over
//! tokio TCP to be a PUB socket and a ROUTER socket, with each peer served by its own task.
//!
//! Why not the `zeromq` crate's sockets: its `PubSocket::send` writes a message to every
//! subscriber in turn and awaits each write, and its `RouterSocket::send` awaits the peer's
//! write as well, with no high-water mark or send timeout in between. One subscriber that stops
//! reading therefore stalls the rank's whole socket once its TCP buffers fill, and one replay
//! client that stops reading blocks the replay socket for everyone. libzmq (what vLLM uses)
//! keeps a queue per peer and drops only that peer's messages past its high-water mark. The
//! crate's lower layers (framed codec, handshake) are private, so this module speaks the
//! protocol itself: the greeting, the READY command, frames, and SUBSCRIBE/CANCEL (as ZMTP 3.0
//! messages or ZMTP 3.1 commands), PING answered with PONG. It is a few hundred lines and
//! each peer's state is plain data, so the isolation is easy to see and to test.
//!
//! - [`Peer`] is one connected subscriber: its subscriptions and a queue of at most
//!   `capacity` encoded messages. [`Peer::offer`] never waits: a full queue drops its oldest
//!   message (the subscriber sees the gap in the sequence numbers and can ask the replay
//!   socket for it).
//! - [`serve_subscriber`] runs one subscriber's connection: a reader that applies its
//!   subscriptions and a writer that drains its queue, until either side ends.
//! - [`serve_replay_client`] runs one replay client's connection: it reads a request, writes
//!   the answer to that client only, and reads the next.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// How long a peer has to complete the greeting and READY exchange.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest frame accepted from a peer: subscriptions and replay requests are a few bytes,
/// so anything bigger is not a well-behaved peer and its connection is closed.
pub(crate) const MAX_INCOMING_FRAME: u64 = 64 * 1024;

/// Frames per incoming message at most (a replay request has two).
const MAX_INCOMING_FRAMES: usize = 16;

/// The socket role this side plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Publishes to SUB and XSUB peers.
    Pub,
    /// Answers DEALER, REQ and ROUTER peers.
    Router,
}

impl Role {
    fn name(self) -> &'static [u8] {
        match self {
            Role::Pub => b"PUB",
            Role::Router => b"ROUTER",
        }
    }

    /// Whether a peer of `socket_type` may talk to this role (ZMTP's compatibility table).
    fn accepts(self, socket_type: &[u8]) -> bool {
        match self {
            Role::Pub => matches!(socket_type, b"SUB" | b"XSUB"),
            Role::Router => matches!(socket_type, b"DEALER" | b"REQ" | b"ROUTER"),
        }
    }
}

const FLAG_MORE: u8 = 0x01;
const FLAG_LONG: u8 = 0x02;
const FLAG_COMMAND: u8 = 0x04;

/// Appends a frame's head (flags and size) for a body of `len` bytes to `out`.
fn put_head(out: &mut Vec<u8>, flags: u8, len: usize) {
    if let Ok(short) = u8::try_from(len) {
        out.push(flags);
        out.push(short);
    } else {
        out.push(flags | FLAG_LONG);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
}

/// Appends one frame (data or command) to `out`.
fn put_frame(out: &mut Vec<u8>, flags: u8, body: &[u8]) {
    put_head(out, flags, body.len());
    out.extend_from_slice(body);
}

/// One message, every frame but the last flagged MORE, ready to write.
pub(crate) fn encode_message(frames: &[&[u8]]) -> Bytes {
    let len: usize = frames.iter().map(|f| f.len() + 9).sum();
    let mut out = Vec::with_capacity(len);
    for (i, frame) in frames.iter().enumerate() {
        let more = if i + 1 < frames.len() { FLAG_MORE } else { 0 };
        put_frame(&mut out, more, frame);
    }
    Bytes::from(out)
}

/// A command frame: its name's length, its name, its body.
fn encode_command(name: &[u8], body: &[u8]) -> Vec<u8> {
    let mut command = Vec::with_capacity(1 + name.len() + body.len());
    command.push(name.len() as u8);
    command.extend_from_slice(name);
    command.extend_from_slice(body);
    let mut out = Vec::with_capacity(command.len() + 9);
    put_frame(&mut out, FLAG_COMMAND, &command);
    out
}

/// What one frame read from a peer is.
#[derive(Debug, PartialEq, Eq)]
enum Frame {
    /// A command: its name and body.
    Command { name: Bytes, body: Bytes },
    /// A message frame; `more` when another frame of the same message follows.
    Data { more: bool, body: Bytes },
}

fn protocol_error(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// Reads one frame; frames over [`MAX_INCOMING_FRAME`] and malformed commands are errors.
async fn read_frame(reader: &mut (impl AsyncRead + Unpin)) -> io::Result<Frame> {
    let flags = reader.read_u8().await?;
    let len = if flags & FLAG_LONG != 0 {
        reader.read_u64().await?
    } else {
        u64::from(reader.read_u8().await?)
    };
    if len > MAX_INCOMING_FRAME {
        return Err(protocol_error("frame too large"));
    }
    let mut body = vec![0; len as usize];
    reader.read_exact(&mut body).await?;
    let body = Bytes::from(body);
    if flags & FLAG_COMMAND == 0 {
        return Ok(Frame::Data {
            more: flags & FLAG_MORE != 0,
            body,
        });
    }
    let name_len = usize::from(
        *body
            .first()
            .ok_or_else(|| protocol_error("empty command"))?,
    );
    if body.len() < 1 + name_len {
        return Err(protocol_error("truncated command name"));
    }
    Ok(Frame::Command {
        name: body.slice(1..1 + name_len),
        body: body.slice(1 + name_len..),
    })
}

/// The 64-byte greeting: signature, version 3.0, mechanism NULL, not as-server.
fn greeting() -> [u8; 64] {
    let mut out = [0u8; 64];
    out[0] = 0xff;
    out[9] = 0x7f;
    out[10] = 3;
    out[11] = 0;
    out[12..16].copy_from_slice(b"NULL");
    out
}

/// The value of property `name` in a READY command's body (ZMTP metadata).
fn property<'a>(mut metadata: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    while let Some((&name_len, rest)) = metadata.split_first() {
        let name_len = usize::from(name_len);
        let key = rest.get(..name_len)?;
        let rest = &rest[name_len..];
        let value_len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        let value = rest.get(4..4 + value_len)?;
        if key.eq_ignore_ascii_case(name) {
            return Some(value);
        }
        metadata = &rest[4 + value_len..];
    }
    None
}

/// The greeting and READY exchange, within [`HANDSHAKE_TIMEOUT`]: the peer must speak ZMTP
/// 3.x with the NULL mechanism and be a socket type `role` talks to.
pub(crate) async fn handshake(stream: &mut TcpStream, role: Role) -> io::Result<()> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        stream.write_all(&greeting()).await?;
        let mut theirs = [0u8; 64];
        stream.read_exact(&mut theirs).await?;
        if theirs[0] != 0xff || theirs[9] != 0x7f || theirs[10] < 3 {
            return Err(protocol_error("not a ZMTP 3 peer"));
        }
        if &theirs[12..16] != b"NULL" || theirs[16..32].iter().any(|&b| b != 0) {
            return Err(protocol_error("only the NULL mechanism is supported"));
        }
        let mut metadata = Vec::new();
        metadata.push(11);
        metadata.extend_from_slice(b"Socket-Type");
        metadata.extend_from_slice(&(role.name().len() as u32).to_be_bytes());
        metadata.extend_from_slice(role.name());
        stream
            .write_all(&encode_command(b"READY", &metadata))
            .await?;
        match read_frame(stream).await? {
            Frame::Command { name, body } if name.as_ref() == b"READY" => {
                let socket_type = property(&body, b"Socket-Type").unwrap_or_default();
                if role.accepts(socket_type) {
                    Ok(())
                } else {
                    Err(protocol_error("incompatible socket type"))
                }
            }
            _ => Err(protocol_error("expected READY")),
        }
    })
    .await
    .unwrap_or_else(|_| Err(io::Error::from(io::ErrorKind::TimedOut)))
}

/// The PONG answering a PING command's body (TTL, then the context echoed back).
fn pong_for(ping: &[u8]) -> Bytes {
    Bytes::from(encode_command(b"PONG", ping.get(2..).unwrap_or_default()))
}

/// One subscriber's state, shared by the publishing side ([`Peer::offer`]) and its connection
/// task. A `std` mutex: every section is a few pushes and pops, never across an await.
#[derive(Debug)]
pub(crate) struct Peer {
    /// The subscriber's address, for log lines.
    pub addr: SocketAddr,
    /// Messages queued at most; past it the oldest is dropped.
    capacity: usize,
    state: Mutex<PeerState>,
    /// Woken when a message (or a PONG) is queued.
    ready: Notify,
}

#[derive(Debug, Default)]
struct PeerState {
    /// Topic prefixes subscribed to (a multiset, as in ZeroMQ: each CANCEL removes one).
    subscriptions: Vec<Bytes>,
    /// Encoded messages not yet written.
    queue: VecDeque<Bytes>,
    /// A PONG to write before the next message.
    pong: Option<Bytes>,
    /// Messages dropped because the queue was full.
    dropped: u64,
}

/// What [`Peer::offer`] did with a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Offer {
    /// The subscriber has no subscription matching the topic.
    NotSubscribed,
    /// Queued.
    Queued,
    /// Queued, and the oldest queued message was dropped to make room.
    QueuedDroppingOldest,
}

impl Peer {
    /// A subscriber at `addr` with room for `capacity` messages (at least one).
    pub(crate) fn new(addr: SocketAddr, capacity: usize) -> Peer {
        Peer {
            addr,
            capacity: capacity.max(1),
            state: Mutex::default(),
            ready: Notify::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, PeerState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `message` if a subscription matches `topic`, dropping the oldest queued message
    /// when the queue is full. Never waits.
    pub(crate) fn offer(&self, topic: &[u8], message: &Bytes) -> Offer {
        let mut state = self.state();
        if !state.subscriptions.iter().any(|s| topic.starts_with(s)) {
            return Offer::NotSubscribed;
        }
        let mut offer = Offer::Queued;
        if state.queue.len() >= self.capacity {
            state.queue.pop_front();
            state.dropped += 1;
            offer = Offer::QueuedDroppingOldest;
        }
        state.queue.push_back(message.clone());
        drop(state);
        self.ready.notify_one();
        offer
    }

    /// Messages dropped for this subscriber so far.
    pub(crate) fn dropped(&self) -> u64 {
        self.state().dropped
    }

    /// Applies one message or command the subscriber sent.
    fn apply(&self, frame: Frame) {
        let mut state = self.state();
        let (subscribe, topic) = match frame {
            Frame::Data { body, .. } => match body.first() {
                Some(1) => (true, body.slice(1..)),
                Some(0) => (false, body.slice(1..)),
                _ => return,
            },
            Frame::Command { name, body } => match name.as_ref() {
                b"SUBSCRIBE" => (true, body),
                b"CANCEL" => (false, body),
                b"PING" => {
                    state.pong = Some(pong_for(&body));
                    drop(state);
                    self.ready.notify_one();
                    return;
                }
                _ => return,
            },
        };
        if subscribe {
            state.subscriptions.push(topic);
        } else if let Some(i) = state.subscriptions.iter().position(|s| *s == topic) {
            state.subscriptions.swap_remove(i);
        }
    }

    /// The next thing to write: a PONG first, else queued messages.
    fn next_chunk(&self, out: &mut Vec<Bytes>) {
        let mut state = self.state();
        out.extend(state.pong.take());
        out.extend(state.queue.drain(..));
    }
}

/// Serves one subscriber after its handshake until it disconnects, sends something a PUB
/// socket does not accept, or `stop` fires.
pub(crate) async fn serve_subscriber(stream: TcpStream, peer: Arc<Peer>) {
    let (reader, writer) = stream.into_split();
    let read = async {
        let mut reader = BufReader::new(reader);
        loop {
            match read_frame(&mut reader).await {
                Ok(frame @ Frame::Data { more: false, .. }) | Ok(frame @ Frame::Command { .. }) => {
                    peer.apply(frame)
                }
                // A SUB sends one-frame messages only.
                Ok(Frame::Data { more: true, .. }) | Err(_) => return,
            }
        }
    };
    let write = async {
        let mut writer = BufWriter::with_capacity(64 * 1024, writer);
        let mut chunk = Vec::new();
        loop {
            // Registered before looking, so a message queued in between still wakes us.
            let notified = peer.ready.notified();
            peer.next_chunk(&mut chunk);
            if chunk.is_empty() {
                notified.await;
                continue;
            }
            for message in chunk.drain(..) {
                if writer.write_all(&message).await.is_err() {
                    return;
                }
            }
            if writer.flush().await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = read => {}
        () = write => {}
    }
}

/// Writes one message frame by frame (the bodies are not copied into a message buffer).
async fn write_message(
    writer: &mut (impl AsyncWriteExt + Unpin),
    frames: &[Bytes],
) -> io::Result<()> {
    for (i, frame) in frames.iter().enumerate() {
        let more = if i + 1 < frames.len() { FLAG_MORE } else { 0 };
        let mut head = Vec::with_capacity(9);
        put_head(&mut head, more, frame.len());
        writer.write_all(&head).await?;
        writer.write_all(frame).await?;
    }
    Ok(())
}

/// Serves one replay client after its handshake: each request message is answered by `answer`
/// with the messages (as frames) to write, written to this client only, before the next
/// request is read. Returns when the client disconnects or misbehaves.
pub(crate) async fn serve_replay_client(
    stream: TcpStream,
    answer: impl Fn(&[Bytes]) -> Vec<Vec<Bytes>>,
) -> io::Result<()> {
    let (reader, writer) = stream.into_split();
    let mut reader = BufReader::new(reader);
    let mut writer = BufWriter::with_capacity(64 * 1024, writer);
    let mut frames: Vec<Bytes> = Vec::new();
    loop {
        match read_frame(&mut reader).await? {
            Frame::Command { name, body } => {
                if name.as_ref() == b"PING" {
                    writer.write_all(&pong_for(&body)).await?;
                    writer.flush().await?;
                }
            }
            Frame::Data { more, body } => {
                if frames.len() == MAX_INCOMING_FRAMES {
                    return Err(protocol_error("too many frames in one message"));
                }
                frames.push(body);
                if more {
                    continue;
                }
                for message in answer(&frames) {
                    write_message(&mut writer, &message).await?;
                }
                writer.flush().await?;
                frames.clear();
            }
        }
    }
}

/// Every frame in `bytes` (tests read encoded messages without a socket).
#[cfg(test)]
async fn frames_of(bytes: &[u8]) -> io::Result<Vec<Frame>> {
    let mut reader = bytes;
    let mut out = Vec::new();
    while !reader.is_empty() {
        out.push(read_frame(&mut reader).await?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn messages_round_trip_short_and_long_frames() {
        let long = vec![7u8; 300];
        let bytes = encode_message(&[b"topic", &long, b""]);
        let frames = frames_of(&bytes).await.expect("decodes");
        assert_eq!(
            frames,
            vec![
                Frame::Data {
                    more: true,
                    body: Bytes::from_static(b"topic")
                },
                Frame::Data {
                    more: true,
                    body: Bytes::from(long)
                },
                Frame::Data {
                    more: false,
                    body: Bytes::new()
                },
            ]
        );
        // The long frame's flags carry LONG and an 8-byte size.
        assert_eq!(bytes[7], FLAG_MORE | FLAG_LONG);
        assert_eq!(&bytes[8..16], &300u64.to_be_bytes());
    }

    #[tokio::test]
    async fn oversized_frames_are_refused() {
        let mut bytes = vec![FLAG_LONG];
        bytes.extend_from_slice(&(MAX_INCOMING_FRAME + 1).to_be_bytes());
        assert!(frames_of(&bytes).await.is_err());
    }

    #[test]
    fn ready_metadata_is_read_by_name() {
        let mut metadata = vec![8];
        metadata.extend_from_slice(b"Identity");
        metadata.extend_from_slice(&2u32.to_be_bytes());
        metadata.extend_from_slice(b"id");
        metadata.push(11);
        metadata.extend_from_slice(b"socket-type");
        metadata.extend_from_slice(&3u32.to_be_bytes());
        metadata.extend_from_slice(b"SUB");
        assert_eq!(property(&metadata, b"Socket-Type"), Some(&b"SUB"[..]));
        assert_eq!(property(&metadata, b"Missing"), None);
        assert_eq!(property(&metadata[..5], b"Socket-Type"), None);
    }

    #[test]
    fn a_full_queue_drops_its_oldest_message_and_counts_it() {
        let peer = Peer::new(SocketAddr::from(([127, 0, 0, 1], 1)), 2);
        let m = |n: u8| Bytes::from(vec![n]);
        assert_eq!(peer.offer(b"kv", &m(0)), Offer::NotSubscribed);
        peer.apply(Frame::Data {
            more: false,
            body: Bytes::from_static(b"\x01k"),
        });
        assert_eq!(peer.offer(b"kv", &m(1)), Offer::Queued);
        assert_eq!(peer.offer(b"kv", &m(2)), Offer::Queued);
        assert_eq!(peer.offer(b"kv", &m(3)), Offer::QueuedDroppingOldest);
        assert_eq!(peer.offer(b"other", &m(4)), Offer::NotSubscribed);
        assert_eq!(peer.dropped(), 1);
        let mut chunk = Vec::new();
        peer.next_chunk(&mut chunk);
        assert_eq!(chunk, vec![m(2), m(3)]);
        // A ZMTP 3.1 CANCEL command removes the subscription.
        peer.apply(Frame::Command {
            name: Bytes::from_static(b"CANCEL"),
            body: Bytes::from_static(b"k"),
        });
        assert_eq!(peer.offer(b"kv", &m(5)), Offer::NotSubscribed);
    }
}
