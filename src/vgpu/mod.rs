//! Fractional GPUs asked for HAMi's way (`nvidia.com/gpu` with `nvidia.com/gpumem`,
//! `nvidia.com/gpumem-percentage`, `nvidia.com/gpucores`), decided without a node lock.
//!
//! Pure: std, plain types (serde only for the records) and k8s-openapi's Pod; no kube,
//! no I/O.
//! - [`request`]: a Pod → per-container vGPU requests, selectors and policies, or a
//!   typed error naming the container and the field (the webhook denies with it);
//! - [`books`]: per-node, per-GPU books; `fit` (on the GPUs the placement engine
//!   prefers), versioned `reserve` (optimistic concurrency instead of HAMi's node lock),
//!   `release`, `rebuild`;
//! - [`filter`](mod@filter): one pod over many nodes, with one reason per node and a summary;
//! - [`charge`]: what a container's vGPU request costs a queue (shares × count);
//! - [`share`]: the books and a pod's request in the placement engine's terms (GPU
//!   milli), so the extender places vGPU pods by the engine `tessera simulate` measures;
//! - [`dra_claim`]: the same request as DRA ResourceClaimTemplates (the webhook's DRA
//!   mode, for clusters with consumable capacity);
//! - [`record`]: the annotations the node agent and the extender exchange (the node's
//!   GPUs and heartbeat, the pod's assignment), shared by both;
//! - [`slots`]: which container holds a split-mode allocation and what it gets (the node
//!   side's late binding of slots to the pod's assignment);
//! - [`guard`]: the host's view of the limits: which pods' processes use more of a GPU
//!   than their slices allow, by the driver's per-process accounting.
//!
//! The semantics and where they differ from HAMi: docs/hami.md.

pub mod books;
pub mod charge;
pub mod dra_claim;
pub mod filter;
pub mod guard;
pub mod record;
pub mod request;
pub mod share;
pub mod slots;

pub use books::{Assignment, BooksError, GpuRecord, NodeBooks, Shortfall};
pub use filter::{filter, FilterOutcome, NodeFit};
pub use request::{pod_request, PodRequest, RequestConfig, RequestError};
