//! The pure part of the `:authority` fix: a push parser over the client→server HTTP/2 byte
//! stream that re-encodes every header block and rewrites `:authority` on the way.
//!
//! ```text
//!  client bytes ──▶ preface (24 B, as is) ──▶ frame header (9 B)
//!                     ├─ HEADERS / CONTINUATION: buffer the fragment; at END_HEADERS decode
//!                     │  it (HPACK, mirroring the client's dynamic table), rewrite
//!                     │  `:authority`, re-encode as literals without indexing, emit one
//!                     │  HEADERS frame (+ CONTINUATION frames only past 16 KiB)
//!                     └─ any other frame: forwarded byte for byte as it arrives
//! ```
//!
//! Because every block is re-encoded without indexing, the receiving HPACK decoder never
//! adds an entry to its dynamic table: its state stays trivially consistent, whatever the
//! client's encoder did. The client's own table lives in our decoder.

use fluke_hpack::Decoder;

/// The HTTP/2 client connection preface.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The smallest SETTINGS_MAX_FRAME_SIZE a peer may announce: re-encoded blocks are split
/// at this size, which every HTTP/2 server accepts.
pub const MIN_MAX_FRAME_SIZE: usize = 16_384;
/// The largest header block we buffer (gRPC metadata is a few KiB at most).
pub const MAX_HEADER_BLOCK: usize = 1 << 20;
/// SETTINGS_HEADER_TABLE_SIZE of the server (h2's default; tonic does not change it): the
/// largest dynamic table the client's encoder may ask for.
pub const SERVER_HEADER_TABLE_SIZE: usize = 4096;
/// What replaces an `:authority` that is not a URI authority.
pub const FALLBACK_AUTHORITY: &[u8] = b"localhost";

const FRAME_HEADER_LEN: usize = 9;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;

/// Why the byte stream could not be rewritten (the connection is then closed).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("not an HTTP/2 connection: the client preface is wrong")]
    BadPreface,
    #[error("stream {stream}: HEADERS padding ({pad} bytes) exceeds the frame length")]
    BadPadding { stream: u32, pad: usize },
    #[error("stream {stream}: CONTINUATION expected, got frame type {frame_type:#x}")]
    ExpectedContinuation { stream: u32, frame_type: u8 },
    #[error("CONTINUATION on stream {got} without a HEADERS frame before it (open: {open:?})")]
    UnexpectedContinuation { got: u32, open: Option<u32> },
    #[error("stream {stream}: header block larger than {MAX_HEADER_BLOCK} bytes")]
    BlockTooLarge { stream: u32 },
    #[error("stream {stream}: HPACK decoding failed: {reason}")]
    Hpack { stream: u32, reason: String },
}

/// What to do with the `:authority` pseudo-header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthorityPolicy {
    /// Server side: an authority that `http::uri::Authority` rejects (what the `h2`
    /// server checks) becomes [`FALLBACK_AUTHORITY`]; valid ones stay.
    FixInvalid,
    /// Client side (test kubelets): always send this authority, e.g. the socket path.
    Force(Vec<u8>),
}

impl AuthorityPolicy {
    fn apply(&self, value: &[u8]) -> Option<Vec<u8>> {
        match self {
            AuthorityPolicy::FixInvalid => {
                let valid = std::str::from_utf8(value)
                    .ok()
                    .is_some_and(|s| s.parse::<http::uri::Authority>().is_ok());
                (!valid).then(|| FALLBACK_AUTHORITY.to_vec())
            }
            AuthorityPolicy::Force(forced) => Some(forced.clone()),
        }
    }
}

enum State {
    /// Bytes of the preface still expected.
    Preface(usize),
    /// Collecting a frame header.
    FrameHeader,
    /// Forwarding the payload of a frame we do not touch.
    PassThrough { remaining: usize },
    /// Collecting the payload of a HEADERS or CONTINUATION frame.
    HeaderPayload {
        frame_type: u8,
        flags: u8,
        stream: u32,
        len: usize,
    },
}

/// A header block being assembled from HEADERS + CONTINUATION frames.
struct OpenBlock {
    stream: u32,
    end_stream: bool,
    fragment: Vec<u8>,
}

