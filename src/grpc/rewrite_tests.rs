//! Unit tests of [`super::HeaderRewriter`]: chunking, CONTINUATION, padding, dynamic-table
//! references across requests (RFC 7541 C.4 vectors, Huffman-coded), errors.

use super::*;
use fluke_hpack::{Decoder, Encoder};

const SOCK: &[u8] = b"/var/lib/kubelet/plugins_registry/gpu.tessera.io-reg.sock";

/// A frame as read back from the rewriter's output.
#[derive(Debug, PartialEq, Eq)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    write_frame_header(payload.len(), kind, flags, stream, &mut out);
    out.extend_from_slice(payload);
    out
}

fn parse(mut bytes: &[u8]) -> Vec<Frame> {
    assert_eq!(&bytes[..PREFACE.len()], PREFACE, "preface forwarded as is");
    bytes = &bytes[PREFACE.len()..];
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        let len =
            (usize::from(bytes[0]) << 16) | (usize::from(bytes[1]) << 8) | usize::from(bytes[2]);
        let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
        frames.push(Frame {
            kind: bytes[3],
            flags: bytes[4],
            stream,
            payload: bytes[9..9 + len].to_vec(),
        });
        bytes = &bytes[9 + len..];
    }
    frames
}

fn run(policy: AuthorityPolicy, input: &[u8], chunk: usize) -> Result<Vec<u8>, Error> {
    let mut rw = HeaderRewriter::new(policy);
    let mut out = Vec::new();
    for piece in input.chunks(chunk) {
        rw.feed(piece, &mut out)?;
    }
    Ok(out)
}

fn request_headers(authority: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    [
        (&b":method"[..], &b"POST"[..]),
        (b":scheme", b"http"),
        (b":path", b"/pluginregistration.Registration/GetInfo"),
        (b":authority", authority),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ]
    .iter()
    .map(|(n, v)| (n.to_vec(), v.to_vec()))
    .collect()
}

fn encode(enc: &mut Encoder<'_>, headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    enc.encode(headers.iter().map(|(n, v)| (&n[..], &v[..])))
}

fn authority_of(headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    headers
        .iter()
        .find(|(n, _)| n == b":authority")
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

fn client_stream(blocks: &[Vec<u8>]) -> Vec<u8> {
    let mut input = PREFACE.to_vec();
    input.extend(frame(0x4, 0, 0, &[0, 4, 0, 0, 0xff, 0xff])); // SETTINGS
    for (i, block) in blocks.iter().enumerate() {
        let stream = 1 + 2 * i as u32;
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, stream, block));
        input.extend(frame(0x0, FLAG_END_STREAM, stream, b"\0\0\0\0\x02\x08\x01"));
    }
    input
}

#[test]
fn socket_path_authority_becomes_localhost_for_every_chunking() {
    let mut enc = Encoder::new();
    let blocks = vec![
        encode(&mut enc, &request_headers(SOCK)),
        encode(&mut enc, &request_headers(SOCK)), // fully indexed the second time
    ];
    let input = client_stream(&blocks);
    let whole = run(AuthorityPolicy::FixInvalid, &input, input.len()).unwrap();
    for chunk in 1..=20 {
        assert_eq!(
            run(AuthorityPolicy::FixInvalid, &input, chunk).unwrap(),
            whole,
            "chunk {chunk}"
        );
    }
    let frames = parse(&whole);
    let kinds: Vec<u8> = frames.iter().map(|f| f.kind).collect();
    assert_eq!(kinds, [0x4, 0x1, 0x0, 0x1, 0x0]);
    assert_eq!(
        frames[0].payload,
        [0, 4, 0, 0, 0xff, 0xff],
        "SETTINGS as is"
    );
    assert_eq!(frames[2].payload, b"\0\0\0\0\x02\x08\x01", "DATA as is");
    let mut server = Decoder::new();
    for f in [&frames[1], &frames[3]] {
        assert_eq!(f.flags, FLAG_END_HEADERS);
        let got = server.decode(&f.payload).unwrap();
        let mut want = request_headers(FALLBACK_AUTHORITY);
        assert_eq!(got, std::mem::take(&mut want));
    }
}

