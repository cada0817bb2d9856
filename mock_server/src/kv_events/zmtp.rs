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
//! - [`handshake`] exchanges the greeting and READY within [`HANDSHAKE_TIMEOUT`] and names the
//!   peer's socket type.
//! - [`serve_subscriber`] runs one subscriber's connection: a reader that applies its
//!   subscriptions to its [`Peer`] and a writer that drains the peer's queue, until either
//!   side ends.
//! - [`serve_replay_client`] runs one replay client's connection: it reads a request, writes
//!   the answer to that client only, and reads the next; a client that neither sends nor reads
//!   for [`REPLAY_IDLE_TIMEOUT`] is closed.
//!
//! Whatever a peer sends costs a bounded amount: a frame is at most [`MAX_INCOMING_FRAME`]
//! bytes and a message [`MAX_INCOMING_FRAMES`] frames, or the connection is closed.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};

use super::peer::{Peer, Subscribed, MAX_SUBSCRIPTIONS, MAX_SUBSCRIPTION_BYTES};

/// How long a peer has to complete the greeting and READY exchange: a real ZeroMQ socket needs
/// one round trip, so a connection still silent after it (an idle or slowloris one) gives its
/// slot back to the next peer.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a replay client may go without sending a request or taking any of its answer; it
/// is closed then (a ZeroMQ DEALER or REQ reconnects by itself when it next sends).
pub(crate) const REPLAY_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest frame accepted from a peer: subscriptions and replay requests are a few bytes,
/// so anything bigger is not a well-behaved peer and its connection is closed.
pub(crate) const MAX_INCOMING_FRAME: u64 = 64 * 1024;

/// Frames per incoming message at most (a replay request has two).
pub(crate) const MAX_INCOMING_FRAMES: usize = 16;

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
/// 3.x with the NULL mechanism and be a socket type `role` talks to; returns that type.
pub(crate) async fn handshake(
    stream: &mut (impl AsyncRead + AsyncWriteExt + Unpin),
    role: Role,
) -> io::Result<Bytes> {
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
                    Ok(Bytes::copy_from_slice(socket_type))
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

/// Applies one message or command a subscriber sent: SUBSCRIBE and CANCEL (ZMTP 3.0 messages
/// or 3.1 commands), PING; anything else is ignored.
fn apply(peer: &Peer, frame: Frame) {
    let (subscribe, prefix) = match frame {
        Frame::Data { body, .. } => match body.first() {
            Some(1) => (true, body.slice(1..)),
            Some(0) => (false, body.slice(1..)),
            _ => return,
        },
        Frame::Command { name, body } => match name.as_ref() {
            b"SUBSCRIBE" => (true, body),
            b"CANCEL" => (false, body),
            b"PING" => return peer.pong(pong_for(&body)),
            _ => return,
        },
    };
    if !subscribe {
        return peer.cancel(&prefix);
    }
    if peer.subscribe(prefix) == Subscribed::Ignored(1) {
        eprintln!(
            "mockserve: warning: KV events subscriber {} holds {MAX_SUBSCRIPTIONS} \
             subscriptions or {MAX_SUBSCRIPTION_BYTES} bytes of them; its further subscriptions \
             are ignored",
            peer.addr
        );
    }
}

/// Serves one subscriber after its handshake until it disconnects, sends something a PUB
/// socket does not accept, or `stop` fires.
pub(crate) async fn serve_subscriber(
    stream: impl AsyncRead + AsyncWriteExt + Unpin,
    peer: Arc<Peer>,
) {
    let (reader, writer) = tokio::io::split(stream);
    let read = async {
        let mut reader = BufReader::new(reader);
        loop {
            match read_frame(&mut reader).await {
                Ok(frame @ Frame::Data { more: false, .. }) | Ok(frame @ Frame::Command { .. }) => {
                    apply(&peer, frame)
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

/// `io` within [`REPLAY_IDLE_TIMEOUT`], or a `TimedOut` error.
async fn within_idle<T>(io: impl Future<Output = io::Result<T>>) -> io::Result<T> {
    tokio::time::timeout(REPLAY_IDLE_TIMEOUT, io)
        .await
        .unwrap_or_else(|_| Err(io::Error::from(io::ErrorKind::TimedOut)))
}

/// Serves one replay client after its handshake: each request message is answered by `answer`
/// with the messages (as frames) to write, written to this client only, before the next
/// request is read. Returns when the client disconnects, misbehaves, or sends nothing and
/// takes none of its answer for [`REPLAY_IDLE_TIMEOUT`].
pub(crate) async fn serve_replay_client(
    stream: impl AsyncRead + AsyncWriteExt + Unpin,
    answer: impl Fn(&[Bytes]) -> Vec<Vec<Bytes>>,
) -> io::Result<()> {
    let (reader, writer) = tokio::io::split(stream);
    let mut reader = BufReader::new(reader);
    let mut writer = BufWriter::with_capacity(64 * 1024, writer);
    let mut frames: Vec<Bytes> = Vec::new();
    loop {
        match within_idle(read_frame(&mut reader)).await? {
            Frame::Command { name, body } => {
                if name.as_ref() == b"PING" {
                    within_idle(writer.write_all(&pong_for(&body))).await?;
                    within_idle(writer.flush()).await?;
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
                    within_idle(write_message(&mut writer, &message)).await?;
                }
                within_idle(writer.flush()).await?;
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
}