/// Push parser: feed it client bytes in any chunking, get the rewritten bytes.
pub struct HeaderRewriter {
    policy: AuthorityPolicy,
    state: State,
    buf: Vec<u8>,
    open: Option<OpenBlock>,
    decoder: Decoder<'static>,
    /// Header blocks re-encoded so far, and how many had their authority rewritten.
    pub blocks: u64,
    pub rewritten: u64,
}

impl HeaderRewriter {
    pub fn new(policy: AuthorityPolicy) -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(SERVER_HEADER_TABLE_SIZE);
        Self {
            policy,
            state: State::Preface(PREFACE.len()),
            buf: Vec::new(),
            open: None,
            decoder,
            blocks: 0,
            rewritten: 0,
        }
    }

    /// Consume `input` entirely, appending what should be forwarded to `out`.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
        while !input.is_empty() {
            match self.state {
                State::Preface(left) => {
                    let take = left.min(input.len());
                    let at = PREFACE.len() - left;
                    if input[..take] != PREFACE[at..at + take] {
                        return Err(Error::BadPreface);
                    }
                    out.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    self.state = match left - take {
                        0 => State::FrameHeader,
                        n => State::Preface(n),
                    };
                }
                State::FrameHeader => {
                    let take = (FRAME_HEADER_LEN - self.buf.len()).min(input.len());
                    self.buf.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    if self.buf.len() == FRAME_HEADER_LEN {
                        let header = std::mem::take(&mut self.buf);
                        self.on_frame_header(&header, out)?;
                    }
                }
                State::PassThrough { remaining } => {
                    let take = remaining.min(input.len());
                    out.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    self.state = match remaining - take {
                        0 => State::FrameHeader,
                        n => State::PassThrough { remaining: n },
                    };
                }
                State::HeaderPayload {
                    frame_type,
                    flags,
                    stream,
                    len,
                } => {
                    let take = (len - self.buf.len()).min(input.len());
                    self.buf.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    if self.buf.len() == len {
                        let payload = std::mem::take(&mut self.buf);
                        self.state = State::FrameHeader;
                        self.on_header_payload(frame_type, flags, stream, &payload, out)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn on_frame_header(&mut self, h: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
        let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
        let frame_type = h[3];
        let flags = h[4];
        let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
        if let Some(open) = &self.open {
            if frame_type != TYPE_CONTINUATION || stream != open.stream {
                return Err(Error::ExpectedContinuation {
                    stream: open.stream,
                    frame_type,
                });
            }
        }
        match frame_type {
            TYPE_HEADERS | TYPE_CONTINUATION => {
                if frame_type == TYPE_CONTINUATION && self.open.is_none() {
                    return Err(Error::UnexpectedContinuation {
                        got: stream,
                        open: None,
                    });
                }
                if len > MAX_HEADER_BLOCK {
                    return Err(Error::BlockTooLarge { stream });
                }
                self.state = State::HeaderPayload {
                    frame_type,
                    flags,
                    stream,
                    len,
                };
                if len == 0 {
                    self.state = State::FrameHeader;
                    self.on_header_payload(frame_type, flags, stream, &[], out)?;
                }
            }
            _ => {
                out.extend_from_slice(h);
                self.state = match len {
                    0 => State::FrameHeader,
                    n => State::PassThrough { remaining: n },
                };
            }
        }
        Ok(())
    }

    fn on_header_payload(
        &mut self,
        frame_type: u8,
        flags: u8,
        stream: u32,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), Error> {
        let fragment = if frame_type == TYPE_HEADERS {
            let mut body = payload;
            let mut pad = 0;
            if flags & FLAG_PADDED != 0 {
                let (&p, rest) = body
                    .split_first()
                    .ok_or(Error::BadPadding { stream, pad: 1 })?;
                pad = usize::from(p);
                body = rest;
            }
            if flags & FLAG_PRIORITY != 0 {
                body = body.get(5..).ok_or(Error::BadPadding { stream, pad })?;
            }
            if pad > body.len() {
                return Err(Error::BadPadding { stream, pad });
            }
            let fragment = &body[..body.len() - pad];
            self.open = Some(OpenBlock {
                stream,
                end_stream: flags & FLAG_END_STREAM != 0,
                fragment: Vec::with_capacity(fragment.len()),
            });
            fragment
        } else {
            payload
        };
        let open = self.open.as_mut().ok_or(Error::UnexpectedContinuation {
            got: stream,
            open: None,
        })?;
        if open.fragment.len() + fragment.len() > MAX_HEADER_BLOCK {
            return Err(Error::BlockTooLarge { stream });
        }
        open.fragment.extend_from_slice(fragment);
        if flags & FLAG_END_HEADERS != 0 {
            if let Some(block) = self.open.take() {
                self.finish_block(block, out)?;
            }
        }
        Ok(())
    }

    fn finish_block(&mut self, block: OpenBlock, out: &mut Vec<u8>) -> Result<(), Error> {
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        // fluke-hpack 0.3 panics on some truncated blocks (a dynamic table size update
        // whose integer runs past the end): caught, it is the malformed block it is. The
        // connection ends on this error, so the decoder is not used again.
        let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.decoder.decode_with_cb(&block.fragment, |n, v| {
                fields.push((n.into_owned(), v.into_owned()))
            })
        }));
        match decoded {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                return Err(Error::Hpack {
                    stream: block.stream,
                    reason: format!("{e:?}"),
                })
            }
            Err(_) => {
                return Err(Error::Hpack {
                    stream: block.stream,
                    reason: "malformed header block (the HPACK decoder gave up)".into(),
                })
            }
        }
        let mut encoded = Vec::with_capacity(block.fragment.len() * 2);
        let mut changed = false;
        for (name, value) in &fields {
            let value = match name.as_slice() {
                b":authority" => match self.policy.apply(value) {
                    Some(new) => {
                        changed |= new != *value;
                        new
                    }
                    None => value.clone(),
                },
                _ => value.clone(),
            };
            encode_literal(name, &value, &mut encoded);
        }
        self.blocks += 1;
        self.rewritten += u64::from(changed);
        write_header_block(block.stream, block.end_stream, &encoded, out);
        Ok(())
    }
}