#[test]
fn authority_policy_table() {
    let cases: [(&AuthorityPolicy, &[u8], &[u8]); 6] = [
        (&AuthorityPolicy::FixInvalid, SOCK, FALLBACK_AUTHORITY),
        (&AuthorityPolicy::FixInvalid, b"localhost", b"localhost"),
        (
            &AuthorityPolicy::FixInvalid,
            b"10.0.0.1:8080",
            b"10.0.0.1:8080",
        ),
        (&AuthorityPolicy::FixInvalid, b"a b", FALLBACK_AUTHORITY),
        (&AuthorityPolicy::FixInvalid, b"\xff", FALLBACK_AUTHORITY),
        (&AuthorityPolicy::Force(SOCK.to_vec()), b"localhost", SOCK),
    ];
    for (policy, sent, want) in cases {
        let block = encode(&mut Encoder::new(), &request_headers(sent));
        let out = run(policy.clone(), &client_stream(&[block]), 7).unwrap();
        let got = Decoder::new().decode(&parse(&out)[1].payload).unwrap();
        assert_eq!(authority_of(&got), want, "{policy:?} {sent:?}");
    }
}

#[test]
fn continuation_padding_and_priority_are_folded_into_one_headers_frame() {
    let block = encode(&mut Encoder::new(), &request_headers(SOCK));
    let (a, rest) = block.split_at(10);
    let (b, c) = rest.split_at(20);
    // HEADERS: PADDED (3 bytes) + PRIORITY + END_STREAM, then two CONTINUATION frames.
    let mut payload = vec![3];
    payload.extend_from_slice(&[0x80, 0, 0, 1, 15]);
    payload.extend_from_slice(a);
    payload.extend_from_slice(&[0, 0, 0]);
    let mut input = PREFACE.to_vec();
    input.extend(frame(
        TYPE_HEADERS,
        FLAG_PADDED | FLAG_PRIORITY | FLAG_END_STREAM,
        3,
        &payload,
    ));
    input.extend(frame(TYPE_CONTINUATION, 0, 3, b));
    input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 3, c));
    input.extend(frame(0x6, 0, 0, b"pingpong")); // PING after the block
    for chunk in [1, 3, input.len()] {
        let frames = parse(&run(AuthorityPolicy::FixInvalid, &input, chunk).unwrap());
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].kind, TYPE_HEADERS);
        assert_eq!(frames[0].flags, FLAG_END_HEADERS | FLAG_END_STREAM);
        assert_eq!(frames[0].stream, 3);
        let got = Decoder::new().decode(&frames[0].payload).unwrap();
        assert_eq!(got, request_headers(FALLBACK_AUTHORITY));
        assert_eq!(frames[1].payload, b"pingpong");
    }
}

#[test]
fn huffman_and_dynamic_table_references_across_requests() {
    // RFC 7541 C.4.1 and C.4.2: Huffman-coded `:authority: www.example.com`, added to the
    // dynamic table by the first request and referenced by index 62 in the second.
    let first = [
        0x82, 0x86, 0x84, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90,
        0xf4, 0xff,
    ];
    let second = [
        0x82, 0x86, 0x84, 0xbe, 0x58, 0x86, 0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf,
    ];
    let input = client_stream(&[first.to_vec(), second.to_vec()]);
    let out = run(AuthorityPolicy::Force(b"/run/x.sock".to_vec()), &input, 5).unwrap();
    let frames = parse(&out);
    let mut server = Decoder::new();
    let r1 = server.decode(&frames[1].payload).unwrap();
    let r2 = server.decode(&frames[3].payload).unwrap();
    assert_eq!(authority_of(&r1), b"/run/x.sock");
    assert_eq!(authority_of(&r2), b"/run/x.sock");
    assert_eq!(
        r2.last().unwrap(),
        &(b"cache-control".to_vec(), b"no-cache".to_vec())
    );
    assert_eq!(r2[2], (b":path".to_vec(), b"/".to_vec()));
}

#[test]
fn oversized_blocks_are_split_at_16_kib() {
    let mut headers = request_headers(SOCK);
    headers.push((b"x-big".to_vec(), vec![b'a'; 40_000]));
    let block = encode(&mut Encoder::new(), &headers);
    let mut input = PREFACE.to_vec();
    // The client itself used a 64 KiB frame (the server allowed it).
    input.extend(frame(
        TYPE_HEADERS,
        FLAG_END_HEADERS | FLAG_END_STREAM,
        1,
        &block,
    ));
    let frames = parse(&run(AuthorityPolicy::FixInvalid, &input, 4096).unwrap());
    let kinds: Vec<(u8, u8)> = frames.iter().map(|f| (f.kind, f.flags)).collect();
    assert_eq!(
        kinds,
        [
            (TYPE_HEADERS, FLAG_END_STREAM),
            (TYPE_CONTINUATION, 0),
            (TYPE_CONTINUATION, FLAG_END_HEADERS)
        ]
    );
    assert!(frames.iter().all(|f| f.payload.len() <= MIN_MAX_FRAME_SIZE));
    let joined: Vec<u8> = frames.iter().flat_map(|f| f.payload.clone()).collect();
    let mut want = request_headers(FALLBACK_AUTHORITY);
    want.push((b"x-big".to_vec(), vec![b'a'; 40_000]));
    assert_eq!(Decoder::new().decode(&joined).unwrap(), want);
}

