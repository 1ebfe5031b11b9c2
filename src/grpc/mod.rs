//! gRPC plumbing shared by the kubelet-facing servers: accepting the `:authority` the
//! kubelet actually sends over unix sockets.
//!
//! The kubelet's plugin watcher and DRA client dial `unix://<path>` without setting an
//! authority, so grpc-go sends the socket path as HTTP/2 `:authority`. The `h2` server
//! behind tonic parses it as a URI authority, fails, and resets the stream (PROTOCOL_ERROR).
//! We normalise below h2 instead of patching it:
//!
//! - [`rewrite`]: pure push parser over the client→server frames; decodes each header block
//!   (HPACK, via `fluke-hpack`) and re-encodes it with `:authority` fixed;
//! - [`authority`]: the `AsyncRead + AsyncWrite` adapter and [`serve_unix_incoming`];
//! - [`client`]: a channel that forces a given `:authority` (test kubelets, emulators).

pub mod authority;
pub mod client;
pub mod rewrite;

pub use authority::{serve_unix_incoming, AuthorityFixingStream};
pub use client::connect_unix_with_authority;