/// HPACK "literal header field without indexing — new name", no Huffman (RFC 7541 6.2.2).
pub fn encode_literal(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0x00);
    encode_string(name, out);
    encode_string(value, out);
}

fn encode_string(s: &[u8], out: &mut Vec<u8>) {
    // H bit clear: raw octets. Length as a 7-bit-prefix integer (RFC 7541 5.1).
    encode_integer(s.len(), 7, 0x00, out);
    out.extend_from_slice(s);
}

fn encode_integer(mut value: usize, prefix_bits: u8, first_byte_flags: u8, out: &mut Vec<u8>) {
    let max_prefix = (1usize << prefix_bits) - 1;
    if value < max_prefix {
        out.push(first_byte_flags | value as u8);
        return;
    }
    out.push(first_byte_flags | max_prefix as u8);
    value -= max_prefix;
    while value >= 0x80 {
        out.push((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Emit `block` as HEADERS (+ CONTINUATION frames when it exceeds 16 KiB).
pub fn write_header_block(stream: u32, end_stream: bool, block: &[u8], out: &mut Vec<u8>) {
    let mut chunks = block.chunks(MIN_MAX_FRAME_SIZE).peekable();
    let mut first = true;
    if block.is_empty() {
        let flags = FLAG_END_HEADERS | if end_stream { FLAG_END_STREAM } else { 0 };
        write_frame_header(0, TYPE_HEADERS, flags, stream, out);
        return;
    }
    while let Some(chunk) = chunks.next() {
        let mut flags = 0;
        if first && end_stream {
            flags |= FLAG_END_STREAM;
        }
        if chunks.peek().is_none() {
            flags |= FLAG_END_HEADERS;
        }
        let frame_type = if first {
            TYPE_HEADERS
        } else {
            TYPE_CONTINUATION
        };
        write_frame_header(chunk.len(), frame_type, flags, stream, out);
        out.extend_from_slice(chunk);
        first = false;
    }
}

/// A 9-byte HTTP/2 frame header.
pub fn write_frame_header(len: usize, frame_type: u8, flags: u8, stream: u32, out: &mut Vec<u8>) {
    let len = len as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(frame_type);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
}

#[cfg(test)]
#[path = "rewrite_tests.rs"]
mod tests;
