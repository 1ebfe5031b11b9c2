//! The IO adapter: a stream wrapper that runs [`HeaderRewriter`] over the client→server
//! direction of an HTTP/2 connection, and the incoming-connection stream tonic servers use.
//!
//! Server side ([`AuthorityFixingStream::server`]): rewrites what is *read* (the client's
//! frames), so the kubelet's socket-path `:authority` reaches `h2` as `localhost`.
//! Client side ([`AuthorityFixingStream::client_forcing`]): rewrites what is *written*, so a
//! Rust test client sends exactly what the kubelet sends.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_stream::StreamExt;
use tonic::transport::server::Connected;

use super::rewrite::{AuthorityPolicy, HeaderRewriter};

const READ_CHUNK: usize = 16 * 1024;

enum Direction {
    /// Rewrite bytes read from the inner stream (we are the server).
    Inbound,
    /// Rewrite bytes written to the inner stream (we are the client).
    Outbound,
}

/// A byte stream whose client→server HTTP/2 header blocks are rewritten (see module doc).
pub struct AuthorityFixingStream<S = UnixStream> {
    inner: S,
    direction: Direction,
    rewriter: HeaderRewriter,
    /// Rewritten bytes not yet handed on (to the reader, or to `inner` when writing).
    pending: Vec<u8>,
    pending_at: usize,
    scratch: Box<[u8]>,
}

impl<S> AuthorityFixingStream<S> {
    /// Server side: replace an invalid `:authority` with `localhost`.
    pub fn server(inner: S) -> Self {
        Self::new(inner, Direction::Inbound, AuthorityPolicy::FixInvalid)
    }

    /// Client side: send `authority` as `:authority` whatever the HTTP/2 client chose.
    pub fn client_forcing(inner: S, authority: impl Into<Vec<u8>>) -> Self {
        Self::new(
            inner,
            Direction::Outbound,
            AuthorityPolicy::Force(authority.into()),
        )
    }

    fn new(inner: S, direction: Direction, policy: AuthorityPolicy) -> Self {
        let scratch = match direction {
            Direction::Inbound => vec![0; READ_CHUNK].into_boxed_slice(),
            Direction::Outbound => Box::default(),
        };
        Self {
            inner,
            direction,
            rewriter: HeaderRewriter::new(policy),
            pending: Vec::new(),
            pending_at: 0,
            scratch,
        }
    }

    /// Header blocks seen so far and how many had their `:authority` rewritten.
    pub fn counts(&self) -> (u64, u64) {
        (self.rewriter.blocks, self.rewriter.rewritten)
    }

    fn pending(&self) -> &[u8] {
        &self.pending[self.pending_at..]
    }

    fn consume_pending(&mut self, n: usize) {
        self.pending_at += n;
        if self.pending_at == self.pending.len() {
            self.pending.clear();
            self.pending_at = 0;
        }
    }
}