#[test]
fn malformed_input_is_an_error_not_a_panic() {
    let headers = |flags, payload: &[u8]| {
        let mut v = PREFACE.to_vec();
        v.extend(frame(TYPE_HEADERS, flags, 1, payload));
        v
    };
    let mut interleaved = headers(0, &[0x82]);
    interleaved.extend(frame(0x0, 0, 1, b"x"));
    let mut orphan = PREFACE.to_vec();
    orphan.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, &[0x82]));
    let cases: Vec<(&str, Vec<u8>, Error)> = vec![
        ("preface", b"GET / HTTP/1.1\r\n".to_vec(), Error::BadPreface),
        (
            "padding",
            headers(FLAG_PADDED | FLAG_END_HEADERS, &[9, 0x82]),
            Error::BadPadding { stream: 1, pad: 9 },
        ),
        (
            "empty padded",
            headers(FLAG_PADDED | FLAG_END_HEADERS, &[]),
            Error::BadPadding { stream: 1, pad: 1 },
        ),
        (
            "interleaved",
            interleaved,
            Error::ExpectedContinuation {
                stream: 1,
                frame_type: 0,
            },
        ),
        (
            "orphan",
            orphan,
            Error::UnexpectedContinuation { got: 1, open: None },
        ),
    ];
    for (name, input, want) in cases {
        assert_eq!(
            run(AuthorityPolicy::FixInvalid, &input, 3),
            Err(want),
            "{name}"
        );
    }
    // Index 200 is in no table: an HPACK error naming the stream.
    let err = run(
        AuthorityPolicy::FixInvalid,
        &headers(FLAG_END_HEADERS, &[0xff, 0x49]),
        64,
    )
    .unwrap_err();
    assert!(matches!(err, Error::Hpack { stream: 1, .. }), "{err:?}");
}

#[test]
fn integer_encoding_matches_rfc_7541_c_1() {
    let mut out = Vec::new();
    encode_integer(10, 5, 0, &mut out);
    encode_integer(1337, 5, 0, &mut out);
    encode_integer(42, 8, 0, &mut out);
    assert_eq!(out, [10, 31, 154, 10, 42]);
}

#[test]
fn table_size_updates_beyond_the_servers_setting_are_refused() {
    let block = |size_update: &[u8]| {
        let mut b = size_update.to_vec();
        b.extend(encode(&mut Encoder::new(), &request_headers(SOCK)));
        client_stream(&[b])
    };
    // 0x3f e1 1f = size update to 4096: allowed; 0x3f e1 3f = 8192: refused.
    assert!(run(AuthorityPolicy::FixInvalid, &block(&[0x3f, 0xe1, 0x1f]), 9).is_ok());
    let err = run(AuthorityPolicy::FixInvalid, &block(&[0x3f, 0xe1, 0x3f]), 9).unwrap_err();
    assert!(matches!(err, Error::Hpack { stream: 1, .. }), "{err:?}");
}

/// A HEADERS frame (with priority fields) whose block is one byte: a dynamic table size
/// update whose integer runs past the end. The HPACK crate panics on it; the rewriter
/// answers an HPACK error (found by the property test below).
#[test]
fn a_truncated_table_size_update_is_an_error_not_a_panic() {
    let mut input = PREFACE.to_vec();
    input.extend(frame(
        TYPE_HEADERS,
        FLAG_END_HEADERS | FLAG_PRIORITY,
        1,
        &[0, 0, 0, 0, 0, 0x3f],
    ));
    for chunk in [1, 64] {
        let result = run(AuthorityPolicy::FixInvalid, &input, chunk);
        assert!(
            matches!(result, Err(Error::Hpack { stream: 1, .. })),
            "{result:?}"
        );
    }
}

proptest::proptest! {
    /// Arbitrary header-block bytes and frame flags, in arbitrary chunks: an error at
    /// worst, never a panic.
    #[test]
    fn arbitrary_header_blocks_never_panic(
        blocks in proptest::collection::vec(
            (proptest::collection::vec(proptest::num::u8::ANY, 0..64), proptest::num::u8::ANY),
            1..4,
        ),
        chunk in 1usize..32,
    ) {
        let mut input = PREFACE.to_vec();
        for (i, (payload, flags)) in blocks.iter().enumerate() {
            let kind = if i % 2 == 0 { TYPE_HEADERS } else { TYPE_CONTINUATION };
            input.extend(frame(kind, *flags, 1, payload));
        }
        let _ = run(AuthorityPolicy::FixInvalid, &input, chunk);
    }
}