fn invalid(e: super::rewrite::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl<S: AsyncWrite + Unpin> AuthorityFixingStream<S> {
    /// Write out everything pending (outbound direction).
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.pending().is_empty() {
            let n =
                ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.pending_at..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.consume_pending(n);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFixingStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Direction::Outbound = this.direction {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        loop {
            if !this.pending().is_empty() {
                let n = this.pending().len().min(buf.remaining());
                buf.put_slice(&this.pending[this.pending_at..this.pending_at + n]);
                this.consume_pending(n);
                return Poll::Ready(Ok(()));
            }
            let mut raw = ReadBuf::new(&mut this.scratch);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut raw))?;
            let filled = raw.filled();
            if filled.is_empty() {
                return Poll::Ready(Ok(())); // EOF
            }
            let (rewriter, pending) = (&mut this.rewriter, &mut this.pending);
            rewriter.feed(filled, pending).map_err(invalid)?;
            // Loop: a read that completed only part of a header block yields nothing yet.
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFixingStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Direction::Inbound = this.direction {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        ready!(this.poll_drain(cx))?;
        this.rewriter
            .feed(buf, &mut this.pending)
            .map_err(invalid)?;
        // Start writing now; what is left goes out on the next write or flush.
        if let Poll::Ready(Err(e)) = this.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl<S: Connected> Connected for AuthorityFixingStream<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// Accepted connections of `listener`, each wrapped to accept a socket-path `:authority`.
/// Use with `tonic::transport::Server::serve_with_incoming_shutdown`.
pub fn serve_unix_incoming(
    listener: UnixListener,
) -> impl Stream<Item = io::Result<AuthorityFixingStream>> {
    UnixListenerStream::new(listener).map(|conn| conn.map(AuthorityFixingStream::server))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::rewrite::{encode_literal, write_frame_header, PREFACE};
    use fluke_hpack::Decoder;
    use tokio::io::{duplex, AsyncReadExt, AsyncWriteExt};

    const SOCK: &str = "/var/lib/kubelet/plugins_registry/gpu.tessera.io-reg.sock";

    /// Preface, then `n` requests (HEADERS with `authority`, DATA) on streams 1, 3, ...
    fn client_bytes(authority: &[u8], n: u32) -> Vec<u8> {
        let mut out = PREFACE.to_vec();
        for i in 0..n {
            let mut block = Vec::new();
            encode_literal(b":method", b"POST", &mut block);
            encode_literal(b":authority", authority, &mut block);
            write_frame_header(block.len(), 0x1, 0x4, 1 + 2 * i, &mut out);
            out.extend(block);
            write_frame_header(3, 0x0, 0x1, 1 + 2 * i, &mut out);
            out.extend(b"abc");
        }
        out
    }

    /// The `:authority` of every HEADERS frame in `bytes` (after the preface).
    fn authorities(bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut rest = &bytes[PREFACE.len()..];
        let mut decoder = Decoder::new();
        let mut found = Vec::new();
        while rest.len() >= 9 {
            let len = (usize::from(rest[1]) << 8) | usize::from(rest[2]);
            if rest[3] == 0x1 {
                for (n, v) in decoder.decode(&rest[9..9 + len]).unwrap() {
                    if n == b":authority" {
                        found.push(v);
                    }
                }
            }
            rest = &rest[9 + len..];
        }
        found
    }

    #[tokio::test]
    async fn server_side_rewrites_what_it_reads_through_tiny_reads() {
        // A 5-byte pipe: every frame arrives split across many reads.
        let (mut client, server) = duplex(5);
        let input = client_bytes(SOCK.as_bytes(), 3);
        let writer = tokio::spawn(async move {
            client.write_all(&input).await.unwrap();
            client.shutdown().await.unwrap();
            client // keep the pipe open until the reader is done
        });
        let mut fixed = AuthorityFixingStream::server(server);
        let mut got = Vec::new();
        let mut buf = [0u8; 3]; // and small reads on our side too
        loop {
            let n = fixed.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        let _client = writer.await.unwrap();
        assert_eq!(authorities(&got), vec![b"localhost".to_vec(); 3]);
        assert_eq!(fixed.counts(), (3, 3));
        // Writes (server → client) pass through untouched.
        fixed.write_all(b"raw").await.unwrap();
    }

    #[tokio::test]
    async fn client_side_rewrites_what_it_writes_under_backpressure() {
        let (client, mut server) = duplex(7);
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            server.read_to_end(&mut got).await.unwrap();
            got
        });
        let mut forcing = AuthorityFixingStream::client_forcing(client, SOCK);
        let input = client_bytes(b"localhost", 2);
        for piece in input.chunks(11) {
            forcing.write_all(piece).await.unwrap();
        }
        forcing.shutdown().await.unwrap();
        drop(forcing);
        let got = reader.await.unwrap();
        assert_eq!(authorities(&got), vec![SOCK.as_bytes().to_vec(); 2]);
    }

    #[tokio::test]
    async fn garbage_is_an_invalid_data_error() {
        let (mut client, server) = duplex(64);
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let mut fixed = AuthorityFixingStream::server(server);
        let err = fixed.read(&mut [0u8; 64]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
